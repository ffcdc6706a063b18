package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/markers"
)

// The history checker of the soak. It reads everything once the faults stopped and the
// bastion settled, then judges:
//
//   - outside: every line in a host's effects file and every effect the HTTP target counted
//     belongs to exactly one execution the journal knows, for the same intended call, and no
//     execution id has two effects;
//   - per intended call: at most one execution took effect (a new execution after a
//     delivered result is the matching rule's "new intent", counted apart, and only without
//     an idempotency_key);
//   - nothing lost: every execution a client saw is journaled, every journaled execution
//     belongs to an intended call and is terminal or unknown with evidence, and what a
//     client saw as final is what the journal says;
//   - journal and markers agree for every SSH execution that reached a host;
//   - the bastion's and every host's audit chains verify.

var (
	soakTagPattern = regexp.MustCompile(`soak-\d{6}`)
	execIDPattern  = regexp.MustCompile(`ex_[0-9A-Z]{26}`)
	digits         = regexp.MustCompile(`\d+`)
)

// soakHistory is everything the checker reads after the run.
type soakHistory struct {
	// journal holds every execution of the soak's actors, by id.
	journal map[string]*markers.Record
	// hostMarkers are each host's markers, by host then id.
	hostMarkers map[string]map[string]*hostproto.Marker
	// lines are each host's effects-file lines, by host then execution id (the tags written).
	lines map[string]map[string][]string
	// httpEffects counts the target's effects by Idempotency-Key; httpTags are the tags of
	// the paths requested under each key.
	httpEffects map[string]int
	httpTags    map[string]map[string]bool
	// unkeyedEffects are effects of requests without an Idempotency-Key (must be 0).
	unkeyedEffects int
}

// inFlight: states that must not remain once the bastion settled.
func inFlight(st markers.State) bool {
	switch st {
	case markers.Accepted, markers.Authorized, markers.Dispatched, markers.Running, markers.AwaitingApproval:
		return true
	}
	return false
}

// journalRecords lists the journal from the operator API (all pages).
func journalRecords(t *testing.T, b *harness.Bastion) map[string]*markers.Record {
	t.Helper()
	hc := operatorClient(b)
	defer hc.CloseIdleConnections()
	out := map[string]*markers.Record{}
	cursor := ""
	for {
		resp, err := hc.Get("http://operator/v1/executions?limit=10000&cursor=" + url.QueryEscape(cursor))
		if err != nil {
			t.Fatal(err)
		}
		var page api.ExecutionPage
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("operator list executions: %s, %v", resp.Status, err)
		}
		for _, r := range page.Executions {
			out[r.ID] = r
		}
		if page.Next == "" {
			return out
		}
		cursor = page.Next
	}
}

// waitSettled waits until no execution is in flight (bounded) and returns the journal.
func (s *soak) waitSettled(t *testing.T, within time.Duration) map[string]*markers.Record {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		j := journalRecords(t, s.fleet.bastion)
		var stuck []string
		for id, r := range j {
			if inFlight(r.State) {
				stuck = append(stuck, id+" "+string(r.State))
			}
		}
		if len(stuck) == 0 || time.Now().After(deadline) {
			return j
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitReconciled gives the bastion's reconcile loop time to ask the hosts (all up again)
// about every SSH execution left unknown because its host could not be asked, and returns
// those it did not resolve on its own.
func (s *soak) waitReconciled(t *testing.T, j map[string]*markers.Record) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var left []string
		for id, r := range j {
			if r.Channel != "http" && r.State == markers.Unknown && strings.Contains(lastEvidence(r), "could not be asked") {
				left = append(left, id)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(time.Second)
		j = journalRecords(t, s.fleet.bastion)
	}
}

// settle lets the bastion finish what is in flight, asks once more about every unknown
// execution (execution_status, as its actor: it reconciles), and reads the history.
func (s *soak) settle(t *testing.T, ctx context.Context) *soakHistory {
	t.Helper()
	j := s.waitSettled(t, 2*time.Minute)
	s.backgroundUnresolved = s.waitReconciled(t, j)
	sessions := map[string]*mcp.ClientSession{}
	for _, r := range j {
		if r.State != markers.Unknown {
			continue
		}
		actor := strings.TrimPrefix(r.Actor, "token:")
		cs := sessions[actor]
		if cs == nil {
			if r.Actor == s.localActor {
				cs = s.bridgeSession(t, ctx)
			} else {
				cs = s.fleet.bastion.Connect(t, actor, runHeader(runOf(actor)))
			}
			sessions[actor] = cs
		}
		if _, err := callExecution(ctx, cs, "execution_status", map[string]any{"execution_id": r.ID}); err != nil {
			t.Errorf("execution_status %s after the run: %v", r.ID, err)
		}
	}
	j = s.waitSettled(t, time.Minute)

	h := &soakHistory{journal: j, hostMarkers: map[string]map[string]*hostproto.Marker{},
		lines: map[string]map[string][]string{}, httpEffects: map[string]int{}, httpTags: map[string]map[string]bool{}}
	for _, host := range s.hosts {
		if host.agent == nil {
			h.hostMarkers[host.name] = stockMarkers(t, host.home)
		} else {
			h.hostMarkers[host.name] = allMarkers(t, ctx, host.agent)
		}
		h.lines[host.name] = effectLines(t, host.effects)
	}
	for _, r := range s.fleet.target.Requests() {
		if r.Key == "" {
			continue
		}
		if h.httpTags[r.Key] == nil {
			h.httpTags[r.Key] = map[string]bool{}
			h.httpEffects[r.Key] = s.fleet.target.Effects(r.Key)
		}
		h.httpTags[r.Key][soakTagPattern.FindString(r.Path)] = true
	}
	h.unkeyedEffects = s.fleet.target.Effects("")
	return h
}

// allMarkers lists every marker on the host, straight from its agent.
func allMarkers(t *testing.T, ctx context.Context, h *harness.Hostagent) map[string]*hostproto.Marker {
	t.Helper()
	cc := hostControl(t, h)
	out := map[string]*hostproto.Marker{}
	cursor := ""
	for {
		page, next, err := cc.List(ctx, hostproto.ControlListQuery{Limit: 1000, Cursor: cursor})
		if err != nil {
			t.Fatalf("list markers: %v", err)
		}
		for _, m := range page {
			out[m.ID] = m
		}
		if next == "" {
			return out
		}
		cursor = next
	}
}

// effectLines parses an effects file: "<execution id> <tag>" per line.
func effectLines(t *testing.T, path string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return out
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, tag, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Errorf("effects %s: malformed line %q", path, sc.Text())
			continue
		}
		out[id] = append(out[id], tag)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// soakVerdict accumulates violations by check, with a few examples each.
type soakVerdict struct {
	t          *testing.T
	violations map[string]int
}

func (v *soakVerdict) fail(check, format string, args ...any) {
	v.t.Helper()
	if v.violations[check]++; v.violations[check] <= 5 {
		v.t.Errorf("%s: %s", check, fmt.Sprintf(format, args...))
	}
}

// tagOf is the intended call an execution belongs to, from its command (ssh) or URL (http).
func tagOf(r *markers.Record) string { return soakTagPattern.FindString(strings.Join(r.Command, " ")) }

// tookEffect reports whether the outside world shows an effect of execution id.
func (h *soakHistory) tookEffect(id string) bool {
	if h.httpEffects[id] > 0 {
		return true
	}
	for _, lines := range h.lines {
		if len(lines[id]) > 0 {
			return true
		}
	}
	return false
}

func (s *soak) check(t *testing.T, ctx context.Context, h *soakHistory, load time.Duration) {
	t.Helper()
	v := &soakVerdict{t: t, violations: map[string]int{}}
	callByTag := map[string]*soakCall{}
	for _, c := range s.calls {
		callByTag[c.tag] = c
	}

	// Outside view: effects on the hosts.
	for host, lines := range h.lines {
		for id, tags := range lines {
			if len(tags) > 1 {
				v.fail("one effect per execution", "%s ran %d times on %s", id, len(tags), host)
			}
			r := h.journal[id]
			switch {
			case r == nil:
				v.fail("effects map to journaled executions", "%s on %s (tag %s) is not in the journal", id, host, tags[0])
			case tagOf(r) != tags[0] || r.Host != host:
				v.fail("effects map to journaled executions", "%s on %s wrote tag %s; journal: tag %s on %s", id, host, tags[0], tagOf(r), r.Host)
			}
			if _, onHost := h.hostMarkers[host][id]; !onHost {
				v.fail("effects have host markers", "%s left an effect on %s without a marker", id, host)
			}
		}
	}
	// Outside view: effects on the HTTP target.
	if h.unkeyedEffects > 0 {
		v.fail("one effect per execution", "the target performed %d effects without an Idempotency-Key", h.unkeyedEffects)
	}
	for key, n := range h.httpEffects {
		if n > 1 {
			v.fail("one effect per execution", "key %s performed %d effects", key, n)
		}
		r := h.journal[key]
		if r == nil {
			v.fail("effects map to journaled executions", "target key %s is not a journaled execution", key)
			continue
		}
		if len(h.httpTags[key]) != 1 || !h.httpTags[key][tagOf(r)] {
			v.fail("effects map to journaled executions", "key %s carried paths for tags %v; journal says %s", key, h.httpTags[key], tagOf(r))
		}
	}

	// failed means provably no effect.
	for _, r := range h.journal {
		if r.State == markers.Failed && h.tookEffect(r.ID) {
			v.fail("failed means no effect", "%s is failed (%s) but took effect", r.ID, lastEvidence(r))
		}
	}

	// Per intended call: executions and their effects.
	byTag := map[string][]*markers.Record{}
	for _, r := range h.journal {
		tag := tagOf(r)
		c := callByTag[tag]
		if c == nil || s.journalActor(c) != r.Actor {
			v.fail("executions belong to intended calls", "%s (%s, actor %s) matches no intended call of its actor", r.ID, tag, r.Actor)
			continue
		}
		byTag[tag] = append(byTag[tag], r)
	}
	var stats soakStats
	stats.unknownReasons = map[string]int{}
	stats.states = map[string]int{}
	stats.failedReasons = map[string]int{}
	for _, c := range s.calls {
		o := s.obs[c.tag]
		recs := byTag[c.tag]
		sort.Slice(recs, func(i, j int) bool { return recs[i].CreatedAt.Before(recs[j].CreatedAt) })
		var effected []*markers.Record
		for _, r := range recs {
			if h.tookEffect(r.ID) {
				effected = append(effected, r)
			}
		}
		for i := 1; i < len(effected); i++ {
			prev, next := effected[i-1], effected[i]
			if !c.keyed && prev.ResultDeliveredAt != nil && prev.ResultDeliveredAt.Before(next.CreatedAt) {
				// Only a result the client really received may start a new intent: one
				// that a dead or aborting client never saw was not delivered.
				if o.sawEnd(prev.ID) {
					stats.newIntentAfterDelivery++
					continue
				}
				if o.cancelUnsent {
					// The client's notifications/cancelled never reached a bastion.
					stats.cancelNeverArrived++
					continue
				}
				if o.clientKilled {
					// The process (or the bridge, a proxy) may have read the result before
					// it died: the limit of what a server can see.
					stats.deliveredToKilled++
					continue
				}
				stats.deliveredUnseen++
				v.fail("only a received result starts a new intent", "%s: %s was recorded delivered at %v, the client never saw it end, and %s ran again",
					c.tag, prev.ID, prev.ResultDeliveredAt, next.ID)
				continue
			}
			stats.duplicates++
			v.fail("one effect per intended call", "%s (keyed %v, dup %v) took effect as %s and %s (first delivered %v)",
				c.tag, c.keyed, c.dup, prev.ID, next.ID, prev.ResultDeliveredAt)
		}
		if len(recs) > 1 {
			stats.multiExecution++
			if os.Getenv("POSTERN_SOAK_DEBUG") != "" {
				for _, r := range recs {
					t.Logf("DEBUG %s keyed=%v dup=%v %s %s created %s delivered %v effect %v evidence %q", c.tag, c.keyed, c.dup, r.ID, r.State, r.CreatedAt.Format("15:04:05.000"), r.ResultDeliveredAt, h.tookEffect(r.ID), r.Evidence)
				}
				for id, x := range o.views {
					t.Logf("DEBUG   client saw %s %s", id, x.State)
				}
			}
		}
		// Nothing lost: what the client saw is journaled, and its final view holds.
		seen := map[string]bool{}
		for id, x := range o.views {
			seen[id] = true
			r := h.journal[id]
			if r == nil {
				stats.lost++
				v.fail("nothing lost", "%s: the client saw %s (%s), the journal does not know it", c.tag, id, x.State)
				continue
			}
			if x.State == string(markers.Completed) && (r.State != markers.Completed || !sameExit(x.ExitCode, r.ExitCode) || x.HTTPStatus != r.HTTPStatus) {
				v.fail("final views hold", "%s: the client saw %s completed (exit %v, HTTP %d); the journal says %s (exit %v, HTTP %d)",
					c.tag, id, deref(x.ExitCode), x.HTTPStatus, r.State, deref(r.ExitCode), r.HTTPStatus)
			}
			if markers.JournalGraph.Terminal(markers.State(x.State)) && string(r.State) != x.State {
				v.fail("final views hold", "%s: the client saw %s %s; the journal says %s", c.tag, id, x.State, r.State)
			}
		}
		if len(recs) == 0 {
			stats.neverAccepted++
		}
		for _, r := range recs {
			stats.executions++
			stats.states[string(r.State)]++
			if !seen[r.ID] {
				stats.unseen++
			}
			switch {
			case inFlight(r.State):
				stats.lost++
				v.fail("nothing lost", "%s: %s is still %s after the bastion settled", c.tag, r.ID, r.State)
			case r.State == markers.Failed:
				stats.failedReasons[r.Channel+": "+reasonOf(lastEvidence(r))]++
			case r.State == markers.Unknown:
				stats.unknown++
				if len(r.Evidence) == 0 {
					v.fail("unknown has evidence", "%s: %s is unknown without evidence", c.tag, r.ID)
				} else {
					stats.unknownReasons[r.Channel+": "+reasonOf(lastEvidence(r))]++
				}
				// A killed supervisor's commands are finished by its keeper: a host marker
				// left interrupted means an outcome was lost (docs/hostagent.md).
				if strings.Contains(lastEvidence(r), "is interrupted") {
					stats.interrupted++
					v.fail("a supervisor's death loses no outcome", "%s: %s is unknown: %s", c.tag, r.ID, lastEvidence(r))
				}
			}
		}
		if o.settled {
			stats.clientSettled++
		}
		stats.attempts += o.attempts
		for k, n := range o.errs {
			stats.addErr(k, n)
		}
		for _, r := range o.refusals {
			stats.addErr("refused: "+reasonOf(r), 1)
		}
	}
	for _, id := range s.backgroundUnresolved {
		v.fail("unknown executions are reconciled in the background", "%s stayed unknown (host could not be asked) for 20s after its host was back", id)
	}
	for _, host := range s.hosts {
		if host.agent == nil && len(h.lines[host.name]) == 0 {
			v.fail("every host took part", "the stock host %s ran no command", host.name)
		}
	}
	s.checkAgentLists(t, ctx, v, h)
	s.checkMarkers(v, h)
	s.verifyAudit(t, ctx, v)
	s.checkFaultsInjected(v)
	s.summary(t, h, stats, v, load)
}

// checkAgentLists: an agent that never saw an execution id can find every one of its
// executions with executions_list.
func (s *soak) checkAgentLists(t *testing.T, ctx context.Context, v *soakVerdict, h *soakHistory) {
	t.Helper()
	for _, actor := range s.actors {
		want := map[string]bool{}
		for id, r := range h.journal {
			if r.Actor == "token:"+actor {
				want[id] = true
			}
		}
		if len(want) > 500 {
			continue // beyond one executions_list page; the operator list covered it
		}
		cs := s.fleet.bastion.Connect(t, actor, nil)
		for _, x := range listOf(t, ctx, cs) {
			delete(want, x.ExecutionID)
		}
		for id := range want {
			v.fail("nothing lost", "%s: executions_list of %s does not show it", id, actor)
		}
	}
}

// checkMarkers: journal and host markers agree for every SSH execution, and every marker
// on a host is a journaled execution of that host.
func (s *soak) checkMarkers(v *soakVerdict, h *soakHistory) {
	for _, r := range h.journal {
		if r.Channel == "http" {
			switch {
			case r.State == markers.Completed && h.httpEffects[r.ID] != 1:
				v.fail("journal agrees with the target", "%s completed, the target counted %d effects", r.ID, h.httpEffects[r.ID])
			case r.State == markers.Failed && h.httpEffects[r.ID] != 0:
				v.fail("journal agrees with the target", "%s failed (provably no effect), the target counted %d", r.ID, h.httpEffects[r.ID])
			}
			continue
		}
		m := h.hostMarkers[r.Host][r.ID]
		lines := len(h.lines[r.Host][r.ID])
		switch r.State {
		case markers.Completed:
			if m == nil || m.State != hostproto.MarkerExited || !sameExit(m.ExitCode, r.ExitCode) || m.Signal != r.Signal {
				v.fail("journal agrees with markers", "%s completed (exit %v %s); host marker %s", r.ID, deref(r.ExitCode), r.Signal, describeMarker(m))
			}
			if lines != 1 {
				v.fail("journal agrees with effects", "%s completed; its command left %d lines", r.ID, lines)
			}
		case markers.Failed:
			if m != nil && m.State != hostproto.MarkerNotStarted && m.State != hostproto.MarkerStartFailed {
				v.fail("journal agrees with markers", "%s failed (provably not run); host marker %s", r.ID, describeMarker(m))
			}
			if lines != 0 {
				v.fail("journal agrees with effects", "%s failed (provably not run); its command left %d lines", r.ID, lines)
			}
		case markers.Unknown:
			if m != nil && (m.State == hostproto.MarkerExited || m.State == hostproto.MarkerRunning || m.State == hostproto.MarkerStarted) {
				v.fail("journal agrees with markers", "%s is unknown though its host marker is %s (evidence %q)", r.ID, describeMarker(m), r.Evidence)
			}
		}
	}
	for host, ms := range h.hostMarkers {
		for id, m := range ms {
			if r := h.journal[id]; r == nil || r.Host != host {
				v.fail("markers map to journaled executions", "marker %s (%s) on %s has no journaled execution there", id, m.State, host)
			}
		}
	}
}

// verifyAudit runs `postern audit verify` on the bastion's journal and `postern-hostagent
// markers verify` on every host.
func (s *soak) verifyAudit(t *testing.T, ctx context.Context, v *soakVerdict) {
	t.Helper()
	run := func(what, bin string, args ...string) {
		out, err := exec.CommandContext(ctx, harness.Binary(t, bin), args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "PASS") {
			v.fail("audit chains verify", "%s: %v\n%s", what, err, out)
		}
	}
	run("bastion journal", "postern", "audit", "verify", "--config", s.fleet.bastion.ConfigPath)
	for _, h := range s.hosts {
		if h.agent == nil {
			continue // the marker script keeps no audit chain
		}
		run("markers on "+h.name, "postern-hostagent", "markers", "verify", "--config", h.agent.ConfigPath)
	}
}

// reasonOf groups an evidence note or refusal: ids and numbers elided.
func reasonOf(s string) string {
	s = execIDPattern.ReplaceAllString(s, "ex_…")
	s = digits.ReplaceAllString(s, "N")
	if len(s) > 140 {
		s = s[:140] + "…"
	}
	return s
}

func lastEvidence(r *markers.Record) string {
	if len(r.Evidence) == 0 {
		return ""
	}
	return r.Evidence[len(r.Evidence)-1]
}

func sameExit(a, b *int) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func deref(p *int) any {
	if p == nil {
		return "none"
	}
	return *p
}

func describeMarker(m *hostproto.Marker) string {
	if m == nil {
		return "absent"
	}
	return fmt.Sprintf("%s (exit %v %s)", m.State, deref(m.ExitCode), m.Signal)
}

type soakStats struct {
	executions, unseen, multiExecution, neverAccepted, clientSettled, attempts int
	duplicates, newIntentAfterDelivery, deliveredUnseen, deliveredToKilled     int
	cancelNeverArrived, lost, unknown, interrupted                             int
	states                                                                     map[string]int
	unknownReasons, failedReasons                                              map[string]int
	clientErrors                                                               map[string]int
}

func (st *soakStats) addErr(kind string, n int) {
	if st.clientErrors == nil {
		st.clientErrors = map[string]int{}
	}
	st.clientErrors[kind] += n
}

// summary logs the run's figures (seed, calls, faults, executions, the verdict).
func (s *soak) summary(t *testing.T, h *soakHistory, st soakStats, v *soakVerdict, load time.Duration) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "soak summary (replay: POSTERN_SEED=%d POSTERN_SOAK_CALLS=%d)\n", s.seed, len(s.calls))
	row := func(k string, val any) { fmt.Fprintf(&b, "  %-34s %v\n", k, val) }
	row("seed", s.seed)
	row("intended calls", fmt.Sprintf("%d (%d clients, %d attempts, %d dup-submitted, %d keyed)", len(s.calls), len(s.actors), st.attempts, count(s.calls, func(c *soakCall) bool { return c.dup }), count(s.calls, func(c *soakCall) bool { return c.keyed })))
	row("load phase", load.Round(time.Millisecond))
	row("faults injected", sortedCounts(s.faults.snapshot()))
	row("reads", sortedCounts(s.reads.snapshot()))
	row("client errors (retried)", sortedCounts(st.clientErrors))
	row("executions", fmt.Sprintf("%d %s", st.executions, sortedCounts(st.states)))
	row("calls the client saw end", fmt.Sprintf("%d (the rest: unknown, or gave up after %d attempts)", st.clientSettled, soakAttempts))
	row("calls with >1 execution", st.multiExecution)
	row("calls never accepted", st.neverAccepted)
	row("executions the client never saw", fmt.Sprintf("%d (all found via the journal)", st.unseen))
	effects := 0
	var perHost []string
	for _, host := range s.hosts {
		effects += len(h.lines[host.name])
		perHost = append(perHost, fmt.Sprintf("%s=%d", host.name, len(h.lines[host.name])))
	}
	row("effects", fmt.Sprintf("%d on hosts (%s; s1: stock sshd, marker script), %d on the HTTP target", effects, strings.Join(perHost, " "), s.fleet.target.TotalEffects()))
	row("duplicates (must be 0)", st.duplicates)
	row("new intent after delivered result", fmt.Sprintf("%d (unkeyed calls; the matching rule's documented limit)", st.newIntentAfterDelivery))
	row("new intent after a result never seen (must be 0)", st.deliveredUnseen)
	row("new intent after a cancel that never arrived", fmt.Sprintf("%d (the bastion was down when the client sent it)", st.cancelNeverArrived))
	row("new intent after delivery to a killed client/bridge", fmt.Sprintf("%d (read before it died; the documented limit)", st.deliveredToKilled))
	row("lost (must be 0)", st.lost)
	row("unknown", st.unknown)
	row("host markers interrupted (must be 0)", st.interrupted)
	for _, kv := range sortedByCount(st.unknownReasons) {
		fmt.Fprintf(&b, "    %4d × %s\n", kv.n, kv.k)
	}
	row("failed (provably no effect)", st.states[string(markers.Failed)])
	for _, kv := range sortedByCount(st.failedReasons) {
		fmt.Fprintf(&b, "    %4d × %s\n", kv.n, kv.k)
	}
	row("violations", sortedCounts(v.violations))
	t.Log(b.String())
}

func count(calls []*soakCall, pred func(*soakCall) bool) int {
	n := 0
	for _, c := range calls {
		if pred(c) {
			n++
		}
	}
	return n
}

type kv struct {
	k string
	n int
}

func sortedByCount(m map[string]int) []kv {
	var out []kv
	for k, n := range m {
		out = append(out, kv{k, n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n > out[j].n || (out[i].n == out[j].n && out[i].k < out[j].k) })
	return out
}

func sortedCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, e := range sortedByCount(m) {
		parts = append(parts, fmt.Sprintf("%s=%d", e.k, e.n))
	}
	return strings.Join(parts, " ")
}

// soakFaultKinds are every fault the soak injects; a run that injected one of them 0 times
// proved nothing about it (its injection broke, or the run was too short).
var soakFaultKinds = []string{
	faultMCPCut, faultHostCut, faultHostFreeze, faultBastionKill, faultHostagentKill, faultShimKill,
	faultPluginKill, faultClientKill, faultSDKAbort, faultBridgeRestart,
}

func (s *soak) checkFaultsInjected(v *soakVerdict) {
	injected := s.faults.snapshot()
	for _, kind := range soakFaultKinds {
		if injected[kind] == 0 {
			v.fail("every fault kind was injected", "%s was injected 0 times", kind)
		}
	}
}

// bridgeSession opens a session as the local actor, through the stdio bridge; it is closed
// at cleanup.
func (s *soak) bridgeSession(t *testing.T, ctx context.Context) *mcp.ClientSession {
	t.Helper()
	cl := &soakClient{s: s}
	cs, _, err := cl.connectBridge(ctx, 0)
	if err != nil {
		t.Fatalf("stdio bridge: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}
