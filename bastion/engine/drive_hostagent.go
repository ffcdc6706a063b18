package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/ctxtime"
	"github.com/postern-dev/postern/markers"
)

// drive moves the execution to an outcome: dispatch a new one; for one already in flight,
// ask its host first and dispatch again only if the host has no marker for it.
func (d *driver) drive(asked func()) {
	if d.finishDecision() {
		return
	}
	rec := d.record()
	log := d.log.With("execution_id", rec.ID, "host", rec.Host)
	host, err := hostOf(d.inv, rec)
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
				r := hostProblem(host.Name, err)
				r.Next = "Nothing was sent"
				d.conclude(verdict.Verdict{To: markers.Failed, Note: r.Text()})
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
		do := d.reconcileAgentless(log, host)
		asked()
		if do == verdict.Watch {
			d.watchAgentless(log, host)
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
		d.driveAgentless(log, host) // agentless.go
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
		d.unreachable(log, host.Name, "its hostagent", err)
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
func (d *driver) unreachable(log *slog.Logger, host, who string, err error) {
	d.metrics.reconciled.WithLabelValues("unreachable").Inc()
	r := hostProblem(host, err)
	r.Repair, r.Next = "", fmt.Sprintf("So %s could not be asked about this execution; its outcome stays unknown until it can be", who)
	note := r.Text()
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
		Protocol:     d.pool.ProtocolOf(host, conn),
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
		d.pool.Invalidate(host, conn)
	}
	return res, err
}

// runningWriter runs the delayed `running` write; stop cancels it or waits for it, so it
// never outlives the exec that scheduled it.
type runningWriter struct {
	mu    sync.Mutex // guards timer and done
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
