package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/markers"
)

// followWaitS is how long one output request waits for new output or the end.
const followWaitS = 20

// followIdle is the pause before asking again about an execution that has no driver to wait
// on (it awaits approval, or the daemon is held).
const followIdle = time.Second

// follow streams an execution's output until it ends, as execution_output does for agents,
// then prints how it ended (on stderr, so stdout is the command's output alone).
func (c *executionsCommand) follow(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("executions follow ID [flags]")
	fromStart := fs.Bool("from-start", true, "print the output from its first byte (false: only what comes from now on)")
	id, err := parseExecutionID(fs, args, c.stderr)
	if err != nil {
		return err
	}
	op, err := loc.operator(c.stderr)
	if err != nil {
		return err
	}
	var outOff, errOff int64
	first := true
	for {
		q := url.Values{"stdout_offset": {strconv.FormatInt(outOff, 10)}, "stderr_offset": {strconv.FormatInt(errOff, 10)},
			"wait_s": {strconv.Itoa(followWaitS)}}
		if first && !*fromStart {
			q.Set("wait_s", "0")
		}
		var x api.Execution
		if err := op.getJSON(ctx, "/v1/executions/"+url.PathEscape(id)+"/output", q, &x); err != nil {
			return err
		}
		if first && !*fromStart {
			outOff, errOff = x.StdoutBytes, x.StderrBytes
			first = false
			continue
		}
		first = false
		outOff = c.emit(c.stdout, "stdout", x.Stdout, x.StdoutOffset, outOff)
		errOff = c.emit(c.stderr, "stderr", x.Stderr, x.StderrOffset, errOff)
		ended := markers.JournalGraph.Terminal(markers.State(x.State))
		if ended && x.Stdout == "" && x.Stderr == "" {
			fmt.Fprintf(c.stderr, "%s %s%s\n", id, x.State, endedHow(&x))
			return nil
		}
		if !ended && x.Stdout == "" && x.Stderr == "" {
			if op.readFromFiles() {
				return fmt.Errorf("%w, so nothing carries %s to its end: its journal shows it %s (postern status says what a start will do; postern markers --host %s show %s asks its host)",
					errBastionDown, id, x.State, x.Host, id)
			}
			// Nothing new and nothing to wait on here (it awaits approval, or the daemon is
			// held): ask again shortly.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(followIdle):
			}
		}
	}
}

// emit writes one window of a stream that starts at offset, when it is past what was
// already written (at), and returns the new position. A window that starts after at means
// the bytes between are no longer kept (the host's spool has them until its retention).
func (c *executionsCommand) emit(w io.Writer, name, data string, offset, at int64) int64 {
	if data == "" {
		return max(at, offset)
	}
	if offset > at {
		fmt.Fprintf(c.stderr, "[%s bytes %d..%d are no longer kept]\n", name, at, offset)
	}
	skip := max(at-offset, 0)
	if skip < int64(len(data)) {
		io.WriteString(w, cli.PrintableBlock(data[skip:]))
	}
	return offset + int64(len(data))
}

// endedHow is how an execution ended, for the line after its output: ", exit 0".
func endedHow(x *api.Execution) string {
	switch {
	case x.ExitCode != nil:
		return ", exit " + strconv.Itoa(*x.ExitCode)
	case x.Signal != "":
		return ", signal " + cli.Printable(x.Signal)
	case x.HTTPStatus != 0:
		return ", HTTP " + strconv.Itoa(x.HTTPStatus)
	case x.Cause != "":
		return ": " + cli.Printable(x.Cause)
	}
	return ""
}
