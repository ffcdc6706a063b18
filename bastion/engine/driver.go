package engine

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// liveTailBytes is how much of each stream a driver keeps in memory for attaching callers.
const liveTailBytes = 1 << 20

// connectTimeout bounds connecting to a host before the dispatch boundary.
const connectTimeout = 15 * time.Second

// maxReconcileAttempts bounds how often one driver re-asks a host after losing it; past
// that the execution stays unknown until the reconcile loop or a retry asks again.
const maxReconcileAttempts = 3

// driver carries one execution across the dispatch boundary and watches it to its outcome.
// At most one driver exists per execution (Bastion.drivers); every state it reaches is
// journaled before it acts on it.
type driver struct {
	*core
	// all are the drivers this one is one of (the concurrency slots, the stop requests).
	all *drivers

	id string

	stdout, stderr *tail

	mu      sync.Mutex // guards rec and changed
	rec     *markers.Record
	changed chan struct{} // closed and replaced when rec or the output changes
	// started is the host's latest start confirmation (its marker), journaled as running
	// after runningDelay or together with the outcome.
	started *hostproto.Marker

	asked chan struct{} // closed once the host was asked (or dispatched to) once
	done  chan struct{} // closed when the driver ends

	queued bool // waiting for a concurrency slot (awaitSlot); guarded by drivers.mu
	// dispatched: the record was journaled dispatched by accept, connection up, and this
	// driver is its first: it execs at once, with nothing to reconcile.
	dispatched bool
	// handedOver: another replica handed the execution over as it stopped (replicas.go).
	handedOver atomic.Bool
}

func (d *driver) record() *markers.Record {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rec
}

func (d *driver) set(rec *markers.Record) {
	d.mu.Lock()
	d.rec = rec
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
}

func (d *driver) notify() {
	d.mu.Lock()
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
}

func (d *driver) changes() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

// notifyingWriter tells the driver's waiters that output arrived.
type notifyingWriter struct {
	t *tail
	d *driver
}

func (w notifyingWriter) Write(p []byte) (int, error) {
	n, err := w.t.Write(p)
	w.d.notify()
	return n, err
}

// ReadFrom copies r through a pooled buffer: io.Copy (hostproto.Run's, from the host's channel)
// would allocate 32 KiB per stream per execution.
func (w notifyingWriter) ReadFrom(r io.Reader) (int64, error) { return copyPooled(w, r) }

// copyBuffers are the buffers of copyPooled: one SSH packet's worth of data.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyPooled copies r to w through a buffer from copyBuffers.
func copyPooled(w io.Writer, r io.Reader) (int64, error) {
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	// Only w's Write: io.CopyBuffer would call w's ReadFrom, which is this.
	return io.CopyBuffer(struct{ io.Writer }{w}, r, *buf)
}

// mutableWriter passes writes on until it is muted, then drops them.
type mutableWriter struct {
	w     io.Writer
	muted atomic.Bool
}

func (m *mutableWriter) mute() { m.muted.Store(true) }

func (m *mutableWriter) Write(p []byte) (int, error) {
	if m.muted.Load() {
		return len(p), nil
	}
	return m.w.Write(p)
}

// ReadFrom copies r through a pooled buffer (see notifyingWriter.ReadFrom).
func (m *mutableWriter) ReadFrom(r io.Reader) (int64, error) { return copyPooled(m, r) }

// setStarted notes the host's confirmation that the command started; markRunning or the
// outcome's write journals it.
func (d *driver) setStarted(m *hostproto.Marker) {
	d.mu.Lock()
	d.started = m
	d.mu.Unlock()
}

// unjournaledStart returns the host's start confirmation if the journal does not show it yet.
func (d *driver) unjournaledStart() *hostproto.Marker {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started == nil || (d.rec.State != markers.Dispatched && d.rec.State != markers.Unknown) {
		return nil
	}
	return d.started
}

// markRunning journals that the host started the command (its marker exists and is live),
// without an fsync (records.running says why that is safe).
func (d *driver) markRunning() {
	m := d.unjournaledStart()
	if m == nil {
		return
	}
	next, err := d.records.running(d.ctx, d.record(), m)
	if err != nil {
		d.journalFailed(d.log, "running", err)
		return
	}
	d.set(next)
}

// storedResult is what the journal keeps of an execution's output: the last bytes of each
// stream and where they start.
type storedResult struct {
	Stdout       []byte `json:"stdout"`
	StdoutOffset int64  `json:"stdout_offset"`
	Stderr       []byte `json:"stderr"`
	StderrOffset int64  `json:"stderr_offset"`
}

// copyOutcome copies the outcome of the host's marker m into the journal record r: the host
// protocol's fields, converted one by one into the journal's.
func copyOutcome(r *markers.Record, m *hostproto.Marker) {
	if m.ExitCode != nil {
		code := *m.ExitCode
		r.ExitCode = &code
	}
	r.Signal = m.Signal
	r.IsError = m.State != hostproto.MarkerExited || m.Signal != "" || (m.ExitCode != nil && *m.ExitCode != 0)
	r.Output = markers.Output{
		StdoutBytes: m.Output.StdoutBytes, StderrBytes: m.Output.StderrBytes,
		StdoutSHA256: m.Output.StdoutSHA256, StderrSHA256: m.Output.StderrSHA256,
		Truncated: m.Output.Truncated,
	}
	r.Checkpoints = nil
	for _, cp := range m.Checkpoints {
		r.Checkpoints = append(r.Checkpoints, markers.Checkpoint{At: cp.At, Note: cp.Note})
	}
	r.Validated = m.Validated
}

// conclude journals an SSH execution's verdict: its state (along verdict.JournalPath), evidence,
// review flag, the host's outcome, and — for a terminal state — the captured output tail in
// the same write. It returns false if the journal did not take it.
func (d *driver) conclude(v verdict.Verdict) bool {
	var result []byte
	// A refusal for an operation key keeps no output: the host's stderr names the holder,
	// which may be another actor's execution.
	if markers.JournalGraph.Terminal(v.To) && v.TakenBy == "" {
		out, outFrom := d.stdout.last(d.cfg.OutputTailBytes)
		errb, errFrom := d.stderr.last(d.cfg.OutputTailBytes)
		var err error
		result, err = json.Marshal(storedResult{Stdout: out, StdoutOffset: outFrom, Stderr: errb, StderrOffset: errFrom})
		if err != nil {
			d.log.Error("encode result", "execution_id", d.id, "err", err)
			return false
		}
	}
	return d.advance(v.To, v.Note, v.Review, result, func(r *markers.Record) {
		if v.Outcome != nil {
			copyOutcome(r, v.Outcome)
		}
		if v.StartError != "" {
			r.StartError = v.StartError
		}
		if v.TakenBy != "" {
			r.OperationTakenBy = v.TakenBy
		}
		if result != nil && r.Output.StdoutBytes == 0 && r.Output.StdoutSHA256 == "" {
			r.Output = markers.Output{StdoutBytes: d.stdout.size(), StderrBytes: d.stderr.size()}
		}
	})
}

// advance journals the driver's execution moving to `to` along verdict.JournalPath — or, already
// there, a note — with note as evidence, review as its ReviewRequired, and the stored result
// (if any) and mutate in the same write. A start the host confirmed but the journal does not
// show yet is written as running first. It returns false if the journal did not take it.
func (d *driver) advance(to markers.State, note string, review bool, result []byte, mutate func(*markers.Record)) bool {
	rec := d.record()
	started := d.unjournaledStart()
	path := verdict.JournalPath(rec.State, to, started != nil)
	review = review && to == markers.Unknown
	if path == nil && rec.ReviewRequired == review && len(rec.Evidence) > 0 && rec.Evidence[len(rec.Evidence)-1] == note {
		return true // nothing new to record
	}
	apply := func(r *markers.Record) error {
		if started != nil && r.PID == 0 {
			r.PID, r.PIDStart = started.PID, started.PIDStart
		}
		if mutate != nil {
			mutate(r)
		}
		if to == markers.Failed {
			r.IsError = true
		}
		if result != nil && path != nil {
			r.ResultRef = "journal:" + rec.ID
		}
		r.Evidence = appendBounded(r.Evidence, note)
		r.ReviewRequired = review
		return nil
	}
	next, err := d.records.settled(d.ctx, rec, path, note, result, apply)
	if err != nil {
		d.journalFailed(d.log, string(to), err)
		return false
	}
	d.set(next)
	if path != nil && (to == markers.Unknown || markers.JournalGraph.Terminal(to)) {
		d.metrics.finished.WithLabelValues(string(to)).Inc()
	}
	if markers.JournalGraph.Terminal(to) {
		d.all.forgetStop(rec.ID)
	}
	return true
}

// toUnknown journals that the outcome cannot be proven yet (review: and only an operator can
// settle it). It returns true if the journal took it.
func (d *driver) toUnknown(note string, review bool) bool {
	return d.advance(markers.Unknown, note, review, nil, nil)
}

// journalFailed stops the driver: with the journal unable to record the next step, nothing
// proceeds (fail closed). The record stays at its last durable state.
func (d *driver) journalFailed(log *slog.Logger, step string, err error) {
	if d.ctx.Err() != nil {
		return
	}
	if errors.Is(err, markers.ErrConflict) || errors.Is(err, markers.ErrNotOwner) {
		// Someone else (a cancel, an operator, another replica) moved the record: follow it.
		if cur, gerr := d.journal.Get(d.id); gerr == nil {
			d.set(cur)
		}
		return
	}
	d.metrics.journalErrors.Inc()
	log.Error("journal write failed; execution stopped where it is", "execution_id", d.id, "step", step, "err", err)
}

const maxEvidence = 20

func addEvidence(note string) func(*markers.Record) error {
	return func(r *markers.Record) error {
		r.Evidence = appendBounded(r.Evidence, note)
		return nil
	}
}

func appendBounded(ev []string, note string) []string {
	ev = append(ev, note)
	if len(ev) > maxEvidence {
		ev = ev[len(ev)-maxEvidence:]
	}
	return ev
}

func lastLine(t *tail) string {
	b, _ := t.last(512)
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			return string(b[i+1:])
		}
	}
	return string(b)
}

// finishDecision completes the journaling of a decision a crash interrupted: an execution
// accepted with a decision other than authorized never dispatches. It reports whether the
// driver must stop here.
func (d *driver) finishDecision() bool {
	rec := d.record()
	if rec.State != markers.Accepted || rec.Decision == "" || rec.Decision == string(policy.Authorized) {
		return false
	}
	next, err := d.records.policyDecision(d.ctx, rec, policy.Decision{Outcome: policy.Outcome(rec.Decision), Rule: "as decided when it was accepted"})
	if err != nil {
		d.journalFailed(d.log, "decision", err)
		return true
	}
	d.set(next)
	return true
}
