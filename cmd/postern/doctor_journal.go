package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/journal"
)

// quotaWarn is the share of the etcd quota past which doctor calls the journal's size a
// problem: at the quota every write fails (NOSPACE), so act well before.
const quotaWarn = 0.8

// offlineJournalHealth reads the journal's backend while the daemon is down (read-only).
func offlineJournalHealth(ctx context.Context, cfg config.Config) *api.JournalHealth {
	h := &api.JournalHealth{RetentionInterval: cfg.RetentionInterval}
	jl, err := journal.OpenReadOnly(cfg, quiet)
	if err != nil {
		h.Error = err.Error()
		return h
	}
	defer jl.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h.BackendStatus, err = jl.Backend(ctx)
	if err != nil {
		h.Error = err.Error()
	}
	return h
}

// journalChecks are doctor's findings on the journal: its size (on etcd against the quota),
// the etcd alarms with their fix, and the retention pass.
func journalChecks(h *api.JournalHealth) []doctorCheck {
	if h.Error != "" {
		return []doctorCheck{{Check: "journal", Status: "problem", Detail: "its backend could not be asked: " + h.Error,
			Fix: "see the daemon's log; with etcd, whether the members answer (etcdctl endpoint status)"}}
	}
	var out []doctorCheck
	chain := fmt.Sprintf("its chain holds events %d..%d", h.BaseSeq+1, h.HeadSeq)
	if h.BaseSeq > 0 {
		chain += fmt.Sprintf(" (1..%d pruned by retention)", h.BaseSeq)
	}
	switch h.Backend {
	case "etcd":
		use := float64(h.Bytes) / float64(max(h.QuotaBytes, 1))
		detail := fmt.Sprintf("etcd, %s of its %s quota (%.0f%%; %s in use, the rest free space a defragmentation returns); %s",
			formatBytes(h.Bytes), formatBytes(h.QuotaBytes), 100*use, formatBytes(h.InUseBytes), chain)
		for _, m := range h.Members {
			if m.Error != "" {
				detail += fmt.Sprintf("; member %s did not answer: %s", m.Endpoint, m.Error)
			}
		}
		switch {
		case slices.Contains(h.Alarms, "NOSPACE"):
			out = append(out, doctorCheck{Check: "journal", Status: "problem",
				Detail: detail + "; alarm NOSPACE: the quota was reached and etcd refuses every write — a retention pass's too —, so every call fails closed",
				Fix: "make room first: on each member in turn, etcdctl --endpoints=URL defrag if it has free space, else restart it with a larger --quota-backend-bytes (at most 8 GiB); " +
					"then etcdctl alarm disarm, postern journal gc (shorten the classes' retention if the steady state does not fit), defragment again, and set [journal] quota_bytes " +
					"(docs/operations.md, Retention and capacity)"})
		case len(h.Alarms) > 0:
			out = append(out, doctorCheck{Check: "journal", Status: "problem", Detail: detail + "; alarms: " + strings.Join(h.Alarms, ", "),
				Fix: "see etcdctl alarm list and the members' logs (docs/replicas.md)"})
		case use >= quotaWarn:
			out = append(out, doctorCheck{Check: "journal", Status: "problem", Detail: detail,
				Fix: "at the quota every call fails closed, and a retention pass can no longer run: postern journal gc now, then defragment the members one at a time (etcdctl --endpoints=URL defrag); shorten the classes' retention or raise the quota if the steady state does not fit (docs/operations.md, Retention and capacity)"})
		default:
			out = append(out, doctorCheck{Check: "journal", Status: "ok", Detail: detail})
		}
	default:
		out = append(out, doctorCheck{Check: "journal", Status: "ok", Detail: fmt.Sprintf("%s, %s on disk; %s", h.Backend, formatBytes(h.Bytes), chain)})
	}
	return append(out, retentionCheck(h))
}

func retentionCheck(h *api.JournalHealth) doctorCheck {
	every := "no scheduled retention pass (retention_interval = \"0s\")"
	if h.RetentionInterval > 0 {
		every = "a retention pass every " + h.RetentionInterval.String()
	}
	p := h.LastPass
	switch {
	case p == nil:
		return doctorCheck{Check: "retention", Status: "note", Detail: every + "; this bastion has run none since it started (with replicas the elected one runs them)",
			Fix: "postern journal gc --dry-run shows what a pass would remove"}
	case p.Error != "":
		return doctorCheck{Check: "retention", Status: "problem", Detail: fmt.Sprintf("%s; the last one, at %s, failed: %s", every, p.StartedAt.Format(time.RFC3339), p.Error),
			Fix: "see the daemon's log; postern journal gc runs one now"}
	}
	return doctorCheck{Check: "retention", Status: "ok", Detail: fmt.Sprintf("%s; the last one, at %s, removed %d executions and pruned %d events (%s → %s)",
		every, p.StartedAt.Format(time.RFC3339), p.Records, p.Events, formatBytes(p.BytesBefore), formatBytes(p.BytesAfter))}
}
