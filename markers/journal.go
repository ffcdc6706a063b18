package markers

import (
	"context"
	"errors"
	"io"
	"time"
)

// JournalStore is what the bastion needs of its journal. *Store (Pebble, one node) is one
// implementation; markers/etcdjournal (etcd, N bastion replicas) is the other. Both keep the
// same records, the same events and the same hash chain (the encoding of this package), so
// an export of either verifies with VerifyJSONL, and `postern journal copy` moves a journal
// between them.
//
// Every method keeps the semantics documented on *Store: create-if-absent, compare-and-set
// transitions along the graph, one chained event per step, and a failed write is an error
// with nothing acted on (fail closed).
type JournalStore interface {
	Create(ctx context.Context, r *Record) (*Record, error)
	CreateFor(ctx context.Context, r *Record, call *Call) (*Record, error)
	CreateAdvancedFor(ctx context.Context, r *Record, path []State, note string, call *Call) (*Record, error)
	Transition(ctx context.Context, id string, from, to State, note string, mutate func(*Record) error) (*Record, error)
	TransitionWith(ctx context.Context, id string, from, to State, note string, d Durability, mutate func(*Record) error) (*Record, error)
	Advance(ctx context.Context, id string, from State, path []State, note string, mutate func(*Record) error) (*Record, error)
	AdvanceWithResult(ctx context.Context, id string, from State, path []State, note string, result []byte, mutate func(*Record) error) (*Record, error)
	Update(ctx context.Context, id, note string, mutate func(*Record) error) (*Record, error)
	UpdateFor(ctx context.Context, id, note string, call *Call, d Durability, mutate func(*Record) error) (*Record, error)
	RevokeDelivery(ctx context.Context, id, note string) (*Record, bool, error)
	Joined(ctx context.Context, id string, call *Call) error

	Get(id string) (*Record, error)
	Result(id string) ([]byte, error)
	FindByFingerprint(actor, scope, fingerprint string) (*Record, error)
	FindByIdempotencyKey(space, key string) (*Record, error)
	List(q Query) ([]*Record, string, error)
	Events(id string) ([]Event, error)
	Run(actor, scope string) (*Run, error)
	Runs(q RunQuery) ([]*Run, error)
	SiblingIDs(actor, scope, fingerprint string, limit int) ([]string, error)

	// Export writes the chain as JSONL (see Store.Export).
	Export(w io.Writer) error
	// GC is a retention pass (see Store.GC).
	GC(ctx context.Context, o GCOptions) (GCResult, error)
	// Backend is the backend's size and health.
	Backend(ctx context.Context) (BackendStatus, error)
	Stats() Stats
	Close() error
}

var _ JournalStore = (*Store)(nil)

// Errors of a replicated journal that callers branch on.
var (
	// ErrRaced: a create lost the race for an intent's index entry to another replica, which
	// accepted an execution of the same intent after this one looked it up. Nothing was
	// written; the caller matches the call again (it will find the other execution).
	ErrRaced = errors.New("markers: another replica accepted an execution of this intent first")
	// ErrNotOwner: the write would dispatch an execution another live replica drives.
	ErrNotOwner = errors.New("markers: another replica drives this execution")
	// ErrSharedKeys: a replica's keys are not the ones the replicas of its journal share.
	ErrSharedKeys = errors.New("markers: this replica's keys differ from the ones its journal's replicas share")
)

// Replicated is implemented by a journal that several bastion replicas share (etcd). It
// keeps "at most one driver acts on an execution" across them: a replica drives an
// execution only while it owns it — an owner key bound to the replica's lease, taken with
// the write that dispatches it or by Claim — and follows it otherwise, until it ends or its
// owner's lease expires (the owner died), when it may Claim it and reconcile it with its host.
type Replicated interface {
	// Name is this replica's name: in owner keys, in the journal's calls and records
	// (Call.Replica, Record.Replica).
	Name() string
	// AgreeKeys records digest — of the keys every replica must share (the fingerprint key,
	// the audit key) — as the journal's if none is recorded yet (the first replica), and
	// otherwise checks that it is the one recorded (ErrSharedKeys if not).
	AgreeKeys(ctx context.Context, digest string) error
	// Claim makes this replica the owner of execution id if it has no owner (or is already
	// this replica's), and reports whether this replica owns it.
	Claim(ctx context.Context, id string) (bool, error)
	// Release gives up this replica's ownership of id (its driver ended).
	Release(id string)
	// Follow calls update with every new version of id's record, until the record is
	// terminal (false) or has no owner any more (true: Claim it), or ctx ends.
	Follow(ctx context.Context, id string, update func(*Record)) (ownerGone bool, err error)
	// Leading reports whether this replica is the elected one that runs the background
	// reconcile loop.
	Leading() bool
	// LeaseTTL is how long a dead replica's executions stay owned.
	LeaseTTL() time.Duration
	// PublishCancel tells every other replica that a client cancelled a request (a
	// notifications/cancelled, which a load balancer may send to another replica than the
	// one serving the request): key names the request, as the bastion matches cancels.
	PublishCancel(ctx context.Context, key []byte) error
	// WatchCancels calls cancelled with the key of every cancel another replica publishes
	// from now on, until ctx ends.
	WatchCancels(ctx context.Context, cancelled func(key []byte))
	// WatchHandovers calls handedOver with the executions another replica owned when it
	// stopped cleanly (Close hands them over with its lease), from now on, until ctx ends:
	// they have no owner any more, to be claimed at once.
	WatchHandovers(ctx context.Context, handedOver func(from string, ids []string))
}
