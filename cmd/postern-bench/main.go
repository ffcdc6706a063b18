// Command postern-bench measures Postern against OpenSSH, net/http and the physical floor of
// an execution (fork/exec plus four small fsyncs, measured in the same run) on this machine
// and prints the report table of issues 7 and 13 (the floor, P1–P6, CPU per exec per process
// and the http_request overhead): goal, measured value, baseline, ratio and PASS/MISS per
// row, with the machine it ran on and how to reproduce it.
//
// It does no measuring of its own: it runs the project's `go test -bench` benchmarks (which
// start a local sshd, `postern serve`, hostagents, the HTTP plugin, and measure their
// baselines in the same run) and reads the metrics they report. That keeps one definition of
// each figure — the benchmark's — whether it is read here or from a plain `go test -bench`
// run. The raw `go test` output is kept in a file so a report can be rendered again from it
// (-from) without re-measuring.
//
// Usage, from the module root:
//
//	go run ./cmd/postern-bench [-quick] [-markdown] [-raw FILE]
//	go run ./cmd/postern-bench -from FILE [-markdown]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// step is one `go test` run of some benchmarks of a package.
type step struct {
	pkg, bench, benchtime string
	env                   []string
}

func (s step) args() []string {
	return []string{"test", "-run", "^$", "-bench", s.bench, "-benchtime", s.benchtime, "-count", "1", "-timeout", "20m", s.pkg}
}

// command is the step as a shell line, for the reproduce section.
func (s step) command() string {
	var quoted []string
	for _, a := range s.args() {
		if strings.ContainsAny(a, "^$|()*") {
			a = "'" + a + "'"
		}
		quoted = append(quoted, a)
	}
	return strings.TrimSpace(strings.Join(s.env, " ") + " go " + strings.Join(quoted, " "))
}

// steps are the runs behind the report. Benchmarks of one package and benchtime share a run
// (one build, one TestMain); a benchmark that fails does not stop the others of its run.
func steps(quick bool) []step {
	dedup := step{pkg: "./bastion/", bench: "^" + benchDedup + "$", benchtime: "1s"}
	if quick {
		// BenchmarkDedupLookup's own switch: stop at 10⁵ records instead of 10⁶.
		dedup.env = []string{"POSTERN_BENCH_SMALL=1"}
	}
	return []step{
		// P2: exec `true` with markers on and off, interleaved, 300 each.
		{pkg: "./hostagent/", bench: "^" + benchMarkers + "$", benchtime: "300x"},
		// P6: five starts of the real agent binary.
		{pkg: "./integration/", bench: "^" + benchAgentStart + "$", benchtime: "5x"},
		// P1, P3, P5, http_request, the identical repeat, the fleet's RSS: each takes a fixed
		// number of samples, whatever b.N.
		{pkg: "./integration/", bench: "^(" + strings.Join([]string{benchExecTrue, benchStdioRepeat, benchConcurrent, benchStream, benchHTTPRequest, benchInventory}, "|") + ")$", benchtime: "1x"},
		// P4: the fill to 10⁶ records takes about a minute.
		dedup,
	}
}

func main() {
	quick := flag.Bool("quick", false, "measure P4 at 10⁵ journal records instead of 10⁶ (saves about a minute; the report says so)")
	markdown := flag.Bool("markdown", false, "print the table as Markdown (for docs/benchmarks.md)")
	rawPath := flag.String("raw", "", "write the go test output to this file (default: a new file in the temp dir)")
	from := flag.String("from", "", "render the report from a file of earlier go test output instead of running the benchmarks")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "postern-bench: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *quick, *markdown, *rawPath, *from); err != nil {
		fmt.Fprintln(os.Stderr, "postern-bench:", err)
		os.Exit(1)
	}
}

// quickDedup finds P4 measured at 10⁵ records (a -quick run) in go test output.
var quickDedup = regexp.MustCompile(benchDedup + `/records=100000(?:\D|$)`)

// errBenchmarksFailed means a go test run failed; the report still shows what was measured.
var errBenchmarksFailed = errors.New("some benchmarks failed (see the rows marked n/a)")

func run(ctx context.Context, quick, markdown bool, rawPath, from string) error {
	var raw []byte
	var runErr error
	started, measuredAt := time.Now(), time.Now()
	plan := steps(quick)
	if from != "" {
		data, err := readBounded(from)
		if err != nil {
			return err
		}
		raw = data
		if st, err := os.Stat(from); err == nil {
			measuredAt = st.ModTime()
		}
		// A saved run says itself whether it stopped at 10⁵ records.
		quick = quickDedup.Match(raw)
		plan = steps(quick)
	} else {
		root, err := moduleRoot(ctx)
		if err != nil {
			return err
		}
		if raw, runErr = runSteps(ctx, root, plan); ctx.Err() != nil {
			return ctx.Err()
		}
		if rawPath == "" {
			f, err := os.CreateTemp("", "postern-bench-*.txt")
			if err != nil {
				return fmt.Errorf("keep go test output: %w", err)
			}
			f.Close()
			rawPath = f.Name()
		}
		if err := os.WriteFile(rawPath, raw, 0o644); err != nil {
			return fmt.Errorf("keep go test output: %w", err)
		}
	}
	res, err := parseResults(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	records := 1_000_000
	if quick {
		records = 100_000
	}
	lines := evaluate(reportRows(records), res)

	out := os.Stdout
	fmt.Fprintf(out, "\nPostern benchmark report, %s\n", measuredAt.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(out, "machine: %s\n", describeMachine(ctx))
	if quick {
		fmt.Fprintf(out, "QUICK MODE: P4 compares 10⁵ with 10³ journal records, not 10⁶ (the goal's size)\n")
	}
	fmt.Fprintln(out)
	if markdown {
		err = renderMarkdown(out, lines)
	} else {
		err = renderText(out, lines)
	}
	if err != nil {
		return err
	}
	met, judged := tally(lines)
	fmt.Fprintf(out, "\ngoals met: %d of %d measured", met, judged)
	if from == "" {
		fmt.Fprintf(out, " (run took %s)", time.Since(started).Round(time.Second))
	}
	fmt.Fprintf(out, "\n\nreproduce (from the module root): go run ./cmd/postern-bench")
	if quick {
		fmt.Fprint(out, " -quick")
	}
	fmt.Fprintln(out, "\nwhich runs:")
	for _, s := range plan {
		fmt.Fprintf(out, "  %s\n", s.command())
	}
	if rawPath != "" && from == "" {
		fmt.Fprintf(out, "raw go test output: %s (render again: go run ./cmd/postern-bench -from %s)\n", rawPath, rawPath)
	}
	return runErr
}

// maxRawBytes bounds a saved go test output read with -from.
const maxRawBytes = 64 << 20

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read benchmark output: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRawBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read benchmark output %s: %w", path, err)
	}
	if len(data) > maxRawBytes {
		return nil, fmt.Errorf("read benchmark output %s: larger than %d bytes", path, maxRawBytes)
	}
	return data, nil
}

// moduleRoot is the directory of the go.mod of the module this is run in.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run inside the postern module (go env GOMOD is empty)")
	}
	return filepath.Dir(gomod), nil
}

// runSteps runs each step in root, copying its output to stderr as it comes (the benchmarks
// take minutes), and returns all of it. It runs every step even if one fails.
func runSteps(ctx context.Context, root string, plan []step) ([]byte, error) {
	var all bytes.Buffer
	var failed []string
	for _, s := range plan {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(os.Stderr, "\n== %s\n", s.command())
		cmd := exec.CommandContext(ctx, "go", s.args()...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), s.env...)
		// On interrupt, let go test stop its test binary, which stops the servers it started.
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.WaitDelay = 30 * time.Second
		out := io.MultiWriter(&all, os.Stderr)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", s.command(), err))
		}
	}
	if len(failed) > 0 {
		return all.Bytes(), fmt.Errorf("%w:\n  %s", errBenchmarksFailed, strings.Join(failed, "\n  "))
	}
	return all.Bytes(), nil
}
