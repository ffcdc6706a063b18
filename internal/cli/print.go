package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// What the commands print comes in part from agents and hosts (commands, notes, names,
// output): every printer here escapes terminal control characters, so none of it can drive
// the operator's terminal.

// Printable escapes control characters and invalid UTF-8 in s.
func Printable(s string) string { return escapeControls(s, false) }

// PrintableBlock is Printable for multi-line text (command output): newlines and tabs stay.
func PrintableBlock(s string) string { return escapeControls(s, true) }

func escapeControls(s string, keepLayout bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || (unicode.IsControl(r) && !(keepLayout && (r == '\n' || r == '\t'))) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case keepLayout && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
		i += size
	}
	return b.String()
}

// Dash is s, or "-" for an empty s (an empty table cell).
func Dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Truncate cuts s to at most n runes, marking the cut with an ellipsis.
func Truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	runes := []rune(s)
	return string(runes[:max(n-1, 0)]) + "…"
}

// FormatTime is how tables show a time: local, to the second.
func FormatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}

// FormatEventTime shows the milliseconds too: a story's steps are often in the same second.
func FormatEventTime(t time.Time) string {
	return t.Local().Format("2006-01-02 15:04:05.000")
}

// WriteJSON writes v as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// PrintTable writes header and rows in aligned columns two spaces apart. The last column is
// cut to what is left of width (0: no limit), so a long command never wraps a row. Cells
// must already be Printable.
func PrintTable(w io.Writer, width int, header []string, rows [][]string) error {
	widths := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, cell := range row[:len(row)-1] {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	lastWidth := 0 // no limit
	if width > 0 {
		used := 0
		for _, wd := range widths[:len(widths)-1] {
			used += wd + 2
		}
		lastWidth = max(width-used, 20)
	}
	var b strings.Builder
	for _, row := range append([][]string{header}, rows...) {
		b.Reset()
		for i, cell := range row {
			if i == len(row)-1 {
				if lastWidth > 0 {
					cell = Truncate(cell, lastWidth)
				}
				b.WriteString(cell)
				break
			}
			b.WriteString(cell)
			b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell)+2))
		}
		if _, err := io.WriteString(w, strings.TrimRight(b.String(), " ")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

// defaultTableWidth is the width tables fit when the output is not a terminal and
// $COLUMNS is unset.
const defaultTableWidth = 120

// TableWidth is the terminal's width when w is one, else $COLUMNS, else 120.
func TableWidth(w io.Writer) int {
	if f, ok := w.(*os.File); ok {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
			return int(ws.Col)
		}
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return defaultTableWidth
}

// Outcome is the short outcome of a table row (the EXIT column): the exit code, signal or
// HTTP status.
func Outcome(r *markers.Record) string { return shortOutcome(r.ExitCode, r.Signal, r.HTTPStatus) }

// MarkerOutcome is Outcome of a host marker.
func MarkerOutcome(m *hostproto.Marker) string { return shortOutcome(m.ExitCode, m.Signal, 0) }

func shortOutcome(exitCode *int, signal string, httpStatus int) string {
	switch {
	case exitCode != nil:
		return strconv.Itoa(*exitCode)
	case signal != "":
		return "sig " + Printable(signal)
	case httpStatus != 0:
		return "HTTP " + strconv.Itoa(httpStatus)
	}
	return "-"
}

// OutcomeText is the outcome in words, for show: "exit 0", "signal KILL, is an error".
func OutcomeText(r *markers.Record) string {
	return outcomeText(r.ExitCode, r.Signal, r.HTTPStatus, r.IsError)
}

func outcomeText(exitCode *int, signal string, httpStatus int, isError bool) string {
	var parts []string
	switch {
	case exitCode != nil:
		parts = append(parts, "exit "+strconv.Itoa(*exitCode))
	case signal != "":
		parts = append(parts, "signal "+signal)
	case httpStatus != 0:
		parts = append(parts, "HTTP "+strconv.Itoa(httpStatus))
	default:
		parts = append(parts, "no exit status observed")
	}
	if isError {
		parts = append(parts, "is an error")
	}
	return strings.Join(parts, ", ")
}

// CommandText is the command as the agent wrote it: ssh_exec runs its line as `sh -c LINE`.
func CommandText(r *markers.Record) string { return commandText(r.Command) }

// MarkerCommandText is CommandText of a host marker.
func MarkerCommandText(m *hostproto.Marker) string { return commandText(m.Command) }

func commandText(argv []string) string {
	if len(argv) == 3 && argv[0] == "sh" && argv[1] == "-c" {
		return argv[2]
	}
	return strings.Join(argv, " ")
}

// States lists g's states, comma-separated (for flag help and errors).
func States(g markers.Graph) string {
	var names []string
	for _, s := range g.States() {
		names = append(names, string(s))
	}
	return strings.Join(names, ", ")
}

// WriteMarker prints a host marker: what ran, when each state was reached, the outcome and
// how it is known. host names the host ("" on the host itself).
func WriteMarker(w io.Writer, host string, r *hostproto.Marker) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, Printable(v))
		}
	}
	row("marker", r.ID)
	row("host", host)
	row("state", string(r.State))
	row("account", r.Account)
	row("command", MarkerCommandText(r))
	row("cwd", r.Cwd)
	row("operation key", r.OperationKey)
	row("fingerprint", r.Fingerprint)
	if !r.CreatedAt.IsZero() { // a marker script keeps no times
		row("created", r.CreatedAt.Local().Format(time.RFC3339))
	}
	for _, s := range hostproto.MarkerStates() {
		if at, ok := r.StateTimes[s]; ok && s != hostproto.MarkerStarted { // started is "created"
			row(string(s), at.Local().Format(time.RFC3339))
		}
	}
	if !r.State.Live() {
		row("outcome", outcomeText(r.ExitCode, r.Signal, 0, r.IsError))
	}
	row("did not start", r.StartError)
	if r.PID > 0 {
		row("pid", strconv.Itoa(r.PID))
	}
	row("spool", r.SpoolDir)
	if o := r.Output; o.StdoutBytes > 0 || o.StderrBytes > 0 || o.StdoutSHA256 != "" {
		row("stdout", fmt.Sprintf("%d bytes  sha256 %s", o.StdoutBytes, Dash(o.StdoutSHA256)))
		row("stderr", fmt.Sprintf("%d bytes  sha256 %s", o.StderrBytes, Dash(o.StderrSHA256)))
		if o.Truncated {
			row("output", "truncated at the output cap")
		}
	}
	if r.Validated {
		row("validated", "yes")
	}
	for i, cp := range r.Checkpoints {
		k := ""
		if i == 0 {
			k = "checkpoints"
		}
		fmt.Fprintf(tw, "%s\t%s  %s\n", k, cp.At.Local().Format(time.RFC3339), Printable(cp.Note))
	}
	for i, e := range r.Evidence {
		k := ""
		if i == 0 {
			k = "evidence"
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, Printable(strings.TrimSpace(e)))
	}
	return tw.Flush()
}
