package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/markers"
)

// The journal's retention (docs/design.md, "Retention"): the pass itself is the journal's
// (markers.JournalStore.GC, with the rules bastion/journal sets from the action classes);
// the engine runs it every retention_interval — with replicas, on the elected one only —
// and when an operator asks (`postern journal gc`), one at a time, and reports it in
// /metrics and to `postern doctor`.

// retention runs the passes of one engine.
type retention struct {
	// mu is held for a pass: one at a time in this engine.
	mu   sync.Mutex
	last atomic.Pointer[api.RetentionPass]
}

// backendTimeout bounds a look at the journal backend's size for doctor and /metrics.
const backendTimeout = 3 * time.Second

// RetentionPass runs the journal's retention pass now (dryRun: counts what it would remove,
// changes nothing), after any pass in progress.
func (b *Engine) RetentionPass(ctx context.Context, dryRun bool) (*api.RetentionPass, error) {
	if b.readOnly && !dryRun {
		return nil, errReadOnly
	}
	b.retention.mu.Lock()
	defer b.retention.mu.Unlock()
	p := &api.RetentionPass{StartedAt: b.now().UTC()}
	res, err := b.journal.GC(ctx, markers.GCOptions{DryRun: dryRun})
	p.GCResult, p.Seconds = res, time.Since(p.StartedAt).Seconds()
	if err != nil {
		p.Error = err.Error()
	}
	if !dryRun {
		b.metrics.retention.observe(p)
		b.retention.last.Store(p)
	}
	log := b.log.Info
	if err != nil {
		log = b.log.Error
	}
	log("retention pass", "dry_run", dryRun, "removed", res.Records, "kept", res.Kept, "tombstones", res.Tombstones,
		"tombstones_expired", res.TombstonesExpired, "runs", res.Runs, "events_pruned", res.Events, "carried", res.Carried, "chain_base", res.BaseSeq,
		"bytes_before", res.BytesBefore, "bytes_after", res.BytesAfter, "seconds", p.Seconds, "err", err)
	if err != nil {
		return p, journalError(err)
	}
	return p, nil
}

// retentionLoop runs the pass every retention_interval until the engine closes; with
// replicas only while this one is elected (the others' passes would only race its own).
func (b *Engine) retentionLoop() {
	if b.cfg.RetentionInterval <= 0 {
		return
	}
	t := time.NewTicker(b.cfg.RetentionInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		if r := b.replicas(); r != nil && !r.Leading() {
			continue
		}
		b.RetentionPass(b.ctx, false) // logged; the next tick tries again
	}
}

// journalHealth is the journal's backend and retention as doctor reports them.
func (b *Engine) journalHealth(ctx context.Context) *api.JournalHealth {
	ctx, cancel := context.WithTimeout(ctx, backendTimeout)
	defer cancel()
	h := &api.JournalHealth{RetentionInterval: b.cfg.RetentionInterval, LastPass: b.retention.last.Load()}
	st, err := b.journal.Backend(ctx)
	h.BackendStatus = st
	if err != nil {
		h.Error = err.Error()
	}
	return h
}

// retentionMetrics are the retention passes' series and the journal backend's size.
type retentionMetrics struct {
	passes    *prometheus.CounterVec // by result
	removed   *prometheus.CounterVec // by what
	reclaimed prometheus.Counter
	lastPass  prometheus.Gauge
	seconds   prometheus.Gauge
}

func newRetentionMetrics() *retentionMetrics {
	return &retentionMetrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_retention_passes_total", Help: "Retention passes of the journal run by this bastion, by result (ok, error)."}, []string{"result"}),
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_retention_removed_total", Help: "What retention passes removed: executions, runs, tombstones (expired) and events (the chain's pruned prefix)."}, []string{"what"}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postern_retention_reclaimed_bytes_total", Help: "Backend bytes retention passes freed (Pebble: on disk; etcd: in use, before defragmentation)."}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postern_retention_last_pass_timestamp_seconds", Help: "When this bastion's last retention pass that succeeded started (Unix time)."}),
		seconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postern_retention_last_pass_seconds", Help: "How long this bastion's last retention pass took."}),
	}
}

func (m *retentionMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.passes, m.removed, m.reclaimed, m.lastPass, m.seconds}
}

func (m *retentionMetrics) observe(p *api.RetentionPass) {
	m.seconds.Set(p.Seconds)
	m.removed.WithLabelValues("executions").Add(float64(p.Records))
	m.removed.WithLabelValues("runs").Add(float64(p.Runs))
	m.removed.WithLabelValues("tombstones").Add(float64(p.TombstonesExpired))
	m.removed.WithLabelValues("events").Add(float64(p.Events))
	if d := p.BytesBefore - p.BytesAfter; d > 0 && p.Error == "" {
		m.reclaimed.Add(float64(d))
	}
	if p.Error != "" {
		m.passes.WithLabelValues("error").Inc()
		return
	}
	m.passes.WithLabelValues("ok").Inc()
	m.lastPass.Set(float64(p.StartedAt.Unix()))
}

// journalBackend reports the journal backend's size, quota and alarms at scrape time.
type journalBackend struct{ b *Engine }

var (
	journalBytesDesc = prometheus.NewDesc("postern_journal_backend_bytes",
		"The journal backend's size: Pebble, on disk; etcd, the largest member's database file (what its quota counts).", nil, nil)
	journalInUseDesc = prometheus.NewDesc("postern_journal_backend_in_use_bytes",
		"etcd: the largest member's logical size in use (the rest of the file is free space only a defragmentation returns).", nil, nil)
	journalQuotaDesc = prometheus.NewDesc("postern_journal_backend_quota_bytes",
		"etcd: the members' backend quota as configured ([journal] quota_bytes).", nil, nil)
	journalAlarmDesc = prometheus.NewDesc("postern_journal_backend_alarm",
		"etcd: 1 for each active alarm (NOSPACE: the quota was reached and every write fails; see docs/replicas.md).", []string{"alarm"}, nil)
	journalChainDesc = prometheus.NewDesc("postern_journal_chain_events",
		"Events the journal's hash chain holds (after the prefix retention pruned).", nil, nil)
)

func (c journalBackend) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{journalBytesDesc, journalInUseDesc, journalQuotaDesc, journalAlarmDesc, journalChainDesc} {
		ch <- d
	}
}

func (c journalBackend) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(c.b.ctx, backendTimeout)
	defer cancel()
	st, err := c.b.journal.Backend(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(journalBytesDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(journalBytesDesc, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(journalChainDesc, prometheus.GaugeValue, float64(st.HeadSeq-st.BaseSeq))
	if st.Backend != "etcd" {
		return
	}
	ch <- prometheus.MustNewConstMetric(journalInUseDesc, prometheus.GaugeValue, float64(st.InUseBytes))
	ch <- prometheus.MustNewConstMetric(journalQuotaDesc, prometheus.GaugeValue, float64(st.QuotaBytes))
	for _, a := range st.Alarms {
		ch <- prometheus.MustNewConstMetric(journalAlarmDesc, prometheus.GaugeValue, 1, a)
	}
}
