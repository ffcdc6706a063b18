package bastion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/postern-dev/postern/hostagent/client"
	"github.com/postern-dev/postern/markers"
)

// liveTailBytes is how much of each stream a driver keeps in memory for attaching callers.
const liveTailBytes = 1 << 20

// maxReconcileAttempts bounds how often one driver re-asks a host after losing it; past
// that the execution stays unknown until the reconcile loop or a retry asks again.
const maxReconcileAttempts = 3

// driver carries one execution across the dispatch boundary and watches it to its outcome.
// At most one driver exists per execution (Bastion.drivers); every state it reaches is
// journaled before it acts on it.
type driver struct {
	id string

	stdout, stderr *tail

	mu      sync.Mutex // guards rec and changed
	rec     *markers.Record
	changed chan struct{} // closed and replaced when rec or the output changes
	// started is the host's latest start confirmation (its marker), journaled as running
	// after runningDelay or together with the outcome.
	started *markers.Record

	asked chan struct{} // closed once the host was asked (or dispatched to) once
	done  chan struct{} // closed when the driver ends
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

// startDriver returns the driver of rec's execution, starting one if there is none. It
// returns nil once the bastion is closing.
func (b *Bastion) startDriver(rec *markers.Record) *driver {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	if d := b.drivers[rec.ID]; d != nil {
		return d
	}
	d := &driver{
		id: rec.ID, rec: rec, changed: make(chan struct{}),
		stdout: newTail(liveTailBytes), stderr: newTail(liveTailBytes),
		asked: make(chan struct{}), done: make(chan struct{}),
	}
	b.drivers[rec.ID] = d
	b.wg.Go(func() {
		defer func() {
			b.mu.Lock()
			delete(b.drivers, d.id)
			b.mu.Unlock()
			close(d.done)
		}()
		var once sync.Once
		asked := func() { once.Do(func() { close(d.asked) }) }
		defer asked()
		if rec.Channel == "http" {
			b.driveHTTP(d, asked)
			return
		}
		b.drive(d, asked)
	})
	return d
}

func (b *Bastion) liveDriver(id string) *driver {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.drivers[id]
}

// drive moves the execution to an outcome: dispatch a new one; for one already in flight,
// ask its host first and dispatch again only if the host has no marker for it.
func (b *Bastion) drive(d *driver, asked func()) {
	if b.finishDecision(d) {
		return
	}
	rec := d.record()
	log := b.log.With("execution_id", rec.ID, "host", rec.Host)
	host, err := b.inv.Host(rec.Host)
	if err != nil {
		b.settleUnknown(d, log, "host "+rec.Host+" is no longer in the inventory: "+err.Error())
		return
	}
	switch rec.State {
	case markers.Accepted, markers.Authorized:
		// Connect before the dispatch boundary: a host that cannot be reached (or presents
		// another key) was sent nothing, so the execution provably failed.
		ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
		_, err := b.pool.Conn(ctx, host)
		cancel()
		if err != nil {
			if b.ctx.Err() == nil {
				b.finish(d, markers.Failed, fmt.Sprintf("could not connect to %s, nothing was sent: %v", host.Name, err), nil)
			}
			return
		}
		path := []markers.State{markers.Dispatched}
		if rec.State == markers.Accepted {
			path = []markers.State{markers.Authorized, markers.Dispatched}
		}
		next, err := b.journal.Advance(b.ctx, rec.ID, rec.State, path, "dispatching to "+host.Name, nil)
		if err != nil {
			b.journalFailed(d, log, "dispatch", err)
			return
		}
		d.set(next)
		b.metrics.dispatched.Inc()
	default:
		if !b.reconcile(d, log, host) {
			return
		}
	}
	asked()
	for attempt := 1; ; attempt++ {
		res, err := b.execOnce(d, host)
		if b.ctx.Err() != nil {
			return // shutting down: the host goes on; the next start reconciles
		}
		if !b.settle(d, log, res, err) {
			return
		}
		if attempt >= maxReconcileAttempts {
			log.Warn("outcome still unknown after reconciling", "attempts", attempt)
			return
		}
		if !sleepCtx(b.ctx, time.Duration(attempt)*250*time.Millisecond) || !b.reconcile(d, log, host) {
			return
		}
	}
}

// reconcile asks the host for the execution's marker and prepares the journal for the
// next exec: re-dispatch (no marker: it never started) or attach (a marker exists). It
// returns false when the host cannot be asked; the execution is then unknown.
func (b *Bastion) reconcile(d *driver, log *slog.Logger, host Host) bool {
	rec := d.record()
	present, marker, err := b.askHost(host, rec.ID)
	if err != nil {
		b.metrics.reconciled.WithLabelValues("unreachable").Inc()
		b.settleUnknown(d, b.log, fmt.Sprintf("hostagent on %s could not be asked (%v); the outcome stays unknown until it can be", host.Name, err))
		return false
	}
	var note string
	var path []markers.State
	switch {
	case !present:
		b.metrics.reconciled.WithLabelValues("absent").Inc()
		note = "host has no marker: the command never started; dispatching the same execution id again"
		switch rec.State {
		case markers.Running:
			path = []markers.State{markers.Unknown, markers.Dispatched}
		case markers.Unknown:
			path = []markers.State{markers.Dispatched}
		}
	default:
		b.metrics.reconciled.WithLabelValues(string(marker.State)).Inc()
		note = fmt.Sprintf("host marker is %s: attaching", marker.State)
		if rec.State != markers.Running && (marker.State == markers.Started || marker.State == markers.Running) {
			path = []markers.State{markers.Running}
		}
	}
	log.Info("reconciled with host", "note", note)
	var next *markers.Record
	if path != nil {
		next, err = b.journal.Advance(b.ctx, rec.ID, rec.State, path, note, addEvidence(note))
	} else {
		next, err = b.journal.Update(b.ctx, rec.ID, note, addEvidence(note))
	}
	if err != nil {
		b.journalFailed(d, b.log, "reconcile", err)
		return false
	}
	d.set(next)
	return true
}

// askHost returns the host's marker for id, or present=false when it has none.
func (b *Bastion) askHost(host Host, id string) (present bool, marker *markers.Record, err error) {
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	conn, err := b.pool.Conn(ctx, host)
	if err != nil {
		return false, nil, err
	}
	cc, err := client.DialControl(conn)
	if err != nil {
		b.pool.Invalidate(host.Name, conn)
		return false, nil, err
	}
	defer cc.Close()
	found, _, err := cc.Status(ctx, []string{id})
	if err != nil {
		b.pool.Invalidate(host.Name, conn)
		return false, nil, err
	}
	if len(found) == 0 {
		return false, nil, nil
	}
	return true, found[0], nil
}

// runningDelay is how long a host-confirmed start waits before `running` is journaled on its
// own: a command that ends sooner gets running and its outcome in one write (two events, one
// fsync), as the hostagent does with its markers.
const runningDelay = 20 * time.Millisecond

// execOnce sends the execution to its host under its execution id (a new dispatch, a
// re-dispatch, or an attach: the host decides by its marker) and returns how it ended.
func (b *Bastion) execOnce(d *driver, host Host) (client.Result, error) {
	rec := d.record()
	conn, err := b.pool.Conn(b.ctx, host)
	if err != nil {
		return client.Result{}, err
	}
	d.stdout.restart()
	d.stderr.restart()
	start := time.Now()
	var running runningWriter
	res, err := client.Run(b.ctx, conn, client.Exec{
		ExecutionID:  rec.ID,
		Command:      commandLine(rec),
		OperationKey: rec.OperationKey,
		Timeout:      time.Duration(rec.TimeoutSeconds) * time.Second,
		Fingerprint:  rec.Fingerprint,
		Cwd:          rec.Cwd,
		Env:          rec.Env,
		Stdout:       notifyingWriter{d.stdout, d},
		Stderr:       notifyingWriter{d.stderr, d},
		OnMarker: func(m client.MarkerMessage) {
			if m.Final || m.Marker.ID != rec.ID || (m.Marker.State != markers.Started && m.Marker.State != markers.Running) {
				return // another execution's marker (operation key taken), or a finished one: the outcome follows
			}
			b.metrics.dispatchLatency.Observe(time.Since(start).Seconds())
			d.setStarted(m.Marker)
			running.after(runningDelay, func() { b.markRunning(d) })
		},
	})
	running.stop()
	if err != nil && !errors.Is(err, client.ErrRefused) && !errors.Is(err, client.ErrExitMissing) {
		b.pool.Invalidate(host.Name, conn)
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
func (d *driver) setStarted(m *markers.Record) {
	d.mu.Lock()
	d.started = m
	d.mu.Unlock()
}

// unjournaledStart returns the host's start confirmation if the journal does not show it yet.
func (d *driver) unjournaledStart() *markers.Record {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started == nil || (d.rec.State != markers.Dispatched && d.rec.State != markers.Unknown) {
		return nil
	}
	return d.started
}

// markRunning journals that the host started the command (its marker exists and is live).
func (b *Bastion) markRunning(d *driver) {
	m := d.unjournaledStart()
	if m == nil {
		return
	}
	rec := d.record()
	next, err := b.journal.Transition(b.ctx, rec.ID, rec.State, markers.Running, "host marker "+string(m.State), func(r *markers.Record) error {
		r.PID, r.PIDStart = m.PID, m.PIDStart
		return nil
	})
	if err != nil {
		b.journalFailed(d, b.log, "running", err)
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

// settle journals how an exec ended. It returns true when the outcome is unknown and
// another reconcile may resolve it.
func (b *Bastion) settle(d *driver, log *slog.Logger, res client.Result, runErr error) (again bool) {
	rec := d.record()
	var first, final *markers.Record
	if res.First != nil {
		first = res.First.Marker
	}
	if res.Final != nil {
		final = res.Final.Marker
	}
	switch {
	case runErr != nil && errors.Is(runErr, client.ErrRefused) && first == nil:
		b.finish(d, markers.Failed, fmt.Sprintf("the host refused the request, nothing was started: %v", runErr), nil)
		return false
	case runErr != nil:
		note := fmt.Sprintf("connection lost after dispatch (%v); asking the host", runErr)
		if first == nil {
			note = fmt.Sprintf("connection failed before the host confirmed the start (%v); asking the host", runErr)
		}
		return b.toUnknown(d, note)
	case first != nil && first.ID != rec.ID:
		b.finish(d, markers.Failed, fmt.Sprintf("operation key %s belongs to %s (%s); this execution was not started", rec.OperationKey, first.ID, first.State), nil)
		return false
	case final == nil && first == nil && (res.ExitStatus == 255 || res.ExitStatus == client.ExitOperationTaken):
		// Refused, or the operation key is another identity's (which sends no marker).
		b.finish(d, markers.Failed, "the host refused the command before writing a marker, nothing was started: "+lastLine(d.stderr), nil)
		return false
	case final == nil && first != nil && (first.State == markers.Interrupted || res.ExitStatus == 254):
		b.toUnknown(d, fmt.Sprintf("host marker is %s: the command started and its process vanished without an exit record; it is not run again — "+reviewRequired, first.State))
		return false
	case final == nil:
		code := res.ExitStatus
		b.finish(d, markers.Completed, fmt.Sprintf("exit status %d (the host sent no final marker)", code), func(r *markers.Record) {
			r.ExitCode = &code
			r.Signal = res.ExitSignal
			r.IsError = code != 0 || res.ExitSignal != ""
		})
		return false
	}
	switch final.State {
	case markers.Exited:
		b.finish(d, markers.Completed, outcomeNote(final), func(r *markers.Record) { copyOutcome(r, final) })
	case markers.TimedOut:
		b.finish(d, markers.TimedOut, "the host killed it at its timeout", func(r *markers.Record) { copyOutcome(r, final) })
	case markers.Cancelled:
		b.finish(d, markers.Cancelled, "cancelled on the host", func(r *markers.Record) { copyOutcome(r, final) })
	case markers.NotStarted:
		b.finish(d, markers.Failed, "the host could not start it: "+joinEvidence(final.Evidence), nil)
	default:
		b.toUnknown(d, fmt.Sprintf("host marker is %s: its outcome is unknown; it is not run again — "+reviewRequired, final.State))
	}
	log.Info("execution ended", "state", d.record().State)
	return false
}

func outcomeNote(m *markers.Record) string {
	if m.Signal != "" {
		return "killed by " + m.Signal
	}
	if m.ExitCode != nil {
		return fmt.Sprintf("exit status %d", *m.ExitCode)
	}
	return "exited"
}

func copyOutcome(r, m *markers.Record) {
	if m.ExitCode != nil {
		code := *m.ExitCode
		r.ExitCode = &code
	}
	r.Signal = m.Signal
	r.IsError = m.State != markers.Exited || m.Signal != "" || (m.ExitCode != nil && *m.ExitCode != 0)
	r.Output = m.Output
	r.Checkpoints = append([]markers.Checkpoint(nil), m.Checkpoints...)
	r.Validated = m.Validated
}

// finish journals a terminal outcome of an SSH execution with the captured output tail in
// the same write.
func (b *Bastion) finish(d *driver, to markers.State, note string, mutate func(*markers.Record)) {
	out, outFrom := d.stdout.last(b.cfg.OutputTailBytes)
	errb, errFrom := d.stderr.last(b.cfg.OutputTailBytes)
	result, err := json.Marshal(storedResult{Stdout: out, StdoutOffset: outFrom, Stderr: errb, StderrOffset: errFrom})
	if err != nil {
		b.log.Error("encode result", "execution_id", d.id, "err", err)
		return
	}
	b.record(d, to, note, result, func(r *markers.Record) {
		if mutate != nil {
			mutate(r)
		}
		if r.Output.StdoutBytes == 0 && r.Output.StdoutSHA256 == "" {
			r.Output = markers.Output{StdoutBytes: d.stdout.size(), StderrBytes: d.stderr.size()}
		}
	})
}

// record journals a terminal outcome and its stored result (if any) in one write. A start
// the host confirmed but the journal does not show yet is written as running first.
func (b *Bastion) record(d *driver, to markers.State, note string, result []byte, mutate func(*markers.Record)) {
	rec := d.record()
	path := []markers.State{to}
	started := d.unjournaledStart()
	if started != nil && to != markers.Failed {
		path = []markers.State{markers.Running, to}
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
		if result != nil {
			r.ResultRef = "journal:" + rec.ID
		}
		r.Evidence = appendBounded(r.Evidence, note)
		return nil
	}
	var next *markers.Record
	var err error
	if result != nil {
		next, err = b.journal.AdvanceWithResult(b.ctx, rec.ID, rec.State, path, note, result, apply)
	} else {
		next, err = b.journal.Advance(b.ctx, rec.ID, rec.State, path, note, apply)
	}
	if err != nil {
		b.journalFailed(d, b.log, string(to), err)
		return
	}
	d.set(next)
	b.metrics.finished.WithLabelValues(string(to)).Inc()
}

// toUnknown journals that the outcome cannot be proven yet. It returns true if the caller
// may reconcile again.
func (b *Bastion) toUnknown(d *driver, note string) bool {
	rec := d.record()
	var next *markers.Record
	var err error
	switch {
	case rec.State == markers.Unknown && len(rec.Evidence) > 0 && rec.Evidence[len(rec.Evidence)-1] == note:
		return true // nothing new to record
	case rec.State == markers.Unknown:
		next, err = b.journal.Update(b.ctx, rec.ID, note, addEvidence(note))
	case d.unjournaledStart() != nil:
		// The host had confirmed the start: the journal says so before it says unknown.
		next, err = b.journal.Advance(b.ctx, rec.ID, rec.State, []markers.State{markers.Running, markers.Unknown}, note, addEvidence(note))
	default:
		next, err = b.journal.Transition(b.ctx, rec.ID, rec.State, markers.Unknown, note, addEvidence(note))
	}
	if err != nil {
		b.journalFailed(d, b.log, "unknown", err)
		return false
	}
	d.set(next)
	b.metrics.finished.WithLabelValues(string(markers.Unknown)).Inc()
	return true
}

func (b *Bastion) settleUnknown(d *driver, log *slog.Logger, note string) {
	rec := d.record()
	if rec.State == markers.Accepted || rec.State == markers.Authorized {
		b.finish(d, markers.Failed, note+"; nothing was dispatched", nil)
		return
	}
	log.Warn("execution outcome unknown", "execution_id", rec.ID, "why", note)
	b.toUnknown(d, note)
}

// journalFailed stops the driver: with the journal unable to record the next step, nothing
// proceeds (fail closed). The record stays at its last durable state.
func (b *Bastion) journalFailed(d *driver, log *slog.Logger, step string, err error) {
	if b.ctx.Err() != nil {
		return
	}
	if errors.Is(err, markers.ErrConflict) {
		// Someone else (a cancel, an operator) moved the record: follow it.
		if cur, gerr := b.journal.Get(d.id); gerr == nil {
			d.set(cur)
		}
		return
	}
	b.metrics.journalErrors.Inc()
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

func joinEvidence(ev []string) string {
	if len(ev) == 0 {
		return "no reason recorded"
	}
	return ev[len(ev)-1]
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

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
