package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/policy"
	"github.com/postern-dev/postern/markers"
)

// journalOnly is a bastion with nothing but a journal (a real store in a temp dir): enough
// to build what tools return. Its clock moves a millisecond at every reading, so consecutive
// writes never share a time.
func journalOnly(t *testing.T) *Engine {
	t.Helper()
	dir := t.TempDir()
	var mu sync.Mutex
	clock := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Millisecond)
		return clock
	}
	signer, _, err := markers.LoadOrCreateAuditKey(filepath.Join(dir, "audit.key"), "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	j, err := markers.Open(filepath.Join(dir, "journal"), markers.Options{Graph: markers.JournalGraph, Signer: signer, Now: now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	b := &Engine{core: testCore(&core{journal: j, now: now})}
	b.records = &records{journal: b.journal, now: now, metrics: newMetrics()}
	b.drivers = newDrivers(b.core)
	b.views = &views{core: b.core, drivers: b.drivers}
	return b
}

// journalAs creates a record and walks it along path, the last step applying mutate.
func journalAs(t *testing.T, b *Engine, r markers.Record, path []markers.State, mutate func(*markers.Record)) *markers.Record {
	t.Helper()
	ctx := context.Background()
	rec, err := b.journal.Create(ctx, &r)
	if err != nil {
		t.Fatal(err)
	}
	if len(path) == 0 {
		return rec
	}
	rec, err = b.journal.Advance(ctx, rec.ID, rec.State, path, "test", func(r *markers.Record) error {
		if mutate != nil {
			mutate(r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func evidence(lines ...string) func(*markers.Record) {
	return func(r *markers.Record) { r.Evidence = append(r.Evidence, lines...) }
}

// TestWhatAgentsRead: the text of a result states the cause of a failed or unknown
// execution and what to do next; CallFailed says whether a call that starts work failed
// (bastion/mcpserver sets isError from it); finished_at is when the outcome was observed.
func TestWhatAgentsRead(t *testing.T) {
	b := journalOnly(t)
	const agent, other = "token:agent", "token:other"
	dispatched := []markers.State{markers.Authorized, markers.Dispatched}
	exit := func(code int) func(*markers.Record) {
		return func(r *markers.Record) { r.ExitCode = &code; r.IsError = code != 0 }
	}
	own := journalAs(t, b, markers.Record{ID: "ex_01K00000000000000000000OWN", Actor: agent, Host: "h1", OperationKey: "migration:7"},
		append(dispatched, markers.Running, markers.Completed), exit(0))
	others := journalAs(t, b, markers.Record{ID: "ex_01K000000000000000000OTHER", Actor: other, Host: "h1", OperationKey: "migration:8"},
		append(dispatched, markers.Running, markers.Completed), exit(0))
	taken := func(op string, holder *markers.Record) func(*markers.Record) {
		return func(r *markers.Record) {
			r.OperationTakenBy = holder.ID
			r.IsError = true
			r.Evidence = append(r.Evidence, "operation key "+op+" is taken by another execution on h1; this execution was not started")
		}
	}

	tests := []struct {
		name   string
		rec    markers.Record
		path   []markers.State
		mutate func(*markers.Record)
		// wantText are in the text; neverText appear nowhere in the result.
		wantText, neverText []string
		// wantFailed is isError for ssh_exec / http_request; reads and cancels are never an error.
		wantFailed bool
	}{
		{
			name: "failed: host unreachable, keyed",
			rec:  markers.Record{IdempotencyKey: "deploy-1"},
			path: []markers.State{markers.Authorized, markers.Failed},
			mutate: evidence("policy: authorized (default)",
				"could not connect to h1, nothing was sent: dial tcp 127.0.0.1:1: connect: connection refused\nsecond line"),
			wantText: []string{
				"failed.\nCause: could not connect to h1, nothing was sent: dial tcp 127.0.0.1:1: connect: connection refused\nNext: Nothing ran",
				"same idempotency_key with the same request starts a new attempt",
			},
			wantFailed: true,
		},
		{
			name:       "failed, unkeyed",
			rec:        markers.Record{},
			path:       []markers.State{markers.Authorized, markers.Failed},
			mutate:     evidence("the host refused the request, nothing was started: exec"),
			wantText:   []string{"Cause: the host refused the request", "Next: Nothing ran: it provably did not take effect. Fix the cause, then call again."},
			neverText:  []string{"idempotency_key"},
			wantFailed: true,
		},
		{
			name:       "new attempt",
			rec:        markers.Record{IdempotencyKey: "deploy-1", PreviousAttempt: "ex_01K0000000000000000000PREV"},
			path:       append(dispatched, markers.Running, markers.Completed),
			mutate:     exit(0),
			wantText:   []string{"completed (exit 0). New attempt after ex_01K0000000000000000000PREV, which failed without effect."},
			neverText:  []string{"Cause:"},
			wantFailed: false,
		},
		{
			name:       "unknown: the latest evidence is the cause",
			rec:        markers.Record{},
			path:       append(dispatched, markers.Unknown),
			mutate:     evidence("connection lost after dispatch (EOF); asking the host", "hostagent on h1 could not be asked (connection refused); the outcome stays unknown until it can be"),
			wantText:   []string{"unknown.\nCause: hostagent on h1 could not be asked", "Next: The outcome is NOT known", "execution_status"},
			wantFailed: true,
		},
		{
			name:       "operation key held by the same actor: named, not to be retried",
			rec:        markers.Record{OperationKey: "migration:7"},
			path:       append(dispatched, markers.Failed),
			mutate:     taken("migration:7", own),
			wantText:   []string{"Cause: operation key migration:7 already ran as " + own.ID + " (completed)", "The operation already ran as " + own.ID + ": do not run it again", "execution_status"},
			wantFailed: true,
		},
		{
			name:       "operation key held by another actor: never named",
			rec:        markers.Record{OperationKey: "migration:8"},
			path:       append(dispatched, markers.Failed),
			mutate:     taken("migration:8", others),
			wantText:   []string{"Cause: operation key migration:8 is taken by another execution on h1", "Do not retry"},
			neverText:  []string{others.ID},
			wantFailed: true,
		},
		{name: "completed, exit 0", path: append(dispatched, markers.Running, markers.Completed), mutate: exit(0), wantFailed: false},
		{name: "completed, exit 1", path: append(dispatched, markers.Running, markers.Completed), mutate: exit(1), wantText: []string{"(exit 1)"}, wantFailed: true},
		{name: "timed out", path: append(dispatched, markers.Running, markers.TimedOut), wantFailed: true},
		{name: "cancelled", path: append(dispatched, markers.Running, markers.Cancelled), wantFailed: true},
		{
			name: "rejected by policy: the rule, why and what to do",
			path: []markers.State{markers.Rejected},
			mutate: evidence("actor resolved: agent", `policy: rejected (rules[0] "no-rm")`,
				policyRefusal(policy.Decision{Outcome: policy.Rejected, Code: policy.CodeDenied, Rule: `rules[0] "no-rm"`}).Text()),
			wantText: []string{"rejected.\nCause: " + `denied: a deny rule matches this call (rules[0] "no-rm"). Change the command`,
				"Next: Rejected; it was not run, and a retry of this same call returns this same rejection."},
			wantFailed: true,
		},
		{
			name: "rejected by an operator: the latest evidence",
			path: []markers.State{markers.AwaitingApproval, markers.Rejected},
			mutate: evidence(policyRefusal(policy.Decision{Outcome: policy.AwaitingApproval, Rule: `rules[1] "prod"`}).Text(),
				"denied by operator alice: not now"),
			wantText:   []string{"Cause: denied by operator alice: not now"},
			wantFailed: true,
		},
		{name: "running", path: append(dispatched, markers.Running), wantFailed: false},
		{
			name: "awaiting approval: which rule, and what to do meanwhile",
			path: []markers.State{markers.AwaitingApproval},
			mutate: evidence(policyRefusal(policy.Decision{Outcome: policy.AwaitingApproval, Rule: `rules[1] "prod"`}).Text(),
				"approval asked of the agent's user by elicitation; an operator may still decide"),
			wantText: []string{"awaiting_approval.\nCause: " + `approval_required: policy requires a person's approval before this runs (rules[1] "prod").`,
				"Next: Not run yet: it waits for a person's approval", "execution_status", "never asks twice"},
			neverText:  []string{"postern approve"},
			wantFailed: false,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.rec
			r.ID, r.Actor, r.Host = "ex_01K0000000000000000000000"+string(rune('A'+i)), agent, "h1"
			x := b.views.view(journalAs(t, b, r, tt.path, tt.mutate))
			if got := x.CallFailed(); got != tt.wantFailed {
				t.Errorf("CallFailed = %v; want %v", got, tt.wantFailed)
			}
			if strings.Contains(x.Cause, "\n") {
				t.Errorf("cause %q is more than one line", x.Cause)
			}
			text := x.Summary()
			structured, _ := json.Marshal(x)
			for _, w := range tt.wantText {
				if !strings.Contains(text, w) {
					t.Errorf("text does not say %q:\n%s", w, text)
				}
			}
			for _, n := range tt.neverText {
				if strings.Contains(text, n) || strings.Contains(string(structured), n) {
					t.Errorf("result shows %q:\n%s\n%s", n, text, structured)
				}
			}
		})
	}
}

// TestFinishedAtIgnoresTheDeliveryWrite: delivering a result updates the record but not
// when its outcome was observed.
func TestFinishedAtIgnoresTheDeliveryWrite(t *testing.T) {
	b := journalOnly(t)
	rec := journalAs(t, b, markers.Record{ID: "ex_01K00000000000000000000FIN", Actor: "token:agent"},
		[]markers.State{markers.Authorized, markers.Dispatched, markers.Completed}, nil)
	observed := rec.StateTimes[markers.Completed]
	if err := b.DeliveryJournal().Delivered(context.Background(), rec.ID); err != nil {
		t.Fatal(err)
	}
	after, err := b.journal.Get(rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !after.UpdatedAt.After(observed) {
		t.Fatalf("delivery did not update the record (updated %v, completed %v)", after.UpdatedAt, observed)
	}
	x := b.views.view(after)
	if x.FinishedAt == nil || !x.FinishedAt.Equal(observed) {
		t.Errorf("finished_at = %v; want %v, when completed was journaled", x.FinishedAt, observed)
	}
}

// TestHostProblem: what an agent reads when its host was sent nothing says which of three
// things is wrong — the host refuses the bastion's key, presents another host key, or cannot
// be reached — and an unreachable host reads the same on the dial that failed and on every
// call while the pool waits to dial again, with no figures of that wait.
func TestHostProblem(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	dial := fmt.Errorf("%w: dial h1 (10.0.0.1:22): %w", fleet.ErrHostUnreachable, refused)
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"refused connection", dial, "host_unreachable: host h1 cannot be reached (connection refused). Call again later"},
		{"a timeout", fmt.Errorf("%w: dial h1: %w", fleet.ErrHostUnreachable, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}),
			"host_unreachable: host h1 cannot be reached (i/o timeout)."},
		{"the key is refused", fmt.Errorf("%w: h1: ssh: handshake failed: ssh: unable to authenticate", fleet.ErrKeyRefused),
			"host_refuses_key: host h1 refuses the bastion's SSH key. The bastion's key must be authorized on the host"},
		{"another host key", fmt.Errorf("%w: h1 presented SHA256:x, enrolled SHA256:y", fleet.ErrHostKeyMismatch),
			"host_key_mismatch: host h1 presents another host key than the one enrolled, so Postern sends it nothing."},
		{"a certificate refused", fmt.Errorf("%w: h1's certificate expired at 2026-12-01T11:00:00Z: re-sign the host's key (ssh-keygen -s CA -h -n h1 -V +52w) and install it", fleet.ErrHostCertRefused),
			"host_cert_refused: host h1 presents a host certificate or key the bastion does not accept (another name, expired, an untrusted CA, or revoked), so Postern sends it nothing. An operator must fix"},
		{"a failed hello", fmt.Errorf("bastion: host h1: %w", errors.New("hostproto: hello: EOF")),
			"host_unreachable: host h1 cannot be reached (host h1: hostproto: hello: EOF)."},
	}
	for _, tt := range tests {
		got := hostProblem("h1", tt.err).Text()
		if !strings.HasPrefix(got, tt.want) {
			t.Errorf("%s: %q; want it to start %q", tt.name, got, tt.want)
		}
		for _, never := range []string{"next dial", "10.0.0.1", "postern "} {
			if strings.Contains(got, never) {
				t.Errorf("%s: %q shows %q", tt.name, got, never)
			}
		}
	}
}

// TestPolicyRefusal: every policy outcome that is not authorized reads as its code, the
// rule and a reason an agent can act on; none names an operator command. The policy's own
// words, when it gives them, are the reason and the repair.
func TestPolicyRefusal(t *testing.T) {
	own := policyRefusal(policy.Decision{Outcome: policy.Rejected, Code: policy.CodeDenied, Rule: `rules[0] "no-rm"`,
		Reason: `denied by rule rules[0] "no-rm": rm -rf /x matches "rm **"`, Repair: "the policy forbids this here"})
	if want := `denied: denied by rule rules[0] "no-rm": rm -rf /x matches "rm **". The policy forbids this here.`; own.Text() != want {
		t.Errorf("with the policy's words: %q; want %q", own.Text(), want)
	}
	pending := policyRefusal(policy.Decision{Outcome: policy.AwaitingApproval, Rule: `rules[1] "prod"`,
		Reason: `rule rules[1] "prod" requires a person's approval: deploy web`, Repair: "wait for a person to approve it"})
	if want := `approval_required: rule rules[1] "prod" requires a person's approval: deploy web. Wait for a person to approve it.`; pending.Text() != want {
		t.Errorf("approval with the policy's words: %q; want %q", pending.Text(), want)
	}

	for _, dec := range []policy.Decision{
		{Outcome: policy.Rejected, Code: policy.CodeDenied, Rule: `rules[0] "no-rm"`},
		{Outcome: policy.Rejected, Code: policy.CodeUnparsable, Rule: `rules[0] "no-rm"`},
		{Outcome: policy.Rejected, Code: policy.CodeNotAllowed, Rule: "actor agent: host h2 not allowed"},
		{Outcome: policy.Rejected, Code: policy.CodeActorUnknown, Rule: `actor "": not configured`},
		{Outcome: policy.Rejected, Code: policy.CodeTargetUnknown, Rule: "ssh_exec without a host"},
		{Outcome: policy.AwaitingApproval, Rule: `rules[1] "prod"`},
	} {
		r := policyRefusal(dec)
		text := r.Text()
		wantCode := dec.Code
		if dec.Outcome == policy.AwaitingApproval {
			wantCode = codeApprovalRequired
		}
		if !strings.HasPrefix(text, wantCode+": ") || !strings.Contains(text, "("+dec.Rule+")") || r.Reason == "" {
			t.Errorf("%s/%s: %q; want the code, a reason and the rule", dec.Outcome, dec.Code, text)
		}
		if dec.Outcome == policy.Rejected && r.Repair == "" {
			t.Errorf("%s: %q says nothing of what to do", dec.Code, text)
		}
		if strings.Contains(text, "postern ") {
			t.Errorf("%s: %q names an operator command", dec.Code, text)
		}
	}
}
