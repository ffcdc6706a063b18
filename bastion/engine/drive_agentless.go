package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/ctxtime"
	"github.com/postern-dev/postern/markers"
)

// Hosts without the hostagent (docs/agentless.md): commands go over the
// pooled connection to a stock sshd, as one line (package agentless) that runs them under
// the marker script (fleet.GuaranteeMarkerScript) or bare (fleet.GuaranteeNone). The journal gives them
// the same execution identity; what the host can tell after a lost connection is what
// verdict.ReconcileByLevel decides on.

// checkAgentlessCall refuses what a host without the hostagent cannot honour, before anything is
// journaled: operation keys (the hostagent keeps them), commands too long for one line, and
// on a marker-script host an env HOME — sshd's env, or the exports at the head of the line,
// reach the wrapper too, and HOME would move its markers away from where the bastion reads
// them (no marker there means "never started").
func checkAgentlessCall(host fleet.Host, a api.ExecArgs, cwd string) error {
	if host.Level() == fleet.GuaranteeHostagent {
		return nil
	}
	if a.OperationKey != "" {
		return api.Invalid("operation_key needs the hostagent, and %s runs none (guarantee %s); leave it out, or use idempotency_key", host.Name, host.Level())
	}
	if _, ok := a.Env["HOME"]; ok && host.Level() == fleet.GuaranteeMarkerScript {
		return api.Invalid("env HOME: the marker script on %s keeps its markers under the account's home, so HOME cannot be set there; set it inside the command instead", host.Name)
	}
	_, err := agentlessLine(host, &markers.Record{ID: placeholderID, Command: shellCommand(a.Command), Cwd: cwd, TimeoutSeconds: a.TimeoutS}, a.Env)
	if errors.Is(err, agentless.ErrTooLong) {
		return api.Invalid("command is too long for %s, which runs no hostagent: %v", host.Name, err)
	}
	return err
}

// agentlessLine is the command line rec runs as on host, with export at its head.
func agentlessLine(host fleet.Host, rec *markers.Record, export map[string]string) (string, error) {
	c := agentless.Command{ID: rec.ID, Cwd: rec.Cwd, TimeoutS: rec.TimeoutSeconds, Line: commandLine(rec), Export: export}
	if host.Level() == fleet.GuaranteeMarkerScript {
		return agentless.WrappedLine(c, host.ScriptSHA256)
	}
	return agentless.PlainLine(c)
}

// driveAgentless carries an execution on a stock sshd to its outcome, once it is dispatched (or
// reconciled to be): exec, and after a lost connection read the marker (marker script) — at
// most maxReconcileAttempts times — or stop for review (level none).
func (d *driver) driveAgentless(log *slog.Logger, host fleet.Host) {
	for attempt := 1; ; attempt++ {
		a := d.execAgentless(host)
		if d.ctx.Err() != nil {
			return // shutting down: the host goes on; the next start reconciles
		}
		act := verdict.AgentlessExecVerdict(host.Level(), host.Name, a)
		if act.Do == verdict.Confirm {
			w, err := d.hosts.scriptStatus(host, d.id)
			act = verdict.ConfirmAnswer(host.Name, act.Verdict, w, err)
			log.Info("confirmed the answer with the marker", "marker", w.State, "action", act.Do, "note", act.Verdict.Note)
		}
		if !d.conclude(act.Verdict) {
			return
		}
		switch {
		case act.Do == verdict.Watch:
			d.watchAgentless(log, host)
			return
		case !act.Verdict.Again:
			if act.Verdict.To != markers.Unknown {
				log.Info("execution ended", "state", d.record().State)
			}
			return
		case attempt >= maxReconcileAttempts:
			log.Warn("outcome still unknown after reconciling", "attempts", attempt)
			return
		}
		if !ctxtime.Sleep(d.ctx, time.Duration(attempt)*250*time.Millisecond) {
			return
		}
		switch d.reconcileAgentless(log, host) {
		case verdict.Watch:
			d.watchAgentless(log, host)
			return
		case verdict.Redispatch:
		default:
			return
		}
	}
}

// reconcileAgentless reads what the host can tell about the execution, journals
// verdict.ReconcileByLevel's verdict and returns what the driver is to do: exec again (redispatch:
// the marker script has no marker, so the command never started), watch the marker, or
// nothing more (settle, also when the verdict could not be journaled).
func (d *driver) reconcileAgentless(log *slog.Logger, host fleet.Host) verdict.Do {
	rec := d.record()
	var st verdict.LevelStatus
	if host.Level() == fleet.GuaranteeMarkerScript {
		w, err := d.hosts.scriptStatus(host, rec.ID)
		if err != nil {
			d.unreachable(log, host.Name, "its marker script", err)
			return verdict.Settle
		}
		st.Wrapper = w
	}
	act := verdict.ReconcileByLevel(host.Level(), rec, d.now(), host.Name, st, d.all.stopRequested(rec.ID))
	answer := string(st.Wrapper.State)
	if answer == "" {
		answer = "no_marker"
	}
	d.metrics.reconciled.WithLabelValues(answer).Inc()
	log.Info("reconciled with host", "guarantee", host.Level(), "marker", answer, "action", act.Do, "note", act.Verdict.Note)
	if !d.conclude(act.Verdict) {
		return verdict.Settle
	}
	return act.Do
}

// Watching a marker script's marker: every watchMin at first, backing off to watchMax.
const (
	watchMin = 250 * time.Millisecond
	watchMax = 10 * time.Second
)

// watchAgentless reads the marker of a command the marker script runs until it ends (or the
// bastion closes, or the host cannot be asked), journaling what it says.
func (d *driver) watchAgentless(log *slog.Logger, host fleet.Host) {
	for wait := watchMin; ; wait = min(2*wait, watchMax) {
		if !ctxtime.Sleep(d.ctx, wait) {
			return
		}
		w, err := d.hosts.scriptStatus(host, d.id)
		if err != nil {
			d.unreachable(log, host.Name, "its marker script", err)
			return
		}
		act := verdict.ReconcileByLevel(host.Level(), d.record(), d.now(), host.Name, verdict.LevelStatus{Wrapper: w}, d.all.stopRequested(d.id))
		if act.Do == verdict.Redispatch {
			// The marker vanished while it was watched: something removed it on the host.
			act = verdict.Action{Do: verdict.Settle, Verdict: verdict.Verdict{To: markers.Unknown, Review: true, Note: fmt.Sprintf(
				"the marker script's marker on %s vanished while the command ran; it is not sent again — review required", host.Name)}}
		}
		if !d.conclude(act.Verdict) || act.Do != verdict.Watch {
			return
		}
	}
}

// execAgentless sends the execution to its stock sshd and returns how the exec ended.
func (d *driver) execAgentless(host fleet.Host) verdict.AgentlessAnswer {
	rec := d.record()
	conn, err := d.pool.Conn(d.ctx, host)
	if err != nil {
		return verdict.AgentlessAnswer{Err: err}
	}
	d.stdout.restart()
	d.stderr.restart()
	start := time.Now()
	var running runningWriter
	var answer *agentless.Answer
	stderr := &agentless.Filter{W: notifyingWriter{d.stderr, d}, OnAnswer: func(a agentless.Answer, err error) {
		if err != nil {
			return // not an answer Postern's line gives: the outcome decides without it
		}
		answer = &a
		if a.Kind == agentless.Started {
			d.metrics.dispatchLatency.Observe(time.Since(start).Seconds())
			d.setStarted(&hostproto.Marker{ID: rec.ID, State: hostproto.MarkerRunning})
			running.after(runningDelay, func() { d.markRunning() })
		}
	}}
	env := map[string]string{hostproto.EnvExecutionID: rec.ID}
	maps.Copy(env, rec.Env)
	res := runAgentless(d.ctx, conn, env, func(export map[string]string) (string, error) { return agentlessLine(host, rec, export) },
		notifyingWriter{d.stdout, d}, stderr)
	stderr.Close()
	running.stop()
	if res.Err != nil {
		d.pool.Invalidate(host, conn)
	}
	// The stderr copy ended before runAgentless returned: answer is written.
	return verdict.AgentlessAnswer{Sent: res.Sent, Refused: res.Refused, Answer: answer, Exit: res.Exit, Signal: res.Signal, Err: res.Err, Stderr: lastLine(d.stderr), Unreadable: stderr.Unreadable()}
}

// agentlessResult is how one exec channel on a stock sshd ended.
type agentlessResult struct {
	Sent, Refused bool
	Exit          *int
	Signal        string
	Err           error
}

// runAgentless opens a session on conn, offers env with SetEnv (what the server's AcceptEnv
// refuses goes to the line's head instead: line gets it), execs the line and copies the
// output until the exit status. ctx cancellation closes the channel; the command goes on.
func runAgentless(ctx context.Context, conn gossh.Conn, env map[string]string, line func(export map[string]string) (string, error), stdout, stderr io.Writer) agentlessResult {
	ch, reqs, err := conn.OpenChannel("session", nil)
	if err != nil {
		return agentlessResult{Err: fmt.Errorf("open session: %w", err)}
	}
	defer ch.Close()
	stop := context.AfterFunc(ctx, func() { ch.Close() })
	defer stop()
	var res agentlessResult
	var loop sync.WaitGroup
	loop.Go(func() {
		for req := range reqs {
			if code, signal, ok := hostproto.ParseExit(req); ok && signal != "" {
				res.Signal = signal
			} else if ok {
				res.Exit = &code
			}
			if req.WantReply {
				req.Reply(false, nil)
			}
		}
	})
	// Until the loop is waited for, res belongs to it.
	fail := func(sent bool, err error) agentlessResult {
		ch.Close()
		loop.Wait()
		res.Sent, res.Err = sent, err
		return res
	}
	export := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		msg := struct{ Name, Value string }{k, env[k]}
		ok, err := ch.SendRequest("env", true, gossh.Marshal(&msg))
		if err != nil {
			return fail(false, fmt.Errorf("send env %s: %w", k, err))
		}
		if !ok {
			export[k] = env[k] // AcceptEnv refused it: exported at the head of the line
		}
	}
	text, err := line(export)
	if err != nil {
		return fail(false, err)
	}
	cmd := struct{ Command string }{text}
	ok, err := ch.SendRequest("exec", true, gossh.Marshal(&cmd))
	switch {
	case err != nil:
		// The request may have reached the host before the connection failed.
		return fail(true, fmt.Errorf("send exec: %w", err))
	case !ok:
		res.Refused = true
		return fail(true, errors.New("exec refused"))
	}
	ch.CloseWrite()
	var copies sync.WaitGroup
	copies.Go(func() { copyPooled(stdout, ch) })
	copies.Go(func() { copyPooled(stderr, ch.Stderr()) })
	copies.Wait()
	loop.Wait()
	res.Sent = true
	switch {
	case ctx.Err() != nil:
		res.Err = ctx.Err()
	case res.Exit == nil && res.Signal == "":
		res.Err = errors.New("channel closed without an exit status")
	}
	return res
}

// fixedLine is a line for runAgentless that needs no exports (it is sent without env).
func fixedLine(line string) func(map[string]string) (string, error) {
	return func(map[string]string) (string, error) { return line, nil }
}

func lastBytes(b []byte, n int) []byte { return b[max(0, len(b)-n):] }
