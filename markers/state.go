package markers

import (
	"errors"
	"fmt"
)

// State is the lifecycle state of one execution record.
type State string

// Journal states: the bastion's view of an execution (docs/design.md, "Execution lifecycle (bastion journal)").
const (
	Accepted         State = "accepted"
	Authorized       State = "authorized"
	AwaitingApproval State = "awaiting_approval"
	Rejected         State = "rejected"
	Dispatched       State = "dispatched"
	Running          State = "running"
	Completed        State = "completed"
	Unknown          State = "unknown"
	Failed           State = "failed"
	Cancelled        State = "cancelled"
	TimedOut         State = "timed_out"
)

// Host states: a hostagent's marker for an execution (docs/design.md, "Marker lifecycle (host)"). Running,
// Cancelled and TimedOut are shared with the journal.
const (
	// Started: the marker is written and nothing runs yet.
	Started State = "started"
	// Exited: the process ended and its exit code or signal was observed.
	Exited State = "exited"
	// Interrupted: the process vanished with no exit record — an unknown outcome.
	Interrupted State = "interrupted"
	// NotStarted: after a crash, a Started marker had no shim record, so the command provably
	// never ran; the same execution may be started again from here.
	NotStarted State = "not_started"
	// StartFailed: the command could not be started (its cwd or shell is missing or not
	// accessible, the account cannot be switched to) and provably did not run. Record.StartError
	// names the cause. Final: the same request would fail the same way, so it is not retried
	// under the same execution id.
	StartFailed State = "start_failed"
)

// Graph is a state machine: the journal's or the host's.
type Graph string

const (
	JournalGraph Graph = "journal"
	HostGraph    Graph = "host"
)

var edges = map[Graph]map[State][]State{
	JournalGraph: {
		Accepted:         {Authorized, AwaitingApproval, Rejected, Failed},
		AwaitingApproval: {Authorized, Rejected},
		Authorized:       {Dispatched, Failed, Cancelled},
		Dispatched:       {Running, Completed, Unknown, Failed, Cancelled, TimedOut},
		// Running → Failed: running is journaled on the host's first marker, written before
		// the process starts; the host's final marker can still prove it never ran
		// (start_failed).
		Running: {Completed, Unknown, Failed, Cancelled, TimedOut},
		// Reconciliation resolves unknown: the host marker is absent (re-dispatch the same
		// id), running (attach) or finished; an operator's review may record either outcome.
		Unknown: {Dispatched, Running, Completed, Failed, Cancelled, TimedOut},
	},
	HostGraph: {
		// Started → Interrupted: after a crash the shim record exists (so the command may
		// have started) but the shim is gone without an exit record.
		Started:    {Running, NotStarted, StartFailed, Cancelled, Interrupted},
		Running:    {Exited, TimedOut, Cancelled, Interrupted},
		NotStarted: {Started},
	},
}

var initial = map[Graph]State{JournalGraph: Accepted, HostGraph: Started}

// ErrIllegalTransition: the edge is not in the graph. Nothing was written.
var ErrIllegalTransition = errors.New("markers: illegal transition")

// Valid reports whether g is a known graph.
func (g Graph) Valid() bool { _, ok := edges[g]; return ok }

// Initial is the state every record of g is created in.
func (g Graph) Initial() State { return initial[g] }

// Allows reports whether from → to is an edge of g.
func (g Graph) Allows(from, to State) bool {
	for _, s := range edges[g][from] {
		if s == to {
			return true
		}
	}
	return false
}

// Terminal reports whether s has no way out in g. Terminal records are the only ones
// retention may remove.
func (g Graph) Terminal(s State) bool {
	if !g.Has(s) {
		return false
	}
	return len(edges[g][s]) == 0
}

// Has reports whether s is a state of g.
func (g Graph) Has(s State) bool {
	if s == initial[g] {
		return true
	}
	for from, tos := range edges[g] {
		if from == s {
			return true
		}
		for _, t := range tos {
			if t == s {
				return true
			}
		}
	}
	return false
}

// States lists every state of g, initial first, in a stable order.
func (g Graph) States() []State {
	seen := map[State]bool{}
	var out []State
	add := func(s State) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	add(initial[g])
	for _, s := range stateOrder {
		if g.Has(s) {
			add(s)
		}
	}
	return out
}

var stateOrder = []State{
	Accepted, Authorized, AwaitingApproval, Rejected, Dispatched, Started, Running,
	Completed, Exited, Unknown, Interrupted, NotStarted, StartFailed, Failed, Cancelled, TimedOut,
}

func (g Graph) checkEdge(from, to State) error {
	if !g.Allows(from, to) {
		return fmt.Errorf("%w: %s → %s in the %s graph", ErrIllegalTransition, from, to, g)
	}
	return nil
}
