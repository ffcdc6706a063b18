package markers

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/postern-dev/postern/internal/keylock"
	"github.com/postern-dev/postern/markers/internal/groupcommit"
)

// FormatVersion is the Pebble on-disk format every store is created with. It is pinned (never
// FormatNewest, which would change under us on a dependency bump) and is at least
// FormatWALSyncChunks, so WAL replay tells a torn tail after a crash apart from corruption.
const FormatVersion = pebble.FormatWALSyncChunks

// Errors callers branch on.
var (
	ErrExists   = errors.New("markers: execution already exists")
	ErrNotFound = errors.New("markers: execution not found")
	// ErrConflict: a compare-and-set transition found the record in another state. The
	// current record is returned with it.
	ErrConflict = errors.New("markers: state conflict")
	// ErrImmutable: an update tried to change an identity field or the state.
	ErrImmutable = errors.New("markers: identity fields and state cannot be updated")
	ErrClosed    = errors.New("markers: store closed")
	ErrReadOnly  = errors.New("markers: store opened read-only")
	// ErrBroken: an earlier commit failed; the store refuses every write until reopened, so
	// nothing proceeds on a write that may not have happened.
	ErrBroken = errors.New("markers: store failed a durable write")
)

// Store is a durable set of execution records with their event log. All methods are safe for
// concurrent use.
type Store struct {
	opts  Options
	log   *slog.Logger
	db    *pebble.DB
	locks keylock.Set
	// present answers "certainly absent" for lookups of keys never written.
	present *presence
	// records holds decoded records as last committed (see recordCache).
	records *recordCache
	// indexed: the store holds the indexes of IndexVersion (index.go). Set by Open.
	indexed bool

	// mu guards closed; writers hold it shared for the whole write, so Close (exclusive)
	// waits for writes in flight.
	mu     sync.RWMutex
	closed bool

	// writes is the group-commit queue; its leader runs commitGroup.
	writes *groupcommit.Queue[*commitReq]

	stop chan struct{} // closed by Close to end sealPeriodically and stop a retention pass
	wg   sync.WaitGroup
	// passes counts retention passes in progress (Add under mu, shared, while not closed):
	// Close waits for them before it closes Pebble.
	passes sync.WaitGroup

	// commitMu is held around each commit, so a reader that takes it sees only durable
	// writes (Export's snapshot).
	commitMu sync.Mutex
	// indexMu is held shared by every write from before it is staged until it is committed,
	// and exclusively by a retention pass between reading the index entries it changes (a
	// pointer entry naming a removed record, an agent run with no execution left) and
	// committing the change, so that no write creates such an entry in between. Lock order:
	// a record's lock, then indexMu.
	indexMu sync.RWMutex

	// Owned by the current commit leader.
	head       ChainPos
	sealedSeq  uint64
	lastSealAt time.Time
	broken     error

	// commit commits a batch (durably with pebble.Sync); tests replace it to make a commit
	// fail.
	commit func(*pebble.Batch, *pebble.WriteOptions) error

	commits  atomic.Uint64
	unsynced atomic.Uint64
	events   atomic.Uint64
	headSeq  atomic.Uint64
}

// ChainPos is a position in the hash chain: the newest event's sequence number and hash.
type ChainPos struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

type commitReq struct {
	groupcommit.Waiter
	*Write // nil for a checkpoint-only request
	// durability is Sync unless the caller asked for NoSync.
	durability Durability
	seal       bool // a checkpoint-only request
}

// step is one state change of a write and the record right after it (versioned encoding).
type step struct {
	kind     EventKind
	from, to State
	note     string
	record   []byte
}

// Open opens (creating if needed) the store in dir.
func Open(dir string, opts Options) (*Store, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	db, err := openPebble(dir, &opts, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	s := &Store{
		opts:    opts,
		log:     opts.Logger.With("component", "markers", "graph", string(opts.Graph)),
		db:      db,
		stop:    make(chan struct{}),
		commit:  func(b *pebble.Batch, wo *pebble.WriteOptions) error { return b.Commit(wo) },
		records: newRecordCache(opts.RecordCacheEntries),
	}
	s.writes = groupcommit.New(s.commitGroup, nil)
	if err := s.load(); err != nil {
		db.Close()
		return nil, err
	}
	if !opts.ReadOnly {
		s.wg.Add(1)
		go s.sealPeriodically()
	}
	return s, nil
}

func openPebble(dir string, opts *Options, readOnly bool) (*pebble.DB, error) {
	cache := pebble.NewCache(opts.CacheBytes)
	defer cache.Unref()
	po := &pebble.Options{
		FS:                          privateFS{vfs.Default},
		FormatMajorVersion:          FormatVersion,
		Cache:                       cache,
		MemTableSize:                opts.MemTableBytes,
		MemTableStopWritesThreshold: 4,
		MaxOpenFiles:                opts.MaxOpenFiles,
		Logger:                      pebbleLogger{opts.Logger.With("component", "pebble")},
		ReadOnly:                    readOnly,
	}
	// Most lookups on the write path miss (create-if-absent of a new id): bloom filters let
	// a miss skip the data blocks, which the small cache could not hold.
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("markers: open %s: %w", dir, err)
	}
	return db, nil
}

// load reads the chain head and checks the graph the store was created with.
func (s *Store) load() error {
	graph, err := s.getMeta(metaGraph)
	switch {
	case errors.Is(err, pebble.ErrNotFound) && s.opts.ReadOnly:
		return fmt.Errorf("markers: not a store (no graph recorded)")
	case errors.Is(err, pebble.ErrNotFound):
		if err := s.db.Set(metaGraph, []byte(s.opts.Graph), pebble.Sync); err != nil {
			return fmt.Errorf("markers: record graph: %w", err)
		}
	case err != nil:
		return err
	case Graph(graph) != s.opts.Graph:
		return fmt.Errorf("markers: store holds %s records, opened as %s", graph, s.opts.Graph)
	}
	s.head, err = readChainPos(s.db, metaHead)
	if err != nil {
		return err
	}
	s.sealedSeq, err = lastCheckpointSeq(s.db)
	if err != nil {
		return err
	}
	s.lastSealAt = s.opts.Now()
	if err := s.buildIndexes(); err != nil {
		return err
	}
	s.present, err = loadPresence(s.db, s.opts.PresenceKeys)
	return err
}

func (s *Store) getMeta(key []byte) ([]byte, error) {
	v, closer, err := s.db.Get(key)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

func readChainPos(r pebble.Reader, key []byte) (ChainPos, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return ChainPos{Hash: genesisHash}, nil
	}
	if err != nil {
		return ChainPos{}, fmt.Errorf("markers: read %s: %w", key, err)
	}
	defer closer.Close()
	var p ChainPos
	if err := json.Unmarshal(v, &p); err != nil {
		return ChainPos{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, key, err)
	}
	return p, nil
}

func lastCheckpointSeq(r pebble.Reader) (uint64, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{pCheckpoint}, UpperBound: []byte{pCheckpoint + 1}})
	if err != nil {
		return 0, fmt.Errorf("markers: scan checkpoints: %w", err)
	}
	defer it.Close()
	if !it.Last() {
		return 0, it.Error()
	}
	return seqOf(it.Key())
}

func seqOf(key []byte) (uint64, error) {
	if len(key) != 9 {
		return 0, fmt.Errorf("%w: sequence key of %d bytes", ErrCorrupt, len(key))
	}
	return binary.BigEndian.Uint64(key[1:]), nil
}

// Close seals the chain with a final checkpoint, waits for writes in flight and closes Pebble.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
	s.passes.Wait()
	var sealErr error
	if !s.opts.ReadOnly {
		sealErr = s.writes.Commit(&commitReq{seal: true})
	}
	if err := errors.Join(sealErr, s.db.Close()); err != nil {
		return fmt.Errorf("markers: close: %w", err)
	}
	return nil
}

// Stats are counters for benchmarks and metrics.
type Stats struct {
	// Events is the number of events (writes) committed since Open.
	Events uint64
	// Commits is the number of synced Pebble commits since Open: each is one WAL fsync, so
	// Commits/Events is fsyncs per write.
	Commits uint64
	// Unsynced is the number of commits made without an fsync (groups of NoSync writes only).
	Unsynced uint64
	// Head is the sequence number of the newest event.
	Head uint64
}

func (s *Store) Stats() Stats {
	return Stats{Events: s.events.Load(), Commits: s.commits.Load(), Unsynced: s.unsynced.Load(), Head: s.headSeq.Load()}
}

// pebbleLogger sends Pebble's messages to slog instead of stderr.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg, "fatal", true)
	panic("pebble: " + msg)
}
