package agentless

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/postern-dev/postern/markers"
)

// Kind is an answer's first word.
type Kind string

const (
	// Started: the marker (or, without one, the shell) is in place; the command starts now.
	Started Kind = "started"
	// Duplicate: the id has a marker; nothing was started. State says what the marker holds.
	Duplicate Kind = "duplicate"
	// Refused: nothing was started and no marker was written; Reason says why.
	Refused Kind = "refused"
	// Status: a marker as status or list prints it.
	Status Kind = "status"
	// Warning: the command ran but its exit could not be recorded.
	Warning Kind = "warning"
)

// State is what a wrapper marker holds.
type State string

const (
	Absent State = "absent"
	// Claimed: the id is taken, the start not recorded (Old: for more than five minutes).
	Claimed     State = "claimed"
	Running     State = "running"
	Interrupted State = "interrupted"
	Exited      State = "exited"
)

// Answer is one parsed answer line.
type Answer struct {
	Kind   Kind
	ID     string
	State  State
	Old    bool
	Exit   *int
	Reason string
	// RetentionDays is how long the wrapper keeps finished markers (status answers).
	RetentionDays int
}

// maxAnswerBytes bounds an answer line.
const maxAnswerBytes = 512

// ErrAnswer: a line that is not a well-formed answer.
var ErrAnswer = errors.New("agentless: malformed answer")

// ParseAnswer parses one answer line (without its newline). Unknown fields are an error:
// the protocol is versioned by Prefix.
func ParseAnswer(line string) (Answer, error) {
	bad := func(why string) (Answer, error) { return Answer{}, fmt.Errorf("%w: %s", ErrAnswer, why) }
	if len(line) > maxAnswerBytes {
		return bad("too long")
	}
	rest, ok := strings.CutPrefix(line, Prefix)
	if !ok {
		return bad("no " + Prefix + " prefix")
	}
	fields := strings.Split(rest, " ")
	a := Answer{Kind: Kind(fields[0])}
	switch a.Kind {
	case Started, Duplicate, Refused, Status, Warning:
	default:
		return bad(fmt.Sprintf("kind %q", fields[0]))
	}
	seen := map[string]bool{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok || seen[k] {
			return bad(fmt.Sprintf("field %q", f))
		}
		seen[k] = true
		switch k {
		case "id":
			if !markers.ValidExecutionID(v) {
				return bad("id")
			}
			a.ID = v
		case "state":
			switch s := State(v); s {
			case Absent, Claimed, Running, Interrupted, Exited:
				a.State = s
			default:
				return bad(fmt.Sprintf("state %q", v))
			}
		case "old":
			switch v {
			case "0", "1":
				a.Old = v == "1"
			default:
				return bad("old")
			}
		case "exit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 255 {
				return bad("exit")
			}
			a.Exit = &n
		case "reason":
			if v == "" {
				return bad("reason")
			}
			a.Reason = v
		case "retention_days":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 100000 {
				return bad("retention_days")
			}
			a.RetentionDays = n
		default:
			return bad(fmt.Sprintf("field %q", k))
		}
	}
	switch {
	case (a.Kind == Duplicate || a.Kind == Status) && a.State == "":
		return bad("no state")
	case a.State == Exited && a.Exit == nil:
		return bad("exited without exit")
	case a.Kind == Refused && a.Reason == "":
		return bad("refused without reason")
	}
	return a, nil
}

// FindAnswer returns the first answer line in out (a status command's stdout).
func FindAnswer(out []byte) (Answer, error) {
	for line := range bytes.SplitSeq(out, []byte("\n")) {
		if bytes.HasPrefix(line, []byte(Prefix)) {
			return ParseAnswer(string(line))
		}
	}
	return Answer{}, fmt.Errorf("%w: no answer line", ErrAnswer)
}

// maxScanBytes is how much stderr a Filter reads for the answer before it gives up: the
// account's shell start-up files may print before it, but not this much.
const maxScanBytes = 64 << 10

// Filter passes a command's stderr on to W, taking out the first answer line (the wrapper's
// or the plain program's, which comes before anything of the command) and handing it to
// OnAnswer. Lines before it — the login shell's start-up files — pass through. Unreadable
// says whether the stream may have held an answer the filter could not take.
type Filter struct {
	W        io.Writer
	OnAnswer func(Answer, error)

	done      bool
	midLine   bool   // the bytes passed on so far end inside a line
	pending   []byte // the start of a line that may be the answer
	passedOut int
	answered  bool   // an answer line parsed
	suspect   bool   // the prefix passed through, an answer line did not parse, or the scan gave up
	tail      []byte // the last len(Prefix)-1 bytes passed through before the answer
}

// Unreadable reports whether the stream had no answer the filter could take and yet may have
// held one: the prefix outside a line start (a start-up file printed without a newline), an
// answer line that did not parse, or more start-up output than the filter scans. Then an
// exit status without an answer does not show that the command never started.
func (f *Filter) Unreadable() bool { return !f.answered && f.suspect }

// scan notes whether the bytes passed through before the answer hold the prefix.
func (f *Filter) scan(p []byte) {
	if f.suspect {
		return
	}
	buf := append(f.tail, p...)
	if bytes.Contains(buf, []byte(Prefix)) {
		f.suspect = true
	}
	f.tail = append(f.tail[:0], buf[max(0, len(buf)-(len(Prefix)-1)):]...)
}

// Write implements io.Writer; it reports len(p) written unless W fails.
func (f *Filter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && !f.done {
		if f.midLine {
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				return n, f.pass(p)
			}
			if err := f.pass(p[:i+1]); err != nil {
				return n, err
			}
			p, f.midLine = p[i+1:], false
			continue
		}
		chunk := p
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			chunk = p[:i+1]
		}
		f.pending = append(f.pending, chunk...)
		p = p[len(chunk):]
		complete := f.pending[len(f.pending)-1] == '\n'
		l := min(len(f.pending), len(Prefix))
		if !bytes.Equal(f.pending[:l], []byte(Prefix[:l])) || len(f.pending) > maxAnswerBytes+1 {
			// Not the answer: pass the line on.
			pending := f.pending
			f.pending = nil
			f.midLine = !complete
			if err := f.pass(pending); err != nil {
				return n, err
			}
			continue
		}
		if complete {
			a, err := ParseAnswer(string(f.pending[:len(f.pending)-1]))
			f.pending, f.done = nil, true
			f.answered, f.suspect = err == nil, f.suspect || err != nil
			if f.OnAnswer != nil {
				f.OnAnswer(a, err)
			}
		}
	}
	if len(p) > 0 {
		if _, err := f.W.Write(p); err != nil {
			return n, err
		}
	}
	return n, nil
}

func (f *Filter) pass(p []byte) error {
	f.scan(p)
	f.passedOut += len(p)
	if f.passedOut > maxScanBytes {
		f.done, f.suspect = true, true
	}
	_, err := f.W.Write(p)
	return err
}

// Close passes on a partial line held back, if the stream ended inside one.
func (f *Filter) Close() error {
	if len(f.pending) == 0 {
		return nil
	}
	p := f.pending
	f.pending = nil
	f.scan(p)
	_, err := f.W.Write(p)
	return err
}
