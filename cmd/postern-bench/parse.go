package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// maxLineBytes bounds one line of `go test` output; benchmark logs (a failing bastion's log
// dump) can be long, result lines are short.
const maxLineBytes = 1 << 20

// results is what a set of `go test -bench` runs printed: each benchmark's metrics by unit
// (ns/op, postern-p50-ms, …), and why a benchmark has none when it failed or skipped.
type results struct {
	metrics map[string]map[string]float64
	// notMeasured is "failed: <first line of its log>" or "skipped: <reason>", by benchmark.
	notMeasured map[string]string
}

var (
	// resultLine is a benchmark's result: name (with its -GOMAXPROCS suffix), iterations,
	// then value-unit pairs. The name may stand alone on its line when the benchmark printed
	// something while it ran; its figures then start the next line.
	resultName  = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?(?:\s+(.*))?$`)
	figuresLine = regexp.MustCompile(`^\s*(\d+)\s+(.+)$`)
	verdictLine = regexp.MustCompile(`^\s*--- (FAIL|SKIP): (Benchmark\S+?)(-\d+)?(?: \(.*\))?$`)
	// logLine is a benchmark's b.Log output under its verdict line: "    file.go:12: message".
	logLine = regexp.MustCompile(`^\s+\S+\.go:\d+: (.*)$`)
)

// maxNoteRunes bounds the reason a row gives for a figure it lacks.
const maxNoteRunes = 160

// parseResults reads the output of one or more `go test -bench` runs.
func parseResults(r io.Reader) (results, error) {
	res := results{metrics: map[string]map[string]float64{}, notMeasured: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	// pending is a benchmark whose name line came without figures.
	pending := ""
	// noteFor is a benchmark whose FAIL/SKIP line was just read: its next line says why.
	noteFor, verdict := "", ""
	for sc.Scan() {
		line := sc.Text()
		if noteFor != "" {
			if m := logLine.FindStringSubmatch(line); m != nil {
				res.notMeasured[noteFor] = verdict + ": " + shorten(m[1])
			}
			noteFor = ""
		}
		if m := verdictLine.FindStringSubmatch(line); m != nil {
			noteFor, verdict = m[2], map[string]string{"FAIL": "failed", "SKIP": "skipped"}[m[1]]
			res.notMeasured[noteFor] = verdict
			continue
		}
		if m := resultName.FindStringSubmatch(line); m != nil {
			if figures, ok := parseFigures(m[3]); ok {
				res.metrics[m[1]] = figures
				pending = ""
			} else {
				pending = m[1]
			}
			continue
		}
		if pending != "" {
			if m := figuresLine.FindStringSubmatch(line); m != nil {
				if figures, ok := parseFigures(line); ok {
					res.metrics[pending] = figures
					pending = ""
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("read benchmark output: %w", err)
	}
	return res, nil
}

// parseFigures parses "<iterations> <value> <unit> <value> <unit> …", the figures of a result
// line; ok is false for anything else (a log line, a name with no figures yet).
func parseFigures(s string) (map[string]float64, bool) {
	f := strings.Fields(s)
	if len(f) < 3 || len(f)%2 == 0 {
		return nil, false
	}
	if _, err := strconv.ParseInt(f[0], 10, 64); err != nil {
		return nil, false
	}
	out := make(map[string]float64, len(f)/2)
	for i := 1; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return nil, false
		}
		out[f[i+1]] = v
	}
	return out, true
}

// metric returns a benchmark's figure in unit, or why there is none, naming the benchmark
// the reason concerns (a sub-benchmark's parent, when that is the one that failed).
func (r results) metric(bench, unit string) (float64, string) {
	if m, ok := r.metrics[bench]; ok {
		if v, ok := m[unit]; ok {
			return v, ""
		}
		return 0, bench + ": no " + unit + " reported"
	}
	for b := bench; ; b = b[:strings.LastIndex(b, "/")] {
		if why, ok := r.notMeasured[b]; ok {
			return 0, b + ": " + why
		}
		if !strings.Contains(b, "/") {
			return 0, bench + ": not run"
		}
	}
}

func shorten(s string) string {
	r := []rune(s)
	if len(r) <= maxNoteRunes {
		return s
	}
	return string(r[:maxNoteRunes]) + "…"
}
