package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/bastion/verdict"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/capbuf"
	"github.com/postern-dev/postern/markers"
)

// hosts is how the engine asks its hosts what it cannot learn from the journal: a
// hostagent's status and markers and its spooled output through the control protocol, a
// marker script's records, a cancel, and whether a host answers at all. Each call goes over
// the host's pooled connection (strict host key); a connection that fails is dropped from the
// pool so the next call redials.
type hosts struct {
	pool *fleet.Pool
	inv  *fleet.Inventory
	// ctx is the engine's lifetime: asking on behalf of a driver ends with it.
	ctx context.Context
	// sshCA: the bastion logs in with certificates ([ssh_ca]); a fix says to trust the CA.
	sshCA bool
}

// spool reads output older than the stored tail from the host (its spool keeps the
// whole capped output until the marker's retention).
func (hs *hosts) spool(ctx context.Context, rec *markers.Record, outOff, errOff int64, limit int) (string, string, bool) {
	host, err := hostOf(hs.inv, rec)
	if err != nil || host.Level() != fleet.GuaranteeHostagent {
		return "", "", false // only the hostagent spools output
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := hs.pool.Conn(ctx, host)
	if err != nil {
		return "", "", false
	}
	cc, err := hostproto.DialControl(conn)
	if err != nil {
		return "", "", false
	}
	defer cc.Close()
	var out, errb []byte
	errEnough := errors.New("enough output")
	_, err = cc.Attach(ctx, rec.ID, outOff, errOff, func(stream string, _ int64, data []byte) error {
		switch stream {
		case "stdout":
			out = append(out, data[:min(len(data), limit-len(out))]...)
		case "stderr":
			errb = append(errb, data[:min(len(data), limit-len(errb))]...)
		}
		if len(out) >= limit && len(errb) >= limit {
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return "", "", false
	}
	return string(out), string(errb), true
}

// queryMarkerScript runs line (agentless.StatusLine or ListLine) on host over the pooled
// connection, keeping at most max bytes of stdout (0: 64 KiB). The wrapper's refusal (script
// missing or changed) is the error.
func (hs *hosts) queryMarkerScript(ctx context.Context, host fleet.Host, line string, max int) (scriptReply, error) {
	conn, err := hs.pool.Conn(ctx, host)
	if err != nil {
		return scriptReply{}, err
	}
	if max == 0 {
		max = 64 << 10
	}
	var out, errb bytes.Buffer
	// One byte more than max tells a cut stdout from one of exactly max bytes.
	res := runAgentless(ctx, conn, nil, fixedLine(line), &capbuf.Buffer{B: &out, Max: max + 1}, &capbuf.Buffer{B: &errb})
	if res.Err != nil {
		hs.pool.Invalidate(host, conn)
		return scriptReply{}, res.Err
	}
	// A refusal is the wrapper program's, before the script runs: stdout has no answer then.
	if _, err := agentless.FindAnswer(out.Bytes()); err != nil {
		if r, err := agentless.FindAnswer(errb.Bytes()); err == nil && r.Kind == agentless.Refused {
			return scriptReply{}, errors.New(verdict.RefusalText(host.Name, r.Reason))
		}
	}
	rep := scriptReply{Stdout: out.Bytes(), Stderr: errb.Bytes(), Exit: res.Exit, Truncated: out.Len() > max}
	if rep.Truncated {
		rep.Stdout = rep.Stdout[:max]
	}
	return rep, nil
}

// listMarkerScript reads every marker the marker script keeps on host.
func (hs *hosts) listMarkerScript(ctx context.Context, host fleet.Host) ([]agentless.Answer, error) {
	rep, err := hs.queryMarkerScript(ctx, host, agentless.ListLine(host.ScriptSHA256), maxScriptListBytes)
	if err != nil {
		return nil, err
	}
	switch {
	case rep.Truncated:
		return nil, fmt.Errorf("the marker script on %s lists more than %d bytes of markers; read them on the host: ~/.postern/run list", host.Name, maxScriptListBytes)
	case rep.Exit == nil || *rep.Exit != 0:
		return nil, fmt.Errorf("the marker script on %s could not list its markers (stderr %q)", host.Name, lastBytes(rep.Stderr, 200))
	}
	return parseScriptList(host.Name, rep.Stdout)
}

// scriptStatus reads the marker script's marker of id on host.
func (hs *hosts) scriptStatus(host fleet.Host, id string) (agentless.Answer, error) {
	ctx, cancel := context.WithTimeout(hs.ctx, 15*time.Second)
	defer cancel()
	return hs.askMarkerScript(ctx, host, id)
}

// agentlessMarkerNote is what investigate says about the host's record of rec, by the host's
// level (the hostagent's is asked through its control protocol instead).
func (hs *hosts) agentlessMarkerNote(ctx context.Context, rec *markers.Record, host fleet.Host) string {
	if host.Level() == fleet.GuaranteeNone {
		return fmt.Sprintf("%s runs no hostagent and no marker script (guarantee level none): nothing on it records executions, so what happened after the bastion lost the connection — whether the command started, whether it is still running, how it ended — cannot be known from Postern; only what the bastion observed is evidence. Check the command's effects on the host, then record what you found with postern review %s", host.Name, rec.ID)
	}
	w, err := hs.askMarkerScript(ctx, host, rec.ID)
	if err != nil {
		return fmt.Sprintf("the marker script on %s could not be read: %v", host.Name, err)
	}
	s := string(w.State)
	switch {
	case w.State == agentless.Exited:
		s = fmt.Sprintf("exited, exit %d", *w.Exit)
	case w.State == agentless.Absent:
		return fmt.Sprintf("the marker script on %s, asked now, has no marker %s (it keeps finished markers for %d days)", host.Name, rec.ID, w.RetentionDays)
	}
	return fmt.Sprintf("the marker script on %s, asked now, has marker %s: %s (guarantee level marker script: no output is kept on the host)", host.Name, rec.ID, s)
}

// agentlessHealth is the doctor's answer for a host without the hostagent: it connects with the
// pinned key and, for the marker script, reads a marker (which checks the script's digest).
func (hs *hosts) agentlessHealth(ctx context.Context, h fleet.Host) api.HostHealth {
	hh := api.HostHealth{Name: h.Name, Addr: h.Addr, Guarantee: string(h.Level())}
	_, err := hs.pool.Conn(ctx, h)
	if err == nil && h.Level() == fleet.GuaranteeMarkerScript {
		_, err = hs.askMarkerScript(ctx, h, placeholderID)
	}
	if err == nil {
		hh.OK = true
		return hh
	}
	hh.Problem = err.Error()
	switch {
	case errors.Is(err, fleet.ErrHostCertRefused):
		hh.Fix = "the host's certificate is not accepted; the problem says what to fix (docs/inventory.md, \"Host certificates\")"
	case errors.Is(err, fleet.ErrHostKeyMismatch):
		hh.Fix = fmt.Sprintf("the host presents another key than the one enrolled: check it on the host (ssh-keygen -lf its host key), then `postern hosts enroll %s %s --agentless --replace`", h.Name, h.Addr)
	case errors.Is(err, fleet.ErrKeyRefused):
		hh.Fix = fmt.Sprintf("sshd on %s does not accept the bastion's key: append the line `postern hosts key` prints to ~%s/.ssh/authorized_keys there", h.Name, h.Account)
		if hs.sshCA {
			hh.Fix = fmt.Sprintf("sshd on %s does not accept the bastion's ssh certificate: put the lines `postern ca keys` prints in its TrustedUserCAKeys file (docs/ssh-ca.md)", h.Name)
		}
	case strings.Contains(err.Error(), "marker script"):
		hh.Fix = fmt.Sprintf("re-enroll the host to install the marker script again: `postern hosts enroll %s %s --agentless --marker-script --account %s`", h.Name, h.Addr, h.Account)
	default:
		hh.Fix = fmt.Sprintf("is sshd running on %s and listening on %s? Check the address with `postern hosts list`, and that no firewall is in the way", h.Name, h.Addr)
	}
	return hh
}

func (hs *hosts) askMarkerScript(ctx context.Context, host fleet.Host, id string) (agentless.Answer, error) {
	line, err := agentless.StatusLine(id, host.ScriptSHA256)
	if err != nil {
		return agentless.Answer{}, err
	}
	rep, err := hs.queryMarkerScript(ctx, host, line, 0)
	if err != nil {
		return agentless.Answer{}, err
	}
	a, err := agentless.FindAnswer(rep.Stdout)
	if err != nil {
		return agentless.Answer{}, fmt.Errorf("the marker script on %s gave no status: %w (stderr %q)", host.Name, err, lastBytes(rep.Stderr, 200))
	}
	if a.Kind != agentless.Status || a.ID != id {
		return agentless.Answer{}, fmt.Errorf("the marker script on %s answered %q for %s", host.Name, a.Kind, id)
	}
	return a, nil
}

// control opens the hostagent's control protocol on host.
func (hs *hosts) control(ctx context.Context, host fleet.Host) (*hostproto.ControlClient, error) {
	conn, err := hs.pool.Conn(ctx, host)
	if err != nil {
		return nil, err
	}
	return hostproto.DialControl(conn)
}

// markerHost is the host a markers request names, once its level keeps markers.
func (hs *hosts) markerHost(name string) (fleet.Host, error) {
	host, err := hs.inv.Host(name)
	if err == nil && host.Level() == fleet.GuaranteeNone {
		err = noMarkersError(host)
	}
	return host, err
}

// showHostagentMarker is the hostagent's marker of id (nil: none).
func (hs *hosts) showHostagentMarker(ctx context.Context, host fleet.Host, id string) (*hostproto.Marker, error) {
	cc, err := hs.control(ctx, host)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	found, _, err := cc.Status(ctx, []string{id})
	if err != nil || len(found) == 0 {
		return nil, err
	}
	return found[0], nil
}

// showScriptMarker is the marker script's marker of id (nil: none).
func (hs *hosts) showScriptMarker(ctx context.Context, host fleet.Host, id string) (*hostproto.Marker, error) {
	if !markers.ValidExecutionID(id) {
		return nil, api.Invalid("%q is not an execution id", id)
	}
	a, err := hs.askMarkerScript(ctx, host, id)
	if err != nil || a.State == agentless.Absent {
		return nil, err
	}
	return scriptMarker(host, a), nil
}

func (hs *hosts) cancel(ctx context.Context, host fleet.Host, id string) error {
	if host.Level() != fleet.GuaranteeHostagent {
		return fmt.Errorf("%w: %s (guarantee %s) cannot cancel a command it started", api.ErrNoHostagent, host.Name, host.Level())
	}
	ctx, cancel := context.WithTimeout(ctx, cancelWait)
	defer cancel()
	conn, err := hs.pool.Conn(ctx, host)
	if err != nil {
		return err
	}
	cc, err := hostproto.DialControl(conn)
	if err != nil {
		return err
	}
	defer cc.Close()
	_, err = cc.Cancel(ctx, id)
	if errors.Is(err, hostproto.ErrNotRunning) || errors.Is(err, hostproto.ErrNotFound) {
		return nil // it ended, or never started (no marker): the driver reports which
	}
	return err
}

func (hs *hosts) health(ctx context.Context, h fleet.Host) api.HostHealth {
	hh := api.HostHealth{Name: h.Name, Addr: h.Addr}
	if h.Level() != fleet.GuaranteeHostagent {
		return hs.agentlessHealth(ctx, h) // agentless.go
	}
	conn, err := hs.pool.Conn(ctx, h)
	if err == nil {
		var cc *hostproto.ControlClient
		if cc, err = hostproto.DialControl(conn); err == nil {
			defer cc.Close()
			var st hostproto.StatusReport
			if st, err = cc.StatusReport(ctx, []string{placeholderID}); err == nil {
				hh.OK, hh.Version, hh.Protocol = true, st.Version, hs.pool.Protocol(h.Name)
				if hh.Version == "" {
					hh.Version = "(older than the version report)"
				}
				return hh
			}
		}
	}
	hh.Problem = err.Error()
	switch {
	case errors.Is(err, fleet.ErrHostCertRefused):
		hh.Fix = "the host's certificate is not accepted; the problem says what to fix (docs/inventory.md, \"Host certificates\")"
	case errors.Is(err, fleet.ErrHostKeyMismatch):
		hh.Fix = fmt.Sprintf("the host presents another key than the one enrolled: check it on the host (ssh-keygen -lf its host key), then `postern hosts enroll %s %s --replace`", h.Name, h.Addr)
	case errors.Is(err, fleet.ErrKeyRefused):
		hh.Fix = fmt.Sprintf("the hostagent on %s does not accept the bastion's key: append the line `postern hosts key` prints to its authorized_keys file, and check that %s is in its allowed_accounts", h.Name, h.Account)
		if hs.sshCA {
			hh.Fix = fmt.Sprintf("the hostagent on %s does not accept the bastion's ssh certificate: put the lines `postern ca keys` prints in its trusted_user_ca_keys_file, and check that %s is in its allowed_accounts", h.Name, h.Account)
		}
	default:
		hh.Fix = fmt.Sprintf("is postern-hostagent running on %s (systemctl status postern-hostagent) and listening on %s? Check the address with `postern hosts list`, and that no firewall is in the way", h.Name, h.Addr)
	}
	return hh
}

// connected makes sure the pooled connection to h is up, before the dispatch boundary: a
// host that cannot be reached (or presents another key) is sent nothing.
func (hs *hosts) connected(h fleet.Host) bool {
	ctx, cancel := context.WithTimeout(hs.ctx, connectTimeout)
	defer cancel()
	_, err := hs.pool.Conn(ctx, h)
	return err == nil
}

// status returns the host's status answer about id: its marker (nil if it has none) and
// how long it keeps markers.
func (hs *hosts) status(host fleet.Host, id string) (verdict.HostStatus, error) {
	ctx, cancel := context.WithTimeout(hs.ctx, 15*time.Second)
	defer cancel()
	conn, err := hs.pool.Conn(ctx, host)
	if err != nil {
		return verdict.HostStatus{}, err
	}
	cc, err := hostproto.DialControl(conn)
	if err != nil {
		hs.pool.Invalidate(host, conn)
		return verdict.HostStatus{}, err
	}
	defer cc.Close()
	report, err := cc.StatusReport(ctx, []string{id})
	if err != nil {
		hs.pool.Invalidate(host, conn)
		return verdict.HostStatus{}, err
	}
	st := verdict.HostStatus{Retention: report.MarkerRetention}
	for _, m := range report.Markers {
		if m.ID == id {
			st.Marker = m
		}
	}
	return st, nil
}

// guaranteeOf is the guarantee level of rec's host as enrolled now: "" for an HTTP execution
// or a host no longer enrolled.
func guaranteeOf(inv *fleet.Inventory, rec *markers.Record) fleet.Guarantee {
	if rec.Channel == "http" {
		return ""
	}
	host, err := inv.Host(rec.Host)
	if err != nil {
		return ""
	}
	return host.Level()
}

// hostOf is the host rec ran on, reached as the account rec ran as: the hostagent keeps an
// execution's marker for its account (and actor), so asking about it, cancelling it or
// reading its output goes over that account's connection (fleet.Host.As).
func hostOf(inv *fleet.Inventory, rec *markers.Record) (fleet.Host, error) {
	host, err := inv.Host(rec.Host)
	if err != nil {
		return host, err
	}
	return host.As(rec.Account), nil
}
