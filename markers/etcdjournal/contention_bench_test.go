package etcdjournal_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/etcdtest"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/etcdjournal"
)

// BenchmarkChainContention is P3's journal half on a 3-member etcd: 48 writers, spread over
// 1 or 3 replicas (journals with a client each on one prefix), each op one execution's two
// chain writes (the acceptance and the outcome). It reports, per op, the chain transactions
// sent and those that lost the head to another replica — counts that do not depend on how
// busy the machine is, unlike ns/op — and verifies the chain at the end. Run it with
// -benchtime 600x or so.
func BenchmarkChainContention(b *testing.B) {
	c := etcdtest.Start(b, 3)
	signer, verifier, err := markers.LoadOrCreateAuditKey(filepath.Join(b.TempDir(), "audit.key"), "postern-test")
	if err != nil {
		b.Fatal(err)
	}
	const writers = 48
	var round atomic.Int64
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			prefix := fmt.Sprintf("/bench%d/", round.Add(1))
			var js []*etcdjournal.Journal
			for i := range n {
				j, err := etcdjournal.Open(etcdjournal.Options{Client: c.Client(), Prefix: prefix, Replica: fmt.Sprintf("r%d", i),
					OpTimeout: 10 * time.Second, Markers: markers.Options{Signer: signer, Logger: slog.New(slog.DiscardHandler)}})
				if err != nil {
					b.Fatal(err)
				}
				js = append(js, j)
			}
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for w := range writers {
				j := js[w%n]
				wg.Go(func() {
					for {
						k := next.Add(1)
						if k > int64(b.N) {
							return
						}
						id := fmt.Sprintf("01JBENCH%018d", k)
						if _, err := j.CreateFor(ctx, newRecord(id, id), &markers.Call{Transport: "http", Match: "new"}); err != nil {
							b.Error(err)
							return
						}
						if _, err := j.AdvanceWithResult(ctx, id, markers.Accepted, []markers.State{markers.Failed}, "no host", []byte(`{"stdout":""}`), nil); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			var sent, lost uint64
			for _, j := range js {
				s, l := j.ChainTxns()
				sent, lost = sent+s, lost+l
			}
			b.ReportMetric(float64(sent)/float64(b.N), "txns/op")
			b.ReportMetric(float64(lost)/float64(b.N), "lost-head/op")
			var buf bytes.Buffer
			if err := js[0].Export(&buf); err != nil {
				b.Fatal(err)
			}
			if rep, err := markers.VerifyJSONL(&buf, verifier, markers.VerifyOptions{}); err != nil || !rep.OK {
				b.Fatalf("verify: %v %v", rep, err)
			}
			for _, j := range js {
				j.Close()
			}
		})
	}
}
