package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkStartWait measures one execution of `true` through the long-lived supervisor and
// through a per-command supervisor (the previous release's way) against running the same shell
// command directly, so the supervisor's overhead is known.
func BenchmarkStartWait(b *testing.B) {
	b.Run("supervisor", func(b *testing.B) {
		sup := testSupervisor(b)
		root := b.TempDir()
		ctx := context.Background()
		// A first start launches the supervisor (and its keeper): their CPU is measured
		// from here on, per execution.
		warm, err := sup.Start(ctx, filepath.Join(root, "warm"), testSpec("true"))
		if err != nil {
			b.Fatal(err)
		}
		warm.Wait(ctx)
		pids := supervisorPIDs(b, filepath.Join(root, "warm"))
		cpuBefore := cpuNanos(pids)
		i := 0
		for b.Loop() {
			i++
			h, err := sup.Start(ctx, filepath.Join(root, fmt.Sprint(i)), testSpec("true"))
			if err != nil {
				b.Fatalf("Start = %v", err)
			}
			st, err := h.Wait(ctx)
			if err != nil || st.ExitCode != 0 {
				b.Fatalf("Wait = %+v, %v", st, err)
			}
		}
		for what, ns := range cpuNanos(pids) {
			b.ReportMetric(float64(ns-cpuBefore[what])/1e3/float64(i), what+"-cpu-µs/op")
		}
	})
	b.Run("per-command supervisor", func(b *testing.B) {
		exe := testExe(b)
		root := b.TempDir()
		ctx := context.Background()
		i := 0
		for b.Loop() {
			i++
			h, err := startPerCommand(ctx, exe, filepath.Join(root, fmt.Sprint(i)), testSpec("true"))
			if err != nil {
				b.Fatalf("Start = %v", err)
			}
			st, err := h.Wait(ctx)
			if err != nil || st.ExitCode != 0 {
				b.Fatalf("Wait = %+v, %v", st, err)
			}
		}
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("/bin/sh", "-c", "true").Run(); err != nil {
				b.Fatalf("run: %v", err)
			}
		}
	})
}

// supervisorPIDs names the supervisor of the execution in dir and, if it has one, its
// keeper, from the supervisor record.
func supervisorPIDs(b testing.TB, dir string) map[string]int {
	data, err := os.ReadFile(filepath.Join(dir, SupervisorFile))
	if err != nil {
		b.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		b.Fatal(err)
	}
	pids := map[string]int{}
	for what, key := range map[string]string{"supervisor": "pid", "keeper": "keeper"} {
		if pid, ok := rec[key].(float64); ok {
			pids[what] = int(pid)
		}
	}
	return pids
}

// cpuNanos is the CPU time each process has used so far: the sum over its threads of
// /proc/PID/task/TID/schedstat's first field.
func cpuNanos(pids map[string]int) map[string]int64 {
	out := map[string]int64{}
	for what, pid := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		for _, t := range tasks {
			data, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			if n, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64); err == nil {
				out[what] += n
			}
		}
	}
	return out
}
