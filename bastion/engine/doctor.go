package engine

import (
	"context"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/version"
)

// hostAskTimeout bounds how long the doctor waits for one host.
const hostAskTimeout = 10 * time.Second

// placeholderID is a well-formed execution id no host has: asking for it is a status round
// trip that reports the host's version and changes nothing.
const placeholderID = "ex_00000000000000000000000000"

// Doctor asks every enrolled host, in parallel, over the pooled connection (strict host key
// checking against the pinned key), and the journal's backend for its size and alarms.
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
			rep.Hosts[i] = b.hosts.health(ctx, h)
		})
	}
	wg.Go(func() { rep.Journal = b.journalHealth(ctx) })
	wg.Wait()
	return rep, nil
}
