package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/version"
)

// hostAskTimeout bounds how long the doctor waits for one host.
const hostAskTimeout = 10 * time.Second

// placeholderID is a well-formed execution id no host has: asking for it is a status round
// trip that reports the host's version and changes nothing.
const placeholderID = "ex_00000000000000000000000000"

// Doctor asks every enrolled host, in parallel, over the pooled connection (strict host key
// checking against the pinned key).
func (b *Engine) Doctor(ctx context.Context) (*api.DoctorReport, error) {
	hosts, err := b.inv.Hosts()
	if err != nil {
		return nil, err
	}
	rep := &api.DoctorReport{Version: version.String(), Hosts: make([]api.HostHealth, len(hosts))}
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, hostAskTimeout)
			defer cancel()
			rep.Hosts[i] = b.hostHealth(ctx, h)
		})
	}
	wg.Wait()
	return rep, nil
}

func (b *Engine) hostHealth(ctx context.Context, h fleet.Host) api.HostHealth {
	hh := api.HostHealth{Name: h.Name, Addr: h.Addr}
	if h.Level() != fleet.GuaranteeHostagent {
		return b.stockHealth(ctx, h) // agentless.go
	}
	conn, err := b.pool.Conn(ctx, h)
	if err == nil {
		var cc *hostproto.ControlClient
		if cc, err = hostproto.DialControl(conn); err == nil {
			defer cc.Close()
			var st hostproto.StatusReport
			if st, err = cc.StatusReport(ctx, []string{placeholderID}); err == nil {
				hh.OK, hh.Version, hh.Protocol = true, st.Version, b.pool.Protocol(h.Name)
				if hh.Version == "" {
					hh.Version = "(older than the version report)"
				}
				return hh
			}
		}
	}
	hh.Problem = err.Error()
	switch msg := err.Error(); {
	case errors.Is(err, fleet.ErrHostKeyMismatch):
		hh.Fix = fmt.Sprintf("the host presents another key than the one enrolled: check it on the host (ssh-keygen -lf its host key), then `postern hosts enroll %s %s --replace`", h.Name, h.Addr)
	case strings.Contains(msg, "unable to authenticate"):
		hh.Fix = fmt.Sprintf("the hostagent on %s does not accept the bastion's key: append the line `postern hosts key` prints to its authorized_keys file, and check that %s is in its allowed_accounts", h.Name, h.Account)
	default:
		hh.Fix = fmt.Sprintf("is postern-hostagent running on %s (systemctl status postern-hostagent) and listening on %s? Check the address with `postern hosts list`, and that no firewall is in the way", h.Name, h.Addr)
	}
	return hh
}
