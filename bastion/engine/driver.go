package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/ctxtime"
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
	// e is the engine this driver serves, for what is not shared through core (views, the
	// host helpers) until those have owners of their own.
	e *Engine

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

// drive moves the execution to an outcome: dispatch a new one; for one already in flight,
// ask its host first and dispatch again only if the host has no marker for it.
func (d *driver) drive(asked func()) {
	if d.finishDecision() {
		return
	}
	rec := d.record()
	log := d.log.With("execution_id", rec.ID, "host", rec.Host)
	host, err := d.inv.Host(rec.Host)
	if err != nil {
		note := "host " + rec.Host + " is no longer in the inventory: " + err.Error()
		if rec.State == markers.Accepted || rec.State == markers.Authorized {
			d.conclude(verdict.Verdict{To: markers.Failed, Note: note + "; nothing was dispatched"})
			return
		}
		log.Warn("execution outcome unknown", "why", note)
		d.conclude(verdict.Verdict{To: markers.Unknown, Note: note})
		return
	}
	switch {
	case d.dispatched:
		// accept journaled it dispatched with the connection up: nothing was sent yet.
	case rec.State == markers.Accepted || rec.State == markers.Authorized:
		// Connect before the dispatch boundary: a host that cannot be reached (or presents
		// another key) was sent nothing, so the execution provably failed.
		ctx, cancel := context.WithTimeout(d.ctx, connectTimeout)
		_, err := d.pool.Conn(ctx, host)
		cancel()
		if err != nil {
			if d.ctx.Err() == nil {
				d.conclude(verdict.Verdict{To: markers.Failed, Note: fmt.Sprintf("could not connect to %s, nothing was sent: %v", host.Name, err)})
			}
			return
		}
		path := []markers.State{markers.Dispatched}
		if rec.State == markers.Accepted {
			path = []markers.State{markers.Authorized, markers.Dispatched}
		}
		next, err := d.records.dispatching(d.ctx, rec, path, host.Name)
		if err != nil {
			d.journalFailed(log, "dispatch", err)
			return
		}
		d.set(next)
		d.metrics.dispatched.Inc()
	case host.Level() != fleet.GuaranteeHostagent:
		do := d.reconcileStock(log, host)
		asked()
		if do == verdict.Watch {
			d.watchStock(log, host)
		}
		if do != verdict.Redispatch {
			return
		}
	default:
		if !d.reconcile(log, host) {
			return
		}
	}
	asked()
	if host.Level() != fleet.GuaranteeHostagent {
		d.driveStock(log, host) // agentless.go
		return
	}
	for attempt := 1; ; attempt++ {
		res, err := d.execOnce(host)
		if d.ctx.Err() != nil {
			return // shutting down: the host goes on; the next start reconciles
		}
		if !d.settle(log, host, res, err) {
			return
		}
		if attempt >= maxReconcileAttempts {
			log.Warn("outcome still unknown after reconciling", "attempts", attempt)
			return
		}
		if !ctxtime.Sleep(d.ctx, time.Duration(attempt)*250*time.Millisecond) || !d.reconcile(log, host) {
			return
		}
	}
}

// reconcile asks the host about the execution and carries out verdict.ReconcileOn's decision. It
// returns true when the driver is to exec: re-dispatch (the host has no marker, so it never
// started) or attach (the host has a marker).
func (d *driver) reconcile(log *slog.Logger, host fleet.Host) bool {
	rec := d.record()
	st, err := d.hosts.status(host, rec.ID)
	if err != nil {
		d.unreachable(log, "hostagent on "+host.Name, err)
		return false
	}
	act := verdict.ReconcileOn(rec, d.now(), host.Name, st, d.all.stopRequested(rec.ID))
	answer := "absent"
	if st.Marker != nil {
		answer = string(st.Marker.State)
	}
	d.metrics.reconciled.WithLabelValues(answer).Inc()
	log.Info("reconciled with host", "marker", answer, "action", act.Do, "note", act.Verdict.Note)
	return d.conclude(act.Verdict) && act.Do != verdict.Settle
}

// unreachable journals that who (the host's hostagent or marker script) could not be asked
// about the execution: its outcome stays unknown, and the reconcile loop asks again.
func (d *driver) unreachable(log *slog.Logger, who string, err error) {
	d.metrics.reconciled.WithLabelValues("unreachable").Inc()
	note := fmt.Sprintf("%s could not be asked (%v); the outcome stays unknown until it can be", who, err)
	log.Warn("execution outcome unknown", "why", note)
	d.conclude(verdict.Verdict{To: markers.Unknown, Note: note})
}

// runningDelay is how long a host-confirmed start waits before `running` is journaled on its
// own: a command that ends sooner gets running and its outcome in one write (two events, one
// fsync), as the hostagent does with its markers.
const runningDelay = 20 * time.Millisecond

// execOnce sends the execution to its host under its execution id (a new dispatch, a
// re-dispatch, or an attach: the host decides by its marker) and returns how it ended.
func (d *driver) execOnce(host fleet.Host) (hostproto.Result, error) {
	rec := d.record()
	conn, err := d.pool.Conn(d.ctx, host)
	if err != nil {
		return hostproto.Result{}, err
	}
	d.stdout.restart()
	d.stderr.restart()
	start := time.Now()
	var running runningWriter
	stderr := &mutableWriter{w: notifyingWriter{d.stderr, d}}
	res, err := hostproto.Run(d.ctx, conn, hostproto.Exec{
		ExecutionID:  rec.ID,
		Command:      commandLine(rec),
		OperationKey: rec.OperationKey,
		Timeout:      time.Duration(rec.TimeoutSeconds) * time.Second,
		Fingerprint:  rec.Fingerprint,
		Cwd:          rec.Cwd,
		Env:          rec.Env,
		Stdout:       notifyingWriter{d.stdout, d},
		Stderr:       stderr,
		OnMarker: func(m hostproto.MarkerMessage) {
			if !m.Final && m.Marker.ID != rec.ID {
				// The host refuses it for an operation key another execution holds; its
				// stderr names that execution, which may be another actor's: keep none of it.
				stderr.mute()
			}
			if m.Final || m.Marker.ID != rec.ID || !m.Marker.State.Live() {
				return // another execution's marker (operation key taken), or a finished one: the outcome follows
			}
			d.metrics.dispatchLatency.Observe(time.Since(start).Seconds())
			d.setStarted(m.Marker)
			running.after(runningDelay, func() { d.markRunning() })
			if d.all.stopRequested(rec.ID) {
				// Cancelled while it was on its way: the host had nothing to cancel then.
				d.wg.Go(func() {
					if err := d.hosts.cancel(d.ctx, host, rec.ID); err != nil {
						d.log.Warn("cancel after start", "execution_id", rec.ID, "err", err)
					}
				})
			}
		},
	})
	running.stop()
	if err != nil && !errors.Is(err, hostproto.ErrRefused) && !errors.Is(err, hostproto.ErrExitMissing) {
		d.pool.Invalidate(host.Name, conn)
	}
	return res, err
}

// runningWriter runs the delayed `running` write; stop cancels it or waits for it, so it
// never outlives the exec that scheduled it.
type runningWriter struct {
	mu    sync.Mutex
	timer *time.Timer
	done  chan struct{}
}

func (r *runningWriter) after(delay time.Duration, write func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		return
	}
	done := make(chan struct{})
	r.done = done
	r.timer = time.AfterFunc(delay, func() {
		defer close(done)
		write()
	})
}

func (r *runningWriter) stop() {
	r.mu.Lock()
	timer, done := r.timer, r.done
	r.mu.Unlock()
	if timer == nil {
		return
	}
	if timer.Stop() {
		close(done)
		return
	}
	<-done
}

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

// settle journals how an exec ended (verdict.ExecVerdict). It returns true when the outcome is
// unknown because the answer was lost, so that asking the host again may settle it.
func (d *driver) settle(log *slog.Logger, host fleet.Host, res hostproto.Result, runErr error) (again bool) {
	a := verdict.ExecAnswer{Err: runErr, ExitStatus: res.ExitStatus, ExitSignal: res.ExitSignal, Stderr: lastLine(d.stderr)}
	if res.First != nil {
		a.First = res.First.Marker
	}
	if res.Final != nil {
		a.Final = res.Final.Marker
	}
	v := verdict.ExecVerdict(d.id, host.Name, a)
	if !d.conclude(v) {
		return false
	}
	if v.To != markers.Unknown {
		log.Info("execution ended", "state", d.record().State)
	}
	return v.Again
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
