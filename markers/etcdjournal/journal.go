// Package etcdjournal is the bastion's journal on etcd, for N bastion replicas serving one
// fleet: a markers.JournalStore and a markers.Replicated.
//
// # Invariants
//
//   - The journal keeps the markers key layout under a prefix of its own, and commits the
//     Writes markers plans: the same records, index entries, events and hash chain as the
//     Pebble store, so exports of both verify alike and a journal copies between them.
//   - Every write is one etcd transaction. A create compares the record's create_revision
//     with 0 (create-if-absent) and each index entry it takes over with the mod_revision this
//     journal saw when it looked the entry up — the entry the call was matched on as absent
//     if it did not (another replica's acceptance in between makes it ErrRaced); a change compares the record's mod_revision with the one it read
//     (compare-and-set; a lost race reads again and re-applies the change, with the same
//     conflict and idempotence rules as the Pebble store).
//   - The chain is one chain across replicas: its head key is advanced in the same
//     transaction as the events, compared on its mod_revision. The writes pending on one
//     replica share one transaction (group commit); a transaction that lost the head to
//     another replica is retried with the new head. Checkpoints are signed against the head
//     in the transaction that writes them. Replicas that contend take turns at the head
//     (turns.go); the turns are a schedule only, the compare on the head decides.
//   - Reads are linearizable (etcd's default): a lookup sees every write any replica
//     committed before it began.
//   - Ownership: an execution in a driven state has an owner key bound to the lease of the
//     replica driving it. It is put in the transaction that creates it or dispatches it
//     (a dispatch compares it as read: absent, or this replica's), deleted by the write that
//     ends it, and expires with its replica's lease. Another replica follows the execution
//     through a watch, and claims it once the key is gone.
//   - Fails closed: an etcd error (no quorum, a timeout) is returned, and nothing is written
//     or dispatched on it. A write whose outcome is unknown (a timeout) is reported as an
//     error; the record may exist, and the replicas' reconcile then treats it as any
//     execution in flight (its host's marker decides).
//   - etcd limits: a transaction stays under MaxTxnOps operations and MaxTxnBytes bytes
//     (etcd's defaults are 128 operations and 1.5 MiB per request); a stored result is at
//     most markers.MaxResultBytes.
package etcdjournal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/postern-dev/postern/internal/keylock"
	"github.com/postern-dev/postern/markers"
	"github.com/postern-dev/postern/markers/internal/groupcommit"
)

// Bounds of one transaction, under etcd's defaults (--max-txn-ops 128,
// --max-request-bytes 1.5 MiB).
const (
	MaxTxnOps   = 120
	MaxTxnBytes = 1 << 20
)

// Options configure Open.
type Options struct {
	// Client is the etcd client; the journal does not close it.
	Client *clientv3.Client
	// Prefix is the key prefix of this journal (e.g. "/postern/"). Required.
	Prefix string
	// Markers: Signer, Origin, CheckpointEvery, CheckpointInterval, Logger, Now, ReadOnly
	// apply as for the Pebble store; the graph is the journal's.
	Markers markers.Options
	// Replica names this replica in owner keys and the election. Required unless ReadOnly.
	Replica string
	// LeaseTTL is how long a dead replica's executions stay owned before another replica
	// takes them over. Default 10s.
	LeaseTTL time.Duration
	// OpTimeout bounds each etcd request. Default 5s.
	OpTimeout time.Duration
	// QuotaBytes is the members' backend quota (their --quota-backend-bytes), which Backend
	// reports use against. Default 2 GiB, etcd's default.
	QuotaBytes int64
	// CompactionLag is how much recent revision history a retention pass keeps when it
	// compacts: a reader at one revision (an export, a copy, a replica's watch that fell
	// behind) fails once that revision is compacted, so one that takes less than this never
	// does. Default 5 minutes.
	CompactionLag time.Duration
}

// DefaultQuotaBytes is etcd's default backend quota.
const DefaultQuotaBytes = 2 << 30

// Journal is the etcd journal. All methods are safe for concurrent use.
type Journal struct {
	cli    *clientv3.Client
	kv     clientv3.KV
	prefix string
	opts   markers.Options
	log    *slog.Logger
	name   string
	ttl    time.Duration
	opTO   time.Duration

	// locks serializes the writers of one execution on this replica; those of other replicas
	// are fenced by the record's mod_revision.
	locks keylock.Set

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	// writes is the group-commit queue; its leader runs commitGroup.
	writes *groupcommit.Queue[*request]

	// Owned by the current commit leader.
	head      markers.ChainPos
	headRev   int64 // mod_revision of the head key; -1: unknown, read it first
	sealedSeq uint64
	// This replica's last chain commit, the slot of taking turns and when this replica last
	// lost the head (turns.go).
	ownRev int64
	ownAt  time.Time
	slot   time.Duration
	lostAt time.Time

	// seen is the mod_revision of each pointer index entry as this journal last looked it up
	// (see create).
	seenMu sync.Mutex // guards seen
	seen   map[string]seenEntry

	// written holds records as this replica last wrote them, with their mod_revision: a
	// change of one starts from it instead of reading it back (see change).
	wmu     sync.Mutex // guards written; never held with seenMu or smu
	written map[string]writtenRecord

	// indexed: the journal holds the indexes of markers.IndexVersion (index.go).
	indexed atomic.Bool
	// gcMu: one retention pass at a time on this replica (others are fenced by compares).
	gcMu sync.Mutex
	// quota is the members' backend quota as configured, for Backend.
	quota int64
	// compactLag is Options.CompactionLag; revisions are the store's revision at the start
	// of each recent pass (guarded by gcMu), which a pass compacts up to once they are
	// older than compactLag.
	compactLag time.Duration
	revisions  []revisionAt

	smu     sync.Mutex // guards session
	session *concurrency.Session
	leading atomic.Bool // elected for the reconcile loop

	commits atomic.Uint64
	events  atomic.Uint64
	headSeq atomic.Uint64
	// txns counts chain transactions sent, lostHead those that lost the head to another
	// replica (each was a raft commit that wrote nothing): the contention on the chain.
	txns     atomic.Uint64
	lostHead atomic.Uint64

	tmu    sync.Mutex    // guards turns and turned; taken by the commit leader
	turns  []turn        // the replicas' recent chain commits, ascending (turns.go)
	turned chan struct{} // closed and replaced when a turn is recorded
}

type seenEntry struct {
	rev int64
	at  time.Time
}

// maxSeen bounds the seen map; entries older than seenTTL go first (a lookup and the create
// it decides happen within one call, under the bastion's intake lock).
const (
	maxSeen = 4096
	seenTTL = time.Minute
)

// Open opens the journal under opts.Prefix, creating its graph record if absent, and (unless
// ReadOnly) starts this replica's lease and its campaign for the reconcile loop.
func Open(opts Options) (*Journal, error) {
	mo := opts.Markers
	mo.Graph = markers.JournalGraph
	mo.EnsureDefaults()
	if err := mo.Validate(); err != nil {
		return nil, err
	}
	if opts.Client == nil || opts.Prefix == "" {
		return nil, errors.New("etcdjournal: a client and a key prefix are required")
	}
	if opts.Replica == "" && !mo.ReadOnly {
		return nil, errors.New("etcdjournal: a replica name is required")
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 10 * time.Second
	}
	if opts.OpTimeout == 0 {
		opts.OpTimeout = 5 * time.Second
	}
	if opts.QuotaBytes == 0 {
		opts.QuotaBytes = DefaultQuotaBytes
	}
	if opts.CompactionLag == 0 {
		opts.CompactionLag = 5 * time.Minute
	}
	ctx, cancel := context.WithCancel(context.Background())
	j := &Journal{
		cli: opts.Client, kv: opts.Client.KV, prefix: opts.Prefix, opts: mo, name: opts.Replica,
		log: mo.Logger.With("component", "etcdjournal"), ttl: opts.LeaseTTL, opTO: opts.OpTimeout,
		ctx: ctx, cancel: cancel, headRev: -1, seen: map[string]seenEntry{}, written: map[string]writtenRecord{},
		quota: opts.QuotaBytes, compactLag: opts.CompactionLag, turned: make(chan struct{}),
	}
	j.writes = groupcommit.New(j.commitGroup, fitOneTxn)
	if err := j.load(); err != nil {
		cancel()
		return nil, err
	}
	if !mo.ReadOnly {
		if _, err := j.currentSession(); err != nil {
			cancel()
			return nil, err
		}
		j.wg.Go(j.sealPeriodically)
		j.wg.Go(j.campaign)
		j.wg.Go(j.watchTurns)
	}
	return j, nil
}

func (j *Journal) key(k []byte) string { return j.prefix + string(k) }

// Keys outside the markers layout use upper-case families: L<id> owner keys, E… the election.
func (j *Journal) ownerKey(id string) string { return j.prefix + "L" + id }

func (j *Journal) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(j.ctx, j.opTO)
}

func (j *Journal) wrap(what string, err error) error {
	if j.closed.Load() {
		return markers.ErrClosed
	}
	return fmt.Errorf("etcdjournal: %s: %w", what, err)
}

// load checks the graph and reads the head and the last checkpoint.
func (j *Journal) load() error {
	ctx, cancel := j.opCtx()
	defer cancel()
	gk := j.prefix + "mgraph"
	put := []clientv3.Op{clientv3.OpPut(gk, string(markers.JournalGraph))}
	if j.opts.ReadOnly {
		put = nil // an empty prefix reads as an empty journal
	}
	resp, err := j.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(gk), "=", 0)).
		Then(put...).Else(clientv3.OpGet(gk)).Commit()
	if err != nil {
		return j.wrap("open", err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && string(kvs[0].Value) != string(markers.JournalGraph) {
			return fmt.Errorf("etcdjournal: prefix %s holds %s records, not journal ones", j.prefix, kvs[0].Value)
		}
	}
	if err := j.readHead(ctx); err != nil {
		return err
	}
	f := markers.CheckpointFamily
	cps, err := j.kv.Get(ctx, j.key(f.Start), clientv3.WithRange(j.key(f.End)), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return j.wrap("read checkpoints", err)
	}
	if len(cps.Kvs) == 1 {
		j.sealedSeq = seqOfKey(cps.Kvs[0].Key)
	}
	return j.buildIndexes()
}

func (j *Journal) readHead(ctx context.Context) error {
	resp, err := j.kv.Get(ctx, j.key(markers.HeadKey()))
	if err != nil {
		return j.wrap("read head", err)
	}
	return j.setHead(resp.Kvs)
}

func (j *Journal) setHead(kvs []*mvccpb.KeyValue) error {
	if len(kvs) == 0 {
		j.head, j.headRev = markers.ChainPos{Hash: markers.GenesisHash()}, 0
		return nil
	}
	var p markers.ChainPos
	if err := json.Unmarshal(kvs[0].Value, &p); err != nil {
		return fmt.Errorf("%w: head: %v", markers.ErrCorrupt, err)
	}
	j.head, j.headRev = p, kvs[0].ModRevision
	j.headSeq.Store(p.Seq)
	return nil
}

// seqOfKey is the big-endian sequence number at the end of an event or checkpoint key.
func seqOfKey(k []byte) uint64 {
	var n uint64
	for _, c := range k[len(k)-8:] {
		n = n<<8 | uint64(c)
	}
	return n
}

// Close seals the chain, stops the campaign and hands this replica's executions in flight
// over: it revokes its lease and publishes what it owned (handOver), so that the other
// replicas take them over at once (call it once nothing drives them here). The client stays
// open.
func (j *Journal) Close() error {
	if j.closed.Load() {
		return markers.ErrClosed
	}
	var sealErr error
	if !j.opts.ReadOnly {
		sealErr = j.commitQueued(&request{seal: true})
	}
	j.closed.Store(true)
	j.cancel()
	j.wg.Wait()
	j.smu.Lock()
	defer j.smu.Unlock()
	if j.session != nil {
		j.session.Orphan()
		// Its drivers have stopped (the bastion closes the journal last), and a restart of it
		// would hold a new lease anyway.
		j.handOver(j.session.Lease())
	}
	return sealErr
}

// Stats counts this replica's writes: Commits is etcd transactions that committed.
func (j *Journal) Stats() markers.Stats {
	return markers.Stats{Events: j.events.Load(), Commits: j.commits.Load(), Head: j.headSeq.Load()}
}

func (j *Journal) now() time.Time { return j.opts.Now().UTC() }

// Export writes the chain as JSONL from one revision of the store at which a checkpoint
// covers the head (see markers.Store.Export): other replicas may append meanwhile, so it
// seals and looks again until it finds one. A read-only journal cannot sign: its export ends
// where the chain does.
func (j *Journal) Export(w io.Writer) error {
	if j.closed.Load() {
		return markers.ErrClosed
	}
	var resp *clientv3.TxnResponse
	for attempt := 0; ; attempt++ {
		ctx, cancel := j.opCtx()
		cp := markers.CheckpointFamily
		var err error
		resp, err = j.kv.Txn(ctx).Then(
			clientv3.OpGet(j.key(markers.BaseKey())),
			clientv3.OpGet(j.key(markers.HeadKey())),
			clientv3.OpGet(j.key(cp.Start), clientv3.WithRange(j.key(cp.End)), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1)),
		).Commit()
		cancel()
		if err != nil {
			return j.wrap("export", err)
		}
		var head markers.ChainPos
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			if err := json.Unmarshal(kvs[0].Value, &head); err != nil {
				return fmt.Errorf("%w: head: %v", markers.ErrCorrupt, err)
			}
		}
		sealed := uint64(0)
		if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) == 1 {
			sealed = seqOfKey(kvs[0].Key)
		}
		if sealed == head.Seq || j.opts.ReadOnly {
			break
		}
		if attempt == 5 {
			return fmt.Errorf("etcdjournal: export: the chain keeps growing past every checkpoint")
		}
		if err := j.commitQueued(&request{seal: true, refresh: true}); err != nil {
			return fmt.Errorf("etcdjournal: seal before export: %w", err)
		}
	}
	base := markers.ChainPos{Hash: markers.GenesisHash()}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if err := json.Unmarshal(kvs[0].Value, &base); err != nil {
			return fmt.Errorf("%w: base: %v", markers.ErrCorrupt, err)
		}
	}
	rev := resp.Header.Revision
	return markers.WriteExport(w, base, j.scan(markers.CheckpointFamily, rev), j.scan(markers.EventFamily, rev))
}

// scan yields a family of sequence-numbered keys at revision rev, in pages.
func (j *Journal) scan(f markers.Family, rev int64) iter.Seq2[markers.LogEntry, error] {
	return func(yield func(markers.LogEntry, error) bool) {
		from := j.key(f.Start)
		for {
			ctx, cancel := j.opCtx()
			resp, err := j.kv.Get(ctx, from, clientv3.WithRange(j.key(f.End)), clientv3.WithRev(rev), clientv3.WithLimit(500))
			cancel()
			if err != nil {
				yield(markers.LogEntry{}, j.wrap("scan", err))
				return
			}
			for _, kv := range resp.Kvs {
				if !yield(markers.LogEntry{Seq: seqOfKey(kv.Key), Value: kv.Value}, nil) {
					return
				}
			}
			if !resp.More || len(resp.Kvs) == 0 {
				return
			}
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
}

var _ markers.JournalStore = (*Journal)(nil)
var _ markers.Replicated = (*Journal)(nil)
