package markers

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/mod/sumdb/note"
)

// Options configure a Store. Zero values take the documented defaults (EnsureDefaults), which
// are sized for a fleet machine: a few MB of memory.
type Options struct {
	// Graph is the state machine of the records: JournalGraph (bastion) or HostGraph (hostagent).
	// Required; a store keeps the graph it was created with.
	Graph Graph
	// Signer signs checkpoints with the installation's Ed25519 audit key
	// (LoadOrCreateAuditKey). Required.
	Signer note.Signer
	// Origin is the first line of every checkpoint, naming the log. Default "postern <graph>".
	Origin string
	// CheckpointEvery seals the chain after this many events. Default 1000.
	CheckpointEvery int
	// CheckpointInterval seals the chain after this long if there are unsealed events.
	// Default 1 minute. Close always seals.
	CheckpointInterval time.Duration
	// CacheBytes is Pebble's block cache. Default 1 MiB.
	CacheBytes int64
	// MemTableBytes is the size of one Pebble memtable. Default 2 MiB.
	MemTableBytes uint64
	// PresenceKeys sizes the in-memory presence filter's first layer (about 1.2 bytes per
	// key): a store expected to hold many keys gets fewer layers to test per lookup. Default
	// 16384; the filter grows past it as needed.
	PresenceKeys uint
	// MaxOpenFiles bounds Pebble's table cache. Default 64.
	MaxOpenFiles int
	// RecordCacheEntries bounds the cache of decoded records (the most recently used ones),
	// which spares a write the decoding of the record it changes. Default 1024 (about 1-2 MB
	// at most); negative disables it.
	RecordCacheEntries int
	// Retention is how long a terminal record of each action class is kept since it last
	// changed, keyed by Record.Class (the default Removable). Default DefaultRetention.
	Retention map[string]time.Duration
	// DefaultRetention applies to classes missing from Retention. Default 30 days.
	DefaultRetention time.Duration
	// Removable, if set, decides instead of Retention whether a retention pass (GC) may
	// remove a terminal record at now; it is never asked about a record that is not
	// terminal. The bastion's journal decides by its action classes (bastion/intent).
	Removable func(r *Record, now time.Time) bool
	// MinRetention: no record created less than this long ago is removable, so a pass only
	// looks at older ones. Default 0.
	MinRetention time.Duration
	// TombstoneRetention, if set, is how long the pointer index entries of a removed
	// execution of a class (its intent's fingerprint or its idempotency key) keep its
	// tombstone, which a lookup answers with a *RemovedError; 0 for a class, or unset,
	// deletes them.
	TombstoneRetention func(class string) time.Duration
	// RunRetention: an agent run first seen longer ago than this, with no execution of its
	// own left, is removed by a pass. Default 0: runs are kept.
	RunRetention time.Duration
	// EventRetention: a pass prunes the chain's prefix of events older than this even where
	// a retained record still has events in it (its record stays; those events live on in
	// the exports made before). Default 0: only the prefix whose records are all removed is
	// pruned.
	EventRetention time.Duration
	// Logger receives the store's and Pebble's messages. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// ReadOnly opens an existing store for reading only (no Signer needed): every write
	// returns ErrReadOnly. Pebble still locks the directory, so this only works while no
	// other process has the store open.
	ReadOnly bool
}

// Sizing presets. The defaults suit a hostagent: a few MB of memory, a handful of
// concurrent executions. The bastion's journal takes many concurrent writers and millions of
// records: bigger memtables mean fewer flushes and compactions (group commit at 64 writers
// goes from ~12k to ~28k records/s on a 2-core machine), and a bigger cache keeps the index
// and filter blocks of create-if-absent lookups in memory.
const (
	JournalMemTableBytes = 64 << 20
	JournalCacheBytes    = 32 << 20
	// JournalPresenceKeys: a million executions' keys (~3 per record) in the first layer of
	// the presence filter, about 3.6 MB.
	JournalPresenceKeys = 3 << 20
)

// EnsureDefaults fills zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Origin == "" {
		o.Origin = "postern " + string(o.Graph)
	}
	if o.CheckpointEvery == 0 {
		o.CheckpointEvery = 1000
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = time.Minute
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = 1 << 20
	}
	if o.MemTableBytes == 0 {
		o.MemTableBytes = 2 << 20
	}
	if o.MaxOpenFiles == 0 {
		o.MaxOpenFiles = 64
	}
	if o.RecordCacheEntries == 0 {
		o.RecordCacheEntries = 1024
	}
	if o.DefaultRetention == 0 {
		o.DefaultRetention = 30 * 24 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate reports every problem with o at once.
func (o *Options) Validate() error {
	var errs []error
	if !o.Graph.Valid() {
		errs = append(errs, fmt.Errorf("graph %q: want %q or %q", o.Graph, JournalGraph, HostGraph))
	}
	if o.Signer == nil && !o.ReadOnly {
		errs = append(errs, errors.New("signer: an audit key is required"))
	}
	if o.CheckpointEvery < 0 || o.CheckpointInterval < 0 {
		errs = append(errs, errors.New("checkpoint every/interval must not be negative"))
	}
	if o.MemTableBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("memtable of %d bytes: at least 1 MiB", o.MemTableBytes))
	}
	for class, d := range o.Retention {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("retention of class %q must be positive", class))
		}
	}
	if o.MinRetention < 0 || o.RunRetention < 0 || o.EventRetention < 0 {
		errs = append(errs, errors.New("min, run and event retention must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("markers: options: %w", err)
	}
	return nil
}

func (o *Options) retention(class string) time.Duration {
	if d, ok := o.Retention[class]; ok {
		return d
	}
	return o.DefaultRetention
}

// removable is the retention rule of the pass: Removable, else the class's Retention since
// the record last changed. A record that is not terminal never is.
func (o *Options) removable(r *Record, now time.Time) bool {
	if !r.Graph.Terminal(r.State) {
		return false
	}
	if o.Removable != nil {
		return o.Removable(r, now)
	}
	return now.Sub(r.UpdatedAt) >= o.retention(r.Class)
}

// IsRemovable reports whether a pass with these options removes r at now (see Options.Removable).
func (o *Options) IsRemovable(r *Record, now time.Time) bool { return o.removable(r, now) }

func (o *Options) tombstoneRetention(class string) time.Duration {
	if o.TombstoneRetention == nil {
		return 0
	}
	return o.TombstoneRetention(class)
}

// KeepTombstone is how long a removed execution of class keeps its tombstones.
func (o *Options) KeepTombstone(class string) time.Duration { return o.tombstoneRetention(class) }
