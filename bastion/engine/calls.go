package engine

import (
	"context"
	"strings"
	"sync"

	"github.com/postern-dev/postern/bastion/delivery"
	"github.com/postern-dev/postern/bastion/intent"
	"github.com/postern-dev/postern/bastion/transport"
	"github.com/postern-dev/postern/internal/procfs"
	"github.com/postern-dev/postern/markers"
)

// Every call that touches an intent is journaled with the write it makes anyway — a new
// execution's create event carries its call — or, when it joins, replays or is refused
// because of an existing execution, as a joined event of that execution (never on a new
// execution's path, never under the intake lock). The first write that names an agent run
// also records the run (markers.Run): who the agent is, read once, at first contact. A cache
// of the runs already recorded keeps that to one record per run, without a read per call;
// every later call carries the run's identity unjournaled (markers.Call.RunIdentity), so
// that the journal records the run again should retention have removed it.

// Transports as calls and runs name them.
const (
	transportUnix   = "unix"
	transportBridge = "stdio-bridge"
	transportHTTP   = "http"
)

func transportOf(c transport.Caller) string {
	switch {
	case c.Local && c.Bridged:
		return transportBridge
	case c.Local:
		return transportUnix
	}
	return transportHTTP
}

// maxKnownRuns bounds the cache of recorded runs; when it is full it starts over (a miss
// costs one read, never a second record).
const maxKnownRuns = 1 << 16

// knownRuns are the agent runs whose record the journal already holds.
type knownRuns struct {
	mu   sync.Mutex // guards runs
	runs map[string]struct{}
}

func runCacheKey(actor, scope string) string { return actor + "\x00" + scope }

func (k *knownRuns) has(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.runs[key]
	return ok
}

func (k *knownRuns) add(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.runs == nil || len(k.runs) >= maxKnownRuns {
		k.runs = make(map[string]struct{})
	}
	k.runs[key] = struct{}{}
}

// call is the journal's account of call c in scope, answered by match. It carries the
// run's identity if the journal may not have it yet.
func (rs *records) call(ctx context.Context, c transport.Caller, scope string, match intent.Match, replayed bool) *markers.Call {
	call := &markers.Call{
		Transport: transportOf(c),
		RequestID: delivery.RequestID(ctx),
		Run:       scope,
		Subject:   c.Subject,
		Match:     string(match),
		Replayed:  replayed,
	}
	key := runCacheKey(c.Actor, scope)
	known := rs.runs.has(key)
	if !known {
		if _, err := rs.journal.Run(c.Actor, scope); err == nil {
			rs.runs.add(key)
			known = true
		}
	}
	if known {
		// The journal had the run's record; retention may remove it since (a run with no
		// execution left): the write records it again if so, without a read here.
		call.RunIdentity = rs.runOf(c, scope)
		return call
	}
	call.NewRun = rs.runOf(c, scope)
	return call
}

// recorded notes that call was written: its run is recorded.
func (rs *records) recorded(actor string, call *markers.Call) {
	if call != nil && call.NewRun != nil {
		rs.runs.add(runCacheKey(actor, call.Run))
	}
}

// runOf is the identity of c's agent run, as the transport read it from the kernel (local)
// or the request (remote).
func (rs *records) runOf(c transport.Caller, scope string) *markers.Run {
	r := &markers.Run{Actor: c.Actor, Scope: scope, FirstSeen: rs.now().UTC(), Transport: transportOf(c)}
	if c.Local {
		uid := c.UID
		r.PID, r.Exe, r.UID = c.PID, c.Exe, &uid
		if c.Cmdline != "" {
			r.Cmdline = strings.Split(c.Cmdline, "\x00")
		}
		r.StartTime = procfs.StartedAt(c.StartTicks)
		return r
	}
	if runID, ok := strings.CutPrefix(scope, "run:"); ok {
		r.RunID = runID
	}
	r.Token = strings.TrimPrefix(c.Actor, "token:")
	r.Subject = c.Subject
	return r
}
