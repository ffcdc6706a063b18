package markers

import (
	"context"
	"io"
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
	FindByIdempotencyKey(actor, key string) (*Record, error)
	List(q Query) ([]*Record, string, error)
	Events(id string) ([]Event, error)
	Run(actor, scope string) (*Run, error)
	Runs(q RunQuery) ([]*Run, error)
	SiblingIDs(actor, scope, fingerprint string, limit int) ([]string, error)

	// Export writes the chain as JSONL (see Store.Export).
	Export(w io.Writer) error
	Stats() Stats
	Close() error
}

var _ JournalStore = (*Store)(nil)
