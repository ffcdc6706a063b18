package engine

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/postern-dev/postern/markers"
)

// metrics are the bastion's Prometheus series. Labels are bounded sets (states, codes,
// reasons) — never ids, hosts' secrets or commands.
type metrics struct {
	registry        *prometheus.Registry
	accepted        prometheus.Counter
	dispatched      prometheus.Counter
	dedup           *prometheus.CounterVec // by how the call was matched
	rejected        *prometheus.CounterVec // calls refused before acceptance, by code
	finished        *prometheus.CounterVec // outcomes journaled, by state
	reconciled      *prometheus.CounterVec // host answers during reconciliation
	journalErrors   prometheus.Counter
	approvals       *prometheus.CounterVec // operator decisions and timeouts, by resulting state
	announced       *prometheus.CounterVec // approval requests announced to the webhook, by result
	queued          prometheus.Counter     // executions that waited for a concurrency slot
	dispatchLatency prometheus.Histogram   // dispatch to the host's start confirmation
	retention       *retentionMetrics      // retention.go
	refusals        *prometheus.CounterVec // connections and requests refused by the transports, by where and why
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postern_executions_accepted_total", Help: "Executions accepted (journaled) by the bastion."}),
		dispatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postern_executions_dispatched_total", Help: "First dispatches of executions to hosts."}),
		dedup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_dedup_hits_total", Help: "Calls answered from an existing execution instead of a new one."}, []string{"by"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_calls_rejected_total", Help: "Calls refused before an execution was accepted."}, []string{"code"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_execution_outcomes_total", Help: "Outcomes journaled, by state."}, []string{"state"}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_reconcile_outcomes_total", Help: "What hosts answered when asked about an execution in flight."}, []string{"answer"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_approval_decisions_total", Help: "Approvals decided (authorized) or rejected, by resulting state."}, []string{"state"}),
		announced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_approval_announcements_total", Help: "Approval requests announced to the [approvals] webhook, by result (sent, failed, dropped)."}, []string{"result"}),
		queued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postern_executions_queued_total", Help: "Authorized executions that waited for their actor's max_concurrent slot before dispatch."}),
		journalErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postern_journal_errors_total", Help: "Journal writes that failed (the execution stopped where it was)."}),
		dispatchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "postern_dispatch_seconds", Help: "Time from dispatch to the host's marker confirming the start.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postern_refusals_total", Help: "Connections and requests the transports refused, by where (http, mcp_socket, operator_socket) and reason; their log lines are rate-limited, these count every one."}, []string{"where", "reason"}),
	}
	m.retention = newRetentionMetrics()
	m.registry.MustRegister(m.accepted, m.dispatched, m.dedup, m.rejected, m.finished, m.reconciled,
		m.journalErrors, m.approvals, m.announced, m.queued, m.dispatchLatency, m.refusals,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registry.MustRegister(m.retention.collectors()...)
	return m
}

// CountRefusal counts one connection or request a transport refused
// (postern_refusals_total). where and reason are the transport's constants, a closed set.
func (b *Engine) CountRefusal(where, reason string) {
	b.metrics.refusals.WithLabelValues(where, reason).Inc()
}

// MetricsHandler serves /metrics.
func (b *Engine) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(b.metrics.registry, promhttp.HandlerOpts{})
}

// inFlight counts the executions in each non-terminal state from the journal's state index
// at scrape time (terminal outcomes are counted as they happen by postern_execution_outcomes_total).
type inFlight struct{ b *Engine }

var inFlightDesc = prometheus.NewDesc("postern_executions", "Executions in each non-terminal journal state (counted up to 100000).", []string{"state"}, nil)

const maxCounted = 100000

func (c inFlight) Describe(ch chan<- *prometheus.Desc) { ch <- inFlightDesc }

func (c inFlight) Collect(ch chan<- prometheus.Metric) {
	for _, st := range markers.JournalGraph.States() {
		if markers.JournalGraph.Terminal(st) {
			continue
		}
		n, cursor := 0, ""
		for n < maxCounted {
			recs, next, err := c.b.journal.List(markers.Query{State: st, Limit: 1000, Cursor: cursor})
			if err != nil {
				ch <- prometheus.NewInvalidMetric(inFlightDesc, err)
				return
			}
			n += len(recs)
			if next == "" {
				break
			}
			cursor = next
		}
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(n), string(st))
	}
}
