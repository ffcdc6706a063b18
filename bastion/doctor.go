package bastion

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/version"
)

// DoctorReport is what the running bastion can tell `postern doctor`: its own build and,
// for every enrolled host, whether it answers with its pinned host key and which hostagent
// build it runs.
type DoctorReport struct {
	Version string       `json:"version"`
	Hosts   []HostHealth `json:"hosts"`
}

// HostHealth is one enrolled host, asked now.
type HostHealth struct {
	Name    string `json:"name"`
	Addr    string `json:"addr"`
	OK      bool   `json:"ok"`
	Version string `json:"version,omitempty"`
	// Protocol is the host protocol version the bastion's connection to it speaks
	// (hostproto.Version of the older side).
	Protocol int `json:"protocol,omitempty"`
	// Guarantee is set for hosts without the hostagent (no version to report).
	Guarantee Guarantee `json:"guarantee,omitempty"`
	// Problem and Fix say what is wrong and what to do about it (empty when OK).
	Problem string `json:"problem,omitempty"`
	Fix     string `json:"fix,omitempty"`
}

// hostAskTimeout bounds how long the doctor waits for one host.
const hostAskTimeout = 10 * time.Second

// placeholderID is a well-formed execution id no host has: asking for it is a status round
// trip that reports the host's version and changes nothing.
const placeholderID = "ex_00000000000000000000000000"

// Doctor asks every enrolled host, in parallel, over the pooled connection (strict host key
// checking against the pinned key).
func (b *Bastion) Doctor(ctx context.Context) (*DoctorReport, error) {
	hosts, err := b.inv.Hosts()
	if err != nil {
		return nil, err
	}
	rep := &DoctorReport{Version: version.String(), Hosts: make([]HostHealth, len(hosts))}
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

func (b *Bastion) hostHealth(ctx context.Context, h Host) HostHealth {
	hh := HostHealth{Name: h.Name, Addr: h.Addr}
	if h.Level() != GuaranteeHostagent {
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
	case errors.Is(err, ErrHostKeyMismatch):
		hh.Fix = fmt.Sprintf("the host presents another key than the one enrolled: check it on the host (ssh-keygen -lf its host key), then `postern hosts enroll %s %s --replace`", h.Name, h.Addr)
	case strings.Contains(msg, "unable to authenticate"):
		hh.Fix = fmt.Sprintf("the hostagent on %s does not accept the bastion's key: append the line `postern hosts key` prints to its authorized_keys file, and check that %s is in its allowed_accounts", h.Name, h.Account)
	default:
		hh.Fix = fmt.Sprintf("is postern-hostagent running on %s (systemctl status postern-hostagent) and listening on %s? Check the address with `postern hosts list`, and that no firewall is in the way", h.Name, h.Addr)
	}
	return hh
}
