package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// The benchmarks the report reads, by their names in `go test -bench` output.
const (
	benchExecTrue     = "BenchmarkBastionExecTrue"     // integration: P1
	benchMarkers      = "BenchmarkExecTrue"            // hostagent: P2
	benchConcurrent   = "BenchmarkBastionConcurrent64" // integration: P3
	benchDedup        = "BenchmarkDedupLookup"         // bastion: P4
	benchStream       = "BenchmarkStream1GiB"          // integration: P5
	benchAgentStart   = "BenchmarkHostagentStart"      // integration: P6
	benchHTTPRequest  = "BenchmarkHTTPRequest"         // integration: http_request
	benchStdioRepeat  = "BenchmarkStdioRepeat"         // integration: an identical repeat
	benchInventory    = "BenchmarkBastionInventory"    // integration: RSS at fleet size
	dedupSmallRecords = 1_000
)

// goal is a bound a figure must meet: at most (or at least) limit.
type goal struct {
	atLeast bool
	limit   float64
}

func (g goal) met(v float64) bool {
	if g.atLeast {
		return v >= g.limit
	}
	return v <= g.limit
}

// figure is one measured value and how to print it.
type figure struct {
	bench, unit string
	// scale converts the reported value to the printed one (µs → ms: 0.001); 0 means 1.
	scale float64
	// suffix follows the printed value ("ms", "MB", "×").
	suffix string
	// digits after the decimal point.
	digits int
}

// row is one line of the report. The goal, if any, applies to ratio when ratio is set, else
// to measured.
type row struct {
	id, what string
	measured figure
	// baseline is what measured is compared with, if anything.
	baseline *figure
	ratio    *figure
	goal     *goal
	goalText string
	// absent explains a figure its benchmark ran without reporting (when that is expected).
	absent string
}

// reportRows are the rows of issue 7's table, in its order, with issue 13's floor: the goals
// of the exec path are ratios to it, measured in the same run. records is the larger journal
// size P4 was measured at (10⁶, or 10⁵ in quick mode).
func reportRows(records int) []row {
	ms := func(bench, unit string) figure { return figure{bench: bench, unit: unit, suffix: " ms", digits: 2} }
	times := func(bench, unit string) *figure { return &figure{bench: bench, unit: unit, suffix: "×", digits: 2} }
	atMost := func(v float64) *goal { return &goal{limit: v} }
	atLeast := func(v float64) *goal { return &goal{atLeast: true, limit: v} }
	dedup := func(kind, what string) row {
		small := fmt.Sprintf("%s/records=%d/%s", benchDedup, dedupSmallRecords, kind)
		large := fmt.Sprintf("%s/records=%d/%s", benchDedup, records, kind)
		return row{
			id: "P4", what: fmt.Sprintf("%s, journal of %s vs %s records", what, power10(records), power10(dedupSmallRecords)),
			measured: figure{bench: large, unit: "ns/op", scale: 0.001, suffix: " µs", digits: 1},
			baseline: &figure{bench: small, unit: "ns/op", scale: 0.001, suffix: " µs", digits: 1},
			ratio:    times(large, fmt.Sprintf("×records=%d", dedupSmallRecords)),
			goal:     atMost(2), goalText: "≤ 2×",
		}
	}
	floor := ptr(ms(benchExecTrue, "floor-p50-ms"))
	cpu := func(what, unit string) row {
		return row{id: "P3", what: "CPU per exec: " + what,
			measured: figure{bench: benchConcurrent, unit: unit, suffix: " ms", digits: 2}}
	}
	return []row{
		{id: "FLOOR", what: "fork/exec `sh -c true` from Go + 4 × (write 512 B + fdatasync), p50, same run as P1",
			measured: *floor},
		{id: "P1", what: "ssh_exec `true` via MCP (go-sdk, Streamable HTTP, pooled), p50, vs the floor",
			measured: ms(benchExecTrue, "postern-p50-ms"), baseline: floor,
			ratio: times(benchExecTrue, "p50-postern/floor"), goal: atMost(1.5), goalText: "≤ 1.5× floor"},
		{id: "P1", what: "same, p50, vs OpenSSH multiplexed `ssh host true` (stretch)",
			measured: ms(benchExecTrue, "postern-p50-ms"), baseline: ptr(ms(benchExecTrue, "openssh-p50-ms")),
			ratio: times(benchExecTrue, "p50-postern/openssh"), goal: atMost(0.2), goalText: "≤ 0.2×"},
		{id: "P1", what: "same, p99, vs OpenSSH multiplexed",
			measured: ms(benchExecTrue, "postern-p99-ms"), baseline: ptr(ms(benchExecTrue, "openssh-p99-ms")),
			ratio: times(benchExecTrue, "p99-postern/openssh"), goal: atMost(0.2), goalText: "≤ 0.2×"},
		{id: "P1", what: "ssh_exec `true` through the stdio bridge (`postern mcp`), p50, vs the floor",
			measured: ms(benchExecTrue, "stdio-p50-ms"), baseline: floor,
			ratio: times(benchExecTrue, "p50-stdio/floor")},
		{id: "P1", what: "same, p99, vs the floor's p50",
			measured: ms(benchExecTrue, "stdio-p99-ms"), baseline: floor,
			ratio: times(benchExecTrue, "p99-stdio/floor")},
		{id: "P1", what: "ssh_exec `true`, official TypeScript SDK over stdio (`postern mcp`, as Claude Code connects), p50, vs OpenSSH multiplexed",
			measured: ms(benchExecTrue, "ts-stdio-p50-ms"), baseline: ptr(ms(benchExecTrue, "openssh-p50-ms")),
			ratio: times(benchExecTrue, "p50-ts-stdio/openssh"), goal: atMost(0.5), goalText: "≤ 0.5×"},
		{id: "P1", what: "same, p50, vs the floor",
			measured: ms(benchExecTrue, "ts-stdio-p50-ms"), baseline: floor,
			ratio: times(benchExecTrue, "p50-ts-stdio/floor"), goal: atMost(2.5), goalText: "≤ 2.5× floor"},
		{id: "REPEAT", what: "an identical ssh_exec `true` right after its result was delivered, through `postern mcp`, p50, vs a distinct call",
			measured: ms(benchStdioRepeat, "repeat-p50-ms"), baseline: ptr(ms(benchStdioRepeat, "distinct-p50-ms")),
			ratio: times(benchStdioRepeat, "p50-repeat/distinct"), goal: atMost(2), goalText: "≤ 2×"},
		{id: "HOST", what: "hostagent direct: exec `true`, x/crypto client, markers on, p50, vs the floor",
			measured: ms(benchExecTrue, "hostagent-p50-ms"), baseline: floor,
			ratio: times(benchExecTrue, "p50-hostagent/floor"), goal: atMost(1.3), goalText: "≤ 1.3× floor"},
		{id: "P2", what: "marker overhead on the hostagent: exec `true` p50, markers on − off",
			measured: figure{bench: benchMarkers, unit: "marker-cost-µs", scale: 0.001, suffix: " ms", digits: 2},
			baseline: &figure{bench: benchMarkers, unit: "markers-off-p50-µs", scale: 0.001, suffix: " ms", digits: 2},
			ratio:    times(benchMarkers, "on/off"), goal: atMost(0.5), goalText: "≤ 0.5 ms"},
		{id: "P2", what: "marker overhead above its floor: on − off − two 512 B write + fdatasync on the same file system, same loop",
			measured: figure{bench: benchMarkers, unit: "marker-cost-over-fdatasyncs-µs", scale: 0.001, suffix: " ms", digits: 2},
			baseline: &figure{bench: benchMarkers, unit: "two-fdatasyncs-p50-µs", scale: 0.001, suffix: " ms", digits: 2},
			goal:     atMost(0.2), goalText: "≤ 0.2 ms"},
		{id: "P2", what: "marker fsyncs per exec",
			measured: figure{bench: benchMarkers, unit: "fsyncs/exec", digits: 3},
			goal:     atMost(2), goalText: "≤ 2"},
		{id: "P3", what: "executions/s, 64 concurrent MCP callers, vs 64 callers straight to the hostagent",
			measured: figure{bench: benchConcurrent, unit: "postern-execs/s", suffix: "/s"},
			baseline: &figure{bench: benchConcurrent, unit: "hostagent-execs/s", suffix: "/s"},
			ratio:    times(benchConcurrent, "postern/hostagent"), goal: atLeast(500), goalText: "≥ 500/s"},
		{id: "P3", what: "bastion peak RSS after those calls",
			measured: figure{bench: benchConcurrent, unit: "postern-peak-RSS-MB", suffix: " MB", digits: 1}},
		cpu("bastion", "bastion-cpu-ms/exec"),
		cpu("hostagent", "hostagent-cpu-ms/exec"),
		noSupervisor(cpu("long-lived supervisor", "supervisor-cpu-ms/exec")),
		noSupervisor(cpu("the command (the supervisor's children)", "command-cpu-ms/exec")),
		cpu("per-command shims with their commands (the hostagent's children)", "shims-cpu-ms/exec"),
		cpu("the MCP callers (benchmark process)", "callers-cpu-ms/exec"),
		dedup("replay", "dedup: a retry answered from the journal"),
		dedup("hit", "dedup: fingerprint index hit"),
		dedup("miss", "dedup: fingerprint miss (a new intent)"),
		{id: "P5", what: "1 GiB of stdout via ssh_exec vs OpenSSH multiplexed (> /dev/null)",
			measured: figure{bench: benchStream, unit: "postern-MB/s", suffix: " MB/s"},
			baseline: &figure{bench: benchStream, unit: "openssh-MB/s", suffix: " MB/s"},
			ratio:    times(benchStream, "postern/openssh"), goal: atLeast(0.5), goalText: "≥ 0.5×"},
		{id: "P5", what: "same, vs OpenSSH with Go's cipher (aes128-gcm, own connection)",
			measured: figure{bench: benchStream, unit: "postern-MB/s", suffix: " MB/s"},
			baseline: &figure{bench: benchStream, unit: "openssh-aes128gcm-MB/s", suffix: " MB/s"},
			ratio:    times(benchStream, "postern/openssh-aes128gcm")},
		{id: "P5", what: "bastion peak RSS after streaming",
			measured: figure{bench: benchStream, unit: "postern-peak-RSS-MB", suffix: " MB", digits: 1},
			goal:     atMost(64), goalText: "≤ 64 MB"},
		{id: "P6", what: "hostagent start to listening (fresh data dir)",
			measured: figure{bench: benchAgentStart, unit: "start-ms", suffix: " ms", digits: 1},
			goal:     atMost(100), goalText: "≤ 100 ms"},
		{id: "P6", what: "hostagent idle RSS",
			measured: figure{bench: benchAgentStart, unit: "idle-RSS-MB", suffix: " MB", digits: 1},
			goal:     atMost(25), goalText: "≤ 25 MB"},
		{id: "HTTP", what: "http_request POST via MCP, p50, vs direct net/http (keep-alive)",
			measured: ms(benchHTTPRequest, "postern-p50-ms"), baseline: ptr(ms(benchHTTPRequest, "direct-p50-ms")),
			ratio: times(benchHTTPRequest, "p50-postern/direct")},
		{id: "HTTP", what: "per-call plugin hop (gRPC + broker), p50",
			measured: ms(benchHTTPRequest, "plugin-hop-p50-ms")},
		{id: "FLEET", what: "bastion RSS with 1,000 hosts enrolled (one `hosts import`, listed), vs nothing enrolled",
			measured: figure{bench: benchInventory, unit: "enrolled-RSS-MB", suffix: " MB", digits: 1},
			baseline: &figure{bench: benchInventory, unit: "empty-RSS-MB", suffix: " MB", digits: 1}},
		{id: "FLEET", what: "bastion RSS per enrolled host",
			measured: figure{bench: benchInventory, unit: "KB/enrolled-host", suffix: " KB", digits: 1}},
		{id: "FLEET", what: "bastion RSS per pooled host (real hostagents, one process each; pooled-hosts of them, 100 by default)",
			measured: figure{bench: benchInventory, unit: "KB/pooled-host", suffix: " KB"},
			goal:     atMost(1024), goalText: "< 1 MiB"},
		{id: "FLEET", what: "fleet_exec `true` over the pooled hosts at max_concurrency 20, wall time, vs 5 sequential ssh_exec `true` (same run)",
			measured: figure{bench: benchInventory, unit: "fleet-run-ms", suffix: " ms", digits: 1},
			baseline: &figure{bench: benchInventory, unit: "five-sequential-ms", suffix: " ms", digits: 1},
			ratio:    times(benchInventory, "fleet/five-sequential"), goal: atMost(2), goalText: "≤ 2×"},
		{id: "FLEET", what: "same run, wall time vs the CPU bound: the bastion's and the hostagents' CPU time over the machine's cores (they share them here)",
			measured: figure{bench: benchInventory, unit: "fleet-run-ms", suffix: " ms", digits: 1},
			baseline: &figure{bench: benchInventory, unit: "fleet-cpu-bound-ms", suffix: " ms", digits: 1},
			ratio:    times(benchInventory, "fleet/cpu-bound")},
		{id: "FLEET", what: "same run: bastion CPU per host",
			measured: figure{bench: benchInventory, unit: "fleet-bastion-cpu-ms/host", suffix: " ms", digits: 2}},
		{id: "FLEET", what: "same run: hostagents' CPU per host (hostagent, supervisor, the command)",
			measured: figure{bench: benchInventory, unit: "fleet-hosts-cpu-ms/host", suffix: " ms", digits: 2}},
		{id: "FLEET", what: "same run: bastion RSS after it",
			measured: figure{bench: benchInventory, unit: "fleet-RSS-MB", suffix: " MB", digits: 1}},
		{id: "FLEET", what: "same run: bastion RSS growth over it, per host",
			measured: figure{bench: benchInventory, unit: "fleet-RSS-KB/host", suffix: " KB", digits: 1}},
	}
}

// noSupervisor explains the CPU rows of a hostagent that has no long-lived supervisor.
func noSupervisor(r row) row {
	r.absent = "no long-lived supervisor found (per-command shims): the commands' CPU is in the shims' row"
	return r
}

func ptr[T any](v T) *T { return &v }

// power10 writes 1000 as 10³.
func power10(n int) string {
	exp := 0
	for m := n; m >= 10 && m%10 == 0; m /= 10 {
		exp++
	}
	if n != pow10(exp) {
		return strconv.Itoa(n)
	}
	sup := []rune("⁰¹²³⁴⁵⁶⁷⁸⁹")
	var s strings.Builder
	s.WriteString("10")
	for _, d := range strconv.Itoa(exp) {
		s.WriteRune(sup[d-'0'])
	}
	return s.String()
}

func pow10(exp int) int {
	n := 1
	for range exp {
		n *= 10
	}
	return n
}

// verdict values.
const (
	pass        = "PASS"
	miss        = "MISS"
	notMeasured = "n/a"
)

// line is a row with its figures filled in.
type line struct {
	id, what, goal, measured, baseline, ratio, verdict, note string
}

// evaluate fills in rows from res.
func evaluate(rows []row, res results) []line {
	out := make([]line, 0, len(rows))
	for _, r := range rows {
		l := line{id: r.id, what: r.what, goal: r.goalText}
		var missing []string
		show := func(f *figure) (float64, string) {
			if f == nil {
				return 0, ""
			}
			v, why := res.metric(f.bench, f.unit)
			if why != "" {
				missing = append(missing, why)
				return 0, "—"
			}
			if f.scale != 0 {
				v *= f.scale
			}
			return v, strconv.FormatFloat(v, 'f', f.digits, 64) + f.suffix
		}
		measured, shown := show(&r.measured)
		l.measured = shown
		_, l.baseline = show(r.baseline)
		ratio, shownRatio := show(r.ratio)
		l.ratio = shownRatio
		switch {
		case len(missing) > 0:
			l.note = missing[0]
			if r.absent != "" && strings.HasSuffix(l.note, " reported") {
				l.note = r.absent
			}
			if r.goal != nil {
				l.verdict = notMeasured
			}
		case r.goal == nil:
		case r.goal.met(pick(r.ratio != nil, ratio, measured)):
			l.verdict = pass
		default:
			l.verdict = miss
		}
		out = append(out, l)
	}
	return out
}

func pick(cond bool, a, b float64) float64 {
	if cond {
		return a
	}
	return b
}

// tally counts the goals met and those with a figure.
func tally(lines []line) (met, judged int) {
	for _, l := range lines {
		switch l.verdict {
		case pass:
			met++
			judged++
		case miss:
			judged++
		}
	}
	return met, judged
}

var header = []string{"", "what", "goal", "measured", "baseline", "ratio", "result"}

func (l line) cells() []string {
	return []string{l.id, l.what, l.goal, l.measured, l.baseline, l.ratio, l.verdict}
}

// renderText writes the lines as an aligned table, with the reasons for missing figures
// under it.
func renderText(w io.Writer, lines []line) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, l := range lines {
		fmt.Fprintln(tw, strings.Join(l.cells(), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return renderNotes(w, lines)
}

// renderMarkdown writes the lines as a GitHub table, for docs/benchmarks.md.
func renderMarkdown(w io.Writer, lines []line) error {
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	for _, l := range lines {
		cells := l.cells()
		if l.verdict != "" {
			cells[len(cells)-1] = "**" + l.verdict + "**"
		}
		if _, err := fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | ")); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	return renderNotes(w, lines)
}

// renderNotes says once per cause why figures are missing ("—").
func renderNotes(w io.Writer, lines []line) error {
	seen := map[string]bool{}
	for _, l := range lines {
		if l.note == "" || seen[l.note] {
			continue
		}
		seen[l.note] = true
		if _, err := fmt.Fprintf(w, "\nnot measured: %s", l.note); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}
