package integration

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// BenchmarkReplicasP1P3 is P1 and P3 in HA mode against a single node, in one run: a
// single `postern serve` on Pebble, and three replicas on a 3-member etcd cluster on this
// machine (members, replicas, hostagents and callers share its cores). P1: the latency of one
// `true` through replica 0, interleaved with the single node's. P3: 64 MCP callers running
// `true` as new intents, spread over the three replicas (a load balancer's round robin),
// alternating rounds with 64 callers on the single node. Goals: P1 ≤ 2× single node, P3 ≥
// 0.5× single node. Run with -benchtime 1x.
func BenchmarkReplicasP1P3(b *testing.B) {
	single, _ := benchFleet(b)
	ha := startHAFleet(b, 3)
	ctx := context.Background()

	singleCS := single.Connect(b, "agent", nil)
	haCS := ha.replicas[0].Connect(b, "agent", nil)
	calls := 0
	sides := []*benchSide{
		{name: "single node (Pebble)", call: func() error { calls++; return execTrue(ctx, singleCS, "p1-"+strconv.Itoa(calls)) }},
		{name: "HA (replica 0 of 3, 3-member etcd)", call: func() error { calls++; return execTrue(ctx, haCS, "p1-"+strconv.Itoa(calls)) }},
	}
	sampleInterleaved(b, sides, execSamples, execBlock, func() string { return "replica 0 log:\n" + ha.replicas[0].Logs() })
	p50 := func(i int) float64 { return ms(testutil.Percentile(sides[i].took, 0.5)) }
	p99 := func(i int) float64 { return ms(testutil.Percentile(sides[i].took, 0.99)) }

	rt := &http.Transport{MaxIdleConns: concurrentCallers, MaxIdleConnsPerHost: concurrentCallers}
	defer rt.CloseIdleConnections()
	singleSessions := make([]*mcp.ClientSession, concurrentCallers)
	haSessions := make([]*mcp.ClientSession, concurrentCallers)
	for i := range concurrentCallers {
		singleSessions[i] = harness.ConnectMCP(b, single.URL, single.HTTPClient("agent", nil, rt), nil)
		r := ha.replicas[i%len(ha.replicas)]
		haSessions[i] = harness.ConnectMCP(b, r.URL, r.HTTPClient("agent", nil, rt), nil)
	}
	var runs atomic.Int64
	on := func(sessions []*mcp.ClientSession) func(int) error {
		return func(w int) error { return execTrue(ctx, sessions[w], "p3-"+strconv.FormatInt(runs.Add(1), 10)) }
	}
	for _, f := range []func(int) error{on(singleSessions), on(haSessions)} {
		if _, err := hammer(concurrentCallers, concurrentCallers, f); err != nil { // warm up
			b.Fatal(err)
		}
	}
	cli := ha.etcd.Client()
	dbSize := func() int64 {
		st, err := cli.Status(ctx, ha.etcd.Endpoints()[0])
		if err != nil {
			b.Fatal(err)
		}
		return st.DbSize
	}
	before := dbSize()
	var singleLoad, haLoad load
	b.ResetTimer()
	for range concurrentRounds {
		for _, side := range []struct {
			f   func(int) error
			out *load
		}{{on(singleSessions), &singleLoad}, {on(haSessions), &haLoad}} {
			got, err := hammer(concurrentCallers, concurrentCalls/concurrentRounds, side.f)
			if err != nil {
				b.Fatalf("%v\nreplica 0 log:\n%s", err, ha.replicas[0].Logs())
			}
			side.out.add(got)
		}
	}
	b.StopTimer()
	// What an execution costs etcd's backend before compaction (every revision of every key
	// it wrote: the etcd quota counts these until compacted), and after compaction and
	// defragmentation (its live keys).
	grown := dbSize() - before
	st, err := cli.Status(ctx, ha.etcd.Endpoints()[0])
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cli.Compact(ctx, st.Header.Revision); err != nil {
		b.Fatal(err)
	}
	for _, ep := range ha.etcd.Endpoints() {
		if _, err := cli.Defragment(ctx, ep); err != nil {
			b.Fatal(err)
		}
	}
	executions := float64(haLoad.calls + concurrentCallers + len(sides[1].took))
	b.ReportMetric(float64(grown)/float64(haLoad.calls), "etcd-bytes/exec-uncompacted")
	b.ReportMetric(float64(dbSize())/executions, "etcd-bytes/exec-live")
	b.ReportMetric(p50(0), "single-p1-p50-ms")
	b.ReportMetric(p50(1), "ha-p1-p50-ms")
	b.ReportMetric(p50(1)/p50(0), "p1-ha/single")
	b.ReportMetric(singleLoad.rate(), "single-p3-execs/s")
	b.ReportMetric(haLoad.rate(), "ha-p3-execs/s")
	b.ReportMetric(haLoad.rate()/singleLoad.rate(), "p3-ha/single")
	table(b, fmt.Sprintf("P1: ssh_exec `true`, %d samples each, alternating blocks of %d (goal: HA ≤ 2× single)", execSamples, execBlock),
		[]string{"", "p50 ms", "p99 ms"},
		[]string{sides[0].name, f2(p50(0)), f2(p99(0))},
		[]string{sides[1].name, f2(p50(1)), f2(p99(1))},
		[]string{"HA / single", f2(p50(1) / p50(0)), f2(p99(1) / p99(0))})
	table(b, fmt.Sprintf("P3: %d concurrent callers, %d calls each side in %d alternating rounds (goal: HA ≥ 0.5× single)", concurrentCallers, concurrentCalls, concurrentRounds),
		[]string{"", "execs/s", "p50 ms", "p99 ms"},
		[]string{"single node (Pebble)", f0(singleLoad.rate()), f2(ms(singleLoad.p(0.5))), f2(ms(singleLoad.p(0.99)))},
		[]string{"HA (3 replicas, 3-member etcd)", f0(haLoad.rate()), f2(ms(haLoad.p(0.5))), f2(ms(haLoad.p(0.99)))},
		[]string{"HA / single", f2(haLoad.rate() / singleLoad.rate()), f2(float64(haLoad.p(0.5)) / float64(singleLoad.p(0.5))), f2(float64(haLoad.p(0.99)) / float64(singleLoad.p(0.99)))})
}

// BenchmarkPooledSSHConnMemory is the memory (heap and goroutine stacks) one idle pooled
// SSH connection holds on the bastion side (x/crypto/ssh, as the pool dials them): for the
// README's hosts-per-replica math. Run with -benchtime 1x.
func BenchmarkPooledSSHConnMemory(b *testing.B) {
	h := harness.StartHostagent(b)
	const conns = 50
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse + m.StackInuse // its goroutines too
	}
	before := heap()
	for range conns {
		h.Dial(b) // closed at cleanup
	}
	b.ReportMetric(float64(heap()-before)/conns/1024, "KiB/conn")
}
