package main

import (
	"strings"
	"testing"
)

// sampleOutput is go test -bench output in the shapes the report meets: a plain result line,
// a name whose figures come on a later line (the benchmark printed while it ran), a result
// followed by its logged table, a failed sub-benchmark, a skipped benchmark.
const sampleOutput = `goos: linux
pkg: github.com/postern-dev/postern/integration
BenchmarkStream1GiB-2   	       1	45470337666 ns/op	       140.6 hostagent-MB/s	       176.5 openssh-MB/s	       148.3 postern-MB/s	        54.74 postern-peak-RSS-MB	         0.8405 postern/openssh
--- BENCH: BenchmarkStream1GiB-2
    stream_bench_test.go:132: 1073741824 bytes of stdout
                                                     seconds  MB/s  / openssh
        postern (MCP → bastion → hostagent)          7.24     148   0.84
BenchmarkDedupLookup/records=1000/replay-2         	records=1000: journal filled in 1.2s
   10000	    108000 ns/op
BenchmarkDedupLookup/records=1000000/replay-2      	    5000	    165000 ns/op	         1.528 ×records=1000
--- FAIL: BenchmarkHTTPRequest
    http_bench_test.go:157: in-process HTTPRequest 2: rejected
--- FAIL: BenchmarkBastionExecTrue/sub
    bastion_bench_test.go:12: first exec: rejected
--- FAIL: BenchmarkBastionExecTrue
--- SKIP: BenchmarkHostagentStart
    sshd.go:50: sshd needs root for privilege separation
FAIL
`

func TestParseResults(t *testing.T) {
	res, err := parseResults(strings.NewReader(sampleOutput))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, bench, unit string
		want              float64
		wantWhy           string
	}{
		{name: "result line", bench: "BenchmarkStream1GiB", unit: "postern/openssh", want: 0.8405},
		{name: "figures after a print", bench: "BenchmarkDedupLookup/records=1000/replay", unit: "ns/op", want: 108000},
		{name: "unit with ×", bench: "BenchmarkDedupLookup/records=1000000/replay", unit: "×records=1000", want: 1.528},
		{name: "unit not reported", bench: "BenchmarkStream1GiB", unit: "start-ms", wantWhy: "BenchmarkStream1GiB: no start-ms reported"},
		{name: "failed, with its log", bench: "BenchmarkHTTPRequest", unit: "postern-p50-ms", wantWhy: "BenchmarkHTTPRequest: failed: in-process HTTPRequest 2: rejected"},
		{name: "parent failed first", bench: "BenchmarkBastionExecTrue/sub/x", unit: "ns/op", wantWhy: "BenchmarkBastionExecTrue/sub: failed: first exec: rejected"},
		{name: "failed without a log", bench: "BenchmarkBastionExecTrue", unit: "ns/op", wantWhy: "BenchmarkBastionExecTrue: failed"},
		{name: "skipped", bench: "BenchmarkHostagentStart", unit: "start-ms", wantWhy: "BenchmarkHostagentStart: skipped: sshd needs root for privilege separation"},
		{name: "not run", bench: "BenchmarkExecTrue", unit: "on/off", wantWhy: "BenchmarkExecTrue: not run"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, why := res.metric(tc.bench, tc.unit)
			if got != tc.want || why != tc.wantWhy {
				t.Errorf("metric(%q, %q) = %v, %q; want %v, %q", tc.bench, tc.unit, got, why, tc.want, tc.wantWhy)
			}
		})
	}
}

func TestEvaluateVerdicts(t *testing.T) {
	res := results{metrics: map[string]map[string]float64{
		"BenchmarkA": {"ms": 0.4, "ratio": 2.5, "rate": 600},
	}, notMeasured: map[string]string{}}
	ms := figure{bench: "BenchmarkA", unit: "ms", suffix: " ms", digits: 1}
	tests := []struct {
		name, wantVerdict, wantMeasured string
		r                               row
	}{
		{name: "at most, met", wantVerdict: pass, wantMeasured: "0.4 ms", r: row{measured: ms, goal: &goal{limit: 0.5}}},
		{name: "goal on the ratio, missed", wantVerdict: miss, wantMeasured: "0.4 ms",
			r: row{measured: ms, ratio: &figure{bench: "BenchmarkA", unit: "ratio"}, goal: &goal{limit: 2}}},
		{name: "at least, met", wantVerdict: pass, wantMeasured: "600/s",
			r: row{measured: figure{bench: "BenchmarkA", unit: "rate", suffix: "/s"}, goal: &goal{atLeast: true, limit: 500}}},
		{name: "scaled", wantVerdict: miss, wantMeasured: "400 µs",
			r: row{measured: figure{bench: "BenchmarkA", unit: "ms", scale: 1000, suffix: " µs"}, goal: &goal{limit: 300}}},
		{name: "no goal", wantVerdict: "", wantMeasured: "0.4 ms", r: row{measured: ms}},
		{name: "missing figure", wantVerdict: notMeasured, wantMeasured: "—",
			r: row{measured: figure{bench: "BenchmarkB", unit: "ms"}, goal: &goal{limit: 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := evaluate([]row{tc.r}, res)[0]
			if got.verdict != tc.wantVerdict || got.measured != tc.wantMeasured {
				t.Errorf("verdict %q, measured %q; want %q, %q", got.verdict, got.measured, tc.wantVerdict, tc.wantMeasured)
			}
		})
	}
}

func TestPower10(t *testing.T) {
	tests := []struct {
		n    int
		want string
	}{{1_000, "10³"}, {1_000_000, "10⁶"}, {100_000, "10⁵"}, {1_500, "1500"}, {10_000_000_000, "10¹⁰"}}
	for _, tc := range tests {
		if got := power10(tc.n); got != tc.want {
			t.Errorf("power10(%d) = %q; want %q", tc.n, got, tc.want)
		}
	}
}

// TestFloorRows: the floor row, the goals judged as ratios to it, and the CPU rows, from a
// P1 and P3 run with per-command shims (no supervisor figures).
func TestFloorRows(t *testing.T) {
	const out = `BenchmarkBastionExecTrue-2   	       1	9000000000 ns/op	         4.000 floor-p50-ms	         5.600 postern-p50-ms	         9.1 postern-p99-ms	         6.200 stdio-p50-ms	         12.40 stdio-p99-ms	         5.000 hostagent-p50-ms	        18.00 openssh-p50-ms	        25.00 openssh-p99-ms	         1.400 p50-postern/floor	         1.550 p50-stdio/floor	         3.100 p99-stdio/floor	         1.250 p50-hostagent/floor	         0.3111 p50-postern/openssh	         0.3640 p99-postern/openssh
BenchmarkBastionInventory-2   	       1	4421052294 ns/op	        11.93 KB/enrolled-host	       110.8 KB/pooled-host	        37.55 empty-RSS-MB	        49.21 enrolled-RSS-MB	        64.27 pooled-RSS-MB	       100.0 pooled-hosts	       180.0 fleet-run-ms	        60.00 five-sequential-ms	         3.000 fleet/five-sequential	         1.250 fleet-bastion-cpu-ms/host	         6.000 fleet-hosts-cpu-ms/host	       362.5 fleet-cpu-bound-ms	         0.4966 fleet/cpu-bound	        70.10 fleet-RSS-MB	        12.50 fleet-RSS-KB/host
BenchmarkBastionConcurrent64-2   	       1	9000000000 ns/op	       520.0 postern-execs/s	       700.0 hostagent-execs/s	         0.7429 postern/hostagent	        40.0 postern-peak-RSS-MB	         0.8000 bastion-cpu-ms/exec	         0.9000 hostagent-cpu-ms/exec	         2.500 shims-cpu-ms/exec	         0.3000 callers-cpu-ms/exec
`
	res, err := parseResults(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	byWhat := map[string]line{}
	for _, l := range evaluate(reportRows(1_000_000), res) {
		byWhat[l.id+" "+l.what] = l
	}
	tests := []struct {
		key, measured, baseline, ratio, verdict, note string
	}{
		{key: "FLOOR fork/exec `sh -c true` from Go + 4 × (write 512 B + fdatasync), p50, same run as P1", measured: "4.00 ms"},
		{key: "P1 ssh_exec `true` via MCP (go-sdk, Streamable HTTP, pooled), p50, vs the floor", measured: "5.60 ms", baseline: "4.00 ms", ratio: "1.40×", verdict: pass},
		{key: "P1 same, p50, vs OpenSSH multiplexed `ssh host true` (stretch)", measured: "5.60 ms", baseline: "18.00 ms", ratio: "0.31×", verdict: miss},
		{key: "P1 ssh_exec `true` through the stdio bridge (`postern mcp`), p50, vs the floor", measured: "6.20 ms", baseline: "4.00 ms", ratio: "1.55×"},
		{key: "P1 same, p99, vs the floor's p50", measured: "12.40 ms", ratio: "3.10×", baseline: "4.00 ms"},
		{key: "HOST hostagent direct: exec `true`, x/crypto client, markers on, p50, vs the floor", measured: "5.00 ms", baseline: "4.00 ms", ratio: "1.25×", verdict: pass},
		{key: "P3 CPU per exec: bastion", measured: "0.80 ms"},
		{key: "FLEET bastion RSS with 1,000 hosts enrolled (one `hosts import`, listed), vs nothing enrolled", measured: "49.2 MB", baseline: "37.5 MB"},
		{key: "FLEET bastion RSS per pooled host (real hostagents, one process each; pooled-hosts of them, 100 by default)", measured: "111 KB", verdict: pass},
		{key: "FLEET fleet_exec `true` over the pooled hosts at max_concurrency 20, wall time, vs 5 sequential ssh_exec `true` (same run)", measured: "180.0 ms", baseline: "60.0 ms", ratio: "3.00×", verdict: miss},
		{key: "FLEET same run, wall time vs the CPU bound: the bastion's and the hostagents' CPU time over the machine's cores (they share them here)", measured: "180.0 ms", baseline: "362.5 ms", ratio: "0.50×"},
		{key: "FLEET same run: bastion CPU per host", measured: "1.25 ms"},
		{key: "FLEET same run: hostagents' CPU per host (hostagent, supervisor, the command)", measured: "6.00 ms"},
		{key: "FLEET same run: bastion RSS after it", measured: "70.1 MB"},
		{key: "FLEET same run: bastion RSS growth over it, per host", measured: "12.5 KB"},
		{key: "P3 CPU per exec: per-command shims with their commands (the hostagent's children)", measured: "2.50 ms"},
		{key: "P3 CPU per exec: long-lived supervisor", measured: "—", note: "no long-lived supervisor found (per-command shims): the commands' CPU is in the shims' row"},
		{key: "P3 CPU per exec: the command (the supervisor's children)", measured: "—", note: "no long-lived supervisor found (per-command shims): the commands' CPU is in the shims' row"},
	}
	for _, tc := range tests {
		l, ok := byWhat[tc.key]
		if !ok {
			t.Errorf("no row %q", tc.key)
			continue
		}
		if l.measured != tc.measured || l.baseline != tc.baseline || l.ratio != tc.ratio || l.verdict != tc.verdict || l.note != tc.note {
			t.Errorf("%s: measured %q baseline %q ratio %q verdict %q note %q; want %q %q %q %q %q",
				tc.key, l.measured, l.baseline, l.ratio, l.verdict, l.note, tc.measured, tc.baseline, tc.ratio, tc.verdict, tc.note)
		}
	}
	// A supervisor's figures, when reported, fill its rows.
	res.metrics[benchConcurrent]["supervisor-cpu-ms/exec"] = 0.4
	for _, l := range evaluate(reportRows(1_000_000), res) {
		if l.what == "CPU per exec: long-lived supervisor" && (l.measured != "0.40 ms" || l.note != "") {
			t.Errorf("supervisor row = %+v; want 0.40 ms", l)
		}
	}
}
