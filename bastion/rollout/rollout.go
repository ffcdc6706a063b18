// Package rollout decides how a fleet run proceeds (docs/fleet.md): which hosts its targets
// select, how many of them run at once, and when errors stop it from starting more — the
// brakes of a rollout, as AWS SSM Run Command's MaxConcurrency and MaxErrors. Everything
// here is a pure function of what the journal shows, so a run driven again after a crash
// or a failover decides exactly as before.
package rollout

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/postern-dev/postern/markers"
)

// Limit is a max_concurrency or max_errors: a count, or a percentage of the run's hosts.
type Limit struct {
	N       int
	Percent bool
}

// String is the limit as it was written ("20", "25%").
func (l Limit) String() string {
	if l.Percent {
		return strconv.Itoa(l.N) + "%"
	}
	return strconv.Itoa(l.N)
}

// ParseLimit reads "N" (0 or more) or "P%" (0-100).
func ParseLimit(s string) (Limit, error) {
	num, pct := strings.CutSuffix(strings.TrimSpace(s), "%")
	n, err := strconv.Atoi(num)
	switch {
	case err != nil || n < 0:
		return Limit{}, fmt.Errorf("%q: want a count (20) or a percentage (25%%)", s)
	case pct && n > 100:
		return Limit{}, fmt.Errorf("%q: a percentage is at most 100%%", s)
	}
	return Limit{N: n, Percent: pct}, nil
}

// Of is the limit for a run of total hosts: a percentage rounds down.
func (l Limit) Of(total int) int {
	if l.Percent {
		return total * l.N / 100
	}
	return l.N
}

// Concurrency is how many hosts of a run of total may run at once under l: at least one
// (a run always makes progress), at most total.
func Concurrency(l Limit, total int) int {
	return max(1, min(l.Of(total), total))
}

// Host is what targets are matched against.
type Host struct {
	Name   string
	Groups []string
	Labels map[string]string
}

// Target kinds, as written in a fleet run's targets.
const (
	groupPrefix = "group:"
)

// Select resolves targets to host names, sorted: each target is a host's name,
// "group:NAME" (the hosts in that group), or labels "k=v[,k=v…]" (the hosts that carry all
// of them). The union is taken; a target that selects nothing is an error, so a typo never
// runs a rollout on fewer hosts than meant.
func Select(targets []string, hosts []Host) ([]string, error) {
	if len(targets) == 0 {
		return nil, errors.New("targets: name at least one host, group:NAME or labels k=v")
	}
	chosen := map[string]bool{}
	var errs []error
	for _, t := range targets {
		match, err := matcher(t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n := 0
		for _, h := range hosts {
			if match(h) {
				chosen[h.Name] = true
				n++
			}
		}
		if n == 0 {
			errs = append(errs, fmt.Errorf("target %q selects no enrolled host", t))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(chosen)), nil
}

// Canonical is targets as a fleet run's identity holds them: each trimmed, the pairs of a
// labels target sorted ("env=prod,role=db"), duplicates removed, sorted. Two calls whose
// targets say the same thing are the same intent; Select gives the same hosts for both.
func Canonical(targets []string) ([]string, error) {
	out := make([]string, 0, len(targets))
	for _, t := range targets {
		t = strings.TrimSpace(t)
		if _, err := matcher(t); err != nil {
			return nil, err
		}
		if !strings.HasPrefix(t, groupPrefix) && strings.Contains(t, "=") {
			pairs := strings.Split(t, ",")
			for i, kv := range pairs {
				k, v, _ := strings.Cut(kv, "=")
				pairs[i] = strings.TrimSpace(k) + "=" + strings.TrimSpace(v)
			}
			slices.Sort(pairs)
			t = strings.Join(slices.Compact(pairs), ",")
		}
		out = append(out, t)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// matcher is what one target selects.
func matcher(t string) (func(Host) bool, error) {
	switch {
	case strings.HasPrefix(t, groupPrefix):
		g := strings.TrimPrefix(t, groupPrefix)
		if g == "" {
			return nil, fmt.Errorf("target %q: name the group (group:db)", t)
		}
		return func(h Host) bool { return slices.Contains(h.Groups, g) }, nil
	case strings.Contains(t, "="):
		want := map[string]string{}
		for _, kv := range strings.Split(t, ",") {
			k, v, ok := strings.Cut(kv, "=")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if !ok || k == "" || v == "" {
				return nil, fmt.Errorf("target %q: want labels as k=v,k=v", t)
			}
			if old, dup := want[k]; dup && old != v {
				return nil, fmt.Errorf("target %q: label %s given twice", t, k)
			}
			want[k] = v
		}
		return func(h Host) bool {
			for k, v := range want {
				if h.Labels[k] != v {
					return false
				}
			}
			return true
		}, nil
	case t == "":
		return nil, errors.New("targets: an empty target")
	}
	return func(h Host) bool { return h.Name == t }, nil
}

// Progress is a fleet run as the journal shows it: how many of its hosts have an execution
// (Started), how many of those have not ended (Running), and how the ended ones ended.
type Progress struct {
	Total, Started, Running int
	// Succeeded ended completed with exit status 0; Failed ended any other way (a non-zero
	// exit, a signal, not run, rejected, cancelled) or are unknown with review required: a
	// brake counts what it cannot vouch for.
	Succeeded, Failed int
	// Cancelled: someone cancelled the run.
	Cancelled bool
}

// Add counts one started host by its execution's journal state. An unknown outcome that
// Postern still asks the host about is running — the command may be, so it keeps its slot
// and max_concurrency holds on the hosts —; one that only an operator's review settles has
// ended for the brakes, as a failure.
func (p *Progress) Add(state markers.State, isError, reviewRequired bool) {
	p.Started++
	switch {
	case state == markers.Unknown && reviewRequired:
		p.Failed++
	case !markers.JournalGraph.Terminal(state):
		p.Running++
	case state == markers.Completed && !isError:
		p.Succeeded++
	default:
		p.Failed++
	}
}

// Outcome is how a fleet run ended.
type Outcome string

const (
	// Completed: every host ran it and succeeded.
	Completed Outcome = "completed"
	// Failed: every host was started and at least one failed.
	Failed Outcome = "failed"
	// Stopped: max_errors was exceeded, so some hosts were never started.
	Stopped Outcome = "stopped"
	// Cancelled: the run was cancelled: hosts not started never will be, running ones were
	// asked to stop.
	Cancelled Outcome = "cancelled"
)

// Step is what the driver of a fleet run does next.
type Step struct {
	// Start is how many more hosts to start now (in the run's host order).
	Start int
	// Braked: no new host is started any more (cancelled, or max_errors exceeded); the
	// running ones finish.
	Braked bool
	// Done: nothing runs and nothing more will start; Outcome says how it ended.
	Done    bool
	Outcome Outcome
}

// Next decides the next step of a run from its progress, its max_concurrency (already
// Concurrency-resolved) and its max_errors (the number of failed hosts it tolerates: one
// more stops it, so 0 stops at the first failure).
func Next(p Progress, concurrency, maxErrors int) Step {
	braked := p.Cancelled || p.Failed > maxErrors
	var s Step
	if braked {
		s.Braked = true
	} else {
		s.Start = max(0, min(concurrency-p.Running, p.Total-p.Started))
	}
	if p.Running > 0 || s.Start > 0 {
		return s
	}
	s.Done = true
	switch {
	case p.Cancelled:
		s.Outcome = Cancelled
	case braked && p.Started < p.Total:
		s.Outcome = Stopped
	case p.Failed > 0:
		s.Outcome = Failed
	default:
		s.Outcome = Completed
	}
	return s
}
