package main

import (
	"os"
	"runtime/debug"
)

// Garbage collection of the bastion daemon (serve, up). Most of what a call allocates is
// garbage once the response is written (JSON of requests, results, records and events), and
// at the default GOGC of 100 the collector took about a fifth of the bastion's CPU per call.
// A larger GOGC collects less often; the soft memory limit makes it collect sooner whenever
// the heap would grow past daemonMemoryLimit, so peak memory stays bounded by the limit, not
// by GOGC. GOGC and GOMEMLIMIT in the environment win.
const (
	daemonGCPercent   = 400
	daemonMemoryLimit = 48 << 20
)

func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(daemonGCPercent)
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(daemonMemoryLimit)
	}
}
