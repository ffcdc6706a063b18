package markers

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"time"
)

// Retention (docs/design.md, "Retention"): a pass removes terminal records that
// Options.Removable gives up — with their stored result, their index entries and their
// event index —, drops what expired of earlier passes (tombstones, agent runs with no
// execution left), and prunes the prefix of the hash chain that only removed records
// still used, up to a signed checkpoint, which then attests the new start of the chain (its
// base). Both backends plan a removal here (PlanRemoval), so they delete and write the same
// keys; each applies it atomically per record, guarded against a concurrent write.

// GCOptions tune a pass.
type GCOptions struct {
	// DryRun counts what the pass would remove and changes nothing.
	DryRun bool
	// Exclusive: nothing else uses the journal during the pass (every bastion of it is
	// down). On etcd the pass then compacts the whole revision history at once instead of
	// keeping its recent part for readers at a fixed revision (etcdjournal.Options.CompactionLag).
	Exclusive bool
}

// GCResult says what a pass removed (or, dry run, would remove).
type GCResult struct {
	DryRun bool `json:"dry_run,omitempty"`
	// Records: terminal records removed. Kept: terminal records old enough to be looked at
	// that Removable kept (their class keeps them longer, or a call could still join them).
	Records int `json:"records"`
	Kept    int `json:"kept"`
	// Tombstones: pointer index entries that now hold a removed execution's tombstone;
	// TombstonesExpired: tombstones dropped.
	Tombstones        int `json:"tombstones"`
	TombstonesExpired int `json:"tombstones_expired"`
	// Runs: agent runs removed (first seen before Options.RunRetention, no execution left).
	Runs int `json:"runs"`
	// Events were pruned from the chain's start: it now starts after BaseSeq (0: from
	// genesis), attested by the checkpoint at BaseSeq. Carried: records still held whose
	// events there were carried forward first (Event.Carried).
	Events  uint64 `json:"events"`
	BaseSeq uint64 `json:"base_seq"`
	Carried int    `json:"carried"`
	// BytesBefore and BytesAfter are the backend's size around the pass (after its
	// compaction): on Pebble the store's disk usage, on etcd the logical size in use of the
	// largest member (see BackendStatus).
	BytesBefore int64 `json:"bytes_before"`
	BytesAfter  int64 `json:"bytes_after"`
	// Compacted: the pass compacted the backend (Pebble: the ranges it deleted; etcd: the
	// revision history up to the pass's start).
	Compacted bool `json:"compacted,omitempty"`
}

// Removed reports whether the pass changed anything.
func (r GCResult) Removed() bool {
	return r.Records+r.TombstonesExpired+r.Runs > 0 || r.Events > 0
}

// Tombstone is what a pointer index entry (an intent's fingerprint, an idempotency key)
// holds once retention removed the execution it named: enough of it for the matching rule
// to answer a call that would have matched it (bastion/intent, RuleRemoved).
type Tombstone struct {
	ID             string     `json:"id"`
	Class          string     `json:"class,omitempty"`
	State          State      `json:"state"`
	Actor          string     `json:"actor,omitempty"`
	Principal      string     `json:"principal,omitempty"`
	IntentScope    string     `json:"intent_scope,omitempty"`
	Fingerprint    string     `json:"fingerprint,omitempty"`
	IdempotencyKey string     `json:"idempotency_key,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	FinishedAt     time.Time  `json:"finished_at"`
	DeliveredAt    *time.Time `json:"delivered_at,omitempty"`
	RemovedAt      time.Time  `json:"removed_at"`
}

// maxTombstoneBytes bounds a decoded tombstone.
const maxTombstoneBytes = 8 << 10

// newTombstone is the tombstone of rec, removed at now.
func newTombstone(rec *Record, now time.Time) *Tombstone {
	finished := rec.UpdatedAt
	if t, ok := rec.StateTimes[rec.State]; ok {
		finished = t
	}
	return &Tombstone{
		ID: rec.ID, Class: rec.Class, State: rec.State, Actor: rec.Actor, Principal: rec.Principal, IntentScope: rec.IntentScope,
		Fingerprint: rec.Fingerprint, IdempotencyKey: rec.IdempotencyKey,
		CreatedAt: rec.CreatedAt, FinishedAt: finished, DeliveredAt: rec.ResultDeliveredAt, RemovedAt: now,
	}
}

// Record is the removed execution as its tombstone keeps it: what the matching rule reads of
// a prior execution (identity and who holds its key, state, class, times, delivery).
func (t *Tombstone) Record() *Record {
	return &Record{
		ID: t.ID, Graph: JournalGraph, State: t.State, Class: t.Class, Actor: t.Actor, Principal: t.Principal, IntentScope: t.IntentScope,
		Fingerprint: t.Fingerprint, IdempotencyKey: t.IdempotencyKey, CreatedAt: t.CreatedAt,
		UpdatedAt: t.FinishedAt, StateTimes: map[State]time.Time{t.State: t.FinishedAt}, ResultDeliveredAt: t.DeliveredAt,
	}
}

// isTombstone tells a tombstone from an execution id in a pointer index entry's value.
func isTombstone(v []byte) bool { return len(v) > 0 && v[0] == '{' }

func decodeTombstone(v []byte) (*Tombstone, error) {
	if len(v) > maxTombstoneBytes {
		return nil, fmt.Errorf("%w: tombstone of %d bytes", ErrCorrupt, len(v))
	}
	var t Tombstone
	if err := json.Unmarshal(v, &t); err != nil || t.ID == "" {
		return nil, fmt.Errorf("%w: tombstone: %v", ErrCorrupt, err)
	}
	return &t, nil
}

// RemovedError answers a lookup (FindByFingerprint, FindByIdempotencyKey) whose entry names an
// execution retention removed. It is an ErrNotFound: a caller that only asks "is there a
// prior execution" gets no; the matching rule reads the tombstone.
type RemovedError struct{ Tombstone *Tombstone }

func (e *RemovedError) Error() string {
	return fmt.Sprintf("markers: execution %s was removed by retention at %s", e.Tombstone.ID, e.Tombstone.RemovedAt.Format(time.RFC3339))
}

func (e *RemovedError) Is(target error) bool { return target == ErrNotFound }

// lookupAnswer is a pointer index entry's value as a lookup answers it: the id it names,
// or the tombstone it holds (a *RemovedError).
func lookupAnswer(v []byte) (string, error) {
	if !isTombstone(v) {
		return string(v), nil
	}
	t, err := decodeTombstone(v)
	if err != nil {
		return "", err
	}
	return "", &RemovedError{Tombstone: t}
}

// LookupAnswer is lookupAnswer for another backend.
func LookupAnswer(v []byte) (string, error) { return lookupAnswer(v) }

// PointerChange is what a removal does to one pointer index entry that may still name the
// removed execution: a backend applies it only if the entry still holds that execution's
// id (a newer execution may have taken it over), in the same atomic write as the removal.
type PointerChange struct {
	Key []byte
	// Tombstone replaces the id (nil: the entry is deleted), and ExpiryKey indexes it by
	// when a later pass drops it.
	Tombstone, ExpiryKey []byte
}

// Removal is what removing one record deletes and writes, on every backend.
type Removal struct {
	ID string
	// Deletes are the record, its result and its set index entries (state, time, actor,
	// run, siblings); Ranges its event index.
	Deletes  [][]byte
	Ranges   []Family
	Pointers []PointerChange
}

// PlanRemoval plans the removal of rec at now. keep is how long tombstones of its pointer
// entries stay (0: the entries are deleted, no tombstone).
func PlanRemoval(rec *Record, now time.Time, keep time.Duration) Removal {
	rm := Removal{ID: rec.ID, Deletes: [][]byte{recordKey(rec.ID), resultKey(rec.ID)}}
	for _, e := range indexEntries(rec) {
		if e.value == nil {
			rm.Deletes = append(rm.Deletes, e.key)
		}
	}
	rm.Ranges = []Family{ExecEventFamily(rec.ID)}
	var tomb []byte
	if keep > 0 && rec.Graph == JournalGraph {
		tomb, _ = json.Marshal(newTombstone(rec, now)) // plain fields: always encodes
	}
	expires := now.Add(keep)
	for _, k := range pointerKeys(rec) {
		pc := PointerChange{Key: k}
		if tomb != nil && k[0] != pOpKey { // an operation key is the host's to enforce
			pc.Tombstone = tomb
			pc.ExpiryKey = append(binary.BigEndian.AppendUint64([]byte{pTombstone}, uint64(expires.UnixNano())), k...)
		}
		rm.Pointers = append(rm.Pointers, pc)
	}
	// Keyed executions written before they left the fingerprint index out may still have an
	// entry there.
	if rec.IdempotencyKey != "" && rec.Fingerprint != "" {
		rm.Pointers = append(rm.Pointers, PointerChange{Key: fingerprintKey(rec.Actor, rec.IntentScope, rec.Fingerprint)})
	}
	return rm
}

// TombstoneFamily holds the tombstones' expiry index; TombstoneExpired bounds the entries
// expired at now, and TombstonePointer names an entry's pointer key.
var TombstoneFamily = Family{[]byte{pTombstone}, []byte{pTombstone + 1}}

func TombstoneExpired(now time.Time) []byte {
	return binary.BigEndian.AppendUint64([]byte{pTombstone}, uint64(now.UnixNano())+1)
}

func TombstonePointer(expiryKey []byte) []byte { return expiryKey[9:] }

// TombstoneOf reports whether a pointer entry's value is the tombstone of execution id: the
// entry a tombstone's expiry may delete.
func TombstoneOf(v []byte, id string) bool {
	if !isTombstone(v) {
		return false
	}
	t, err := decodeTombstone(v)
	return err == nil && t.ID == id
}

// RunExecFamily holds the run index entries of one agent run: empty once no execution of
// the run is left.
func RunExecFamily(actor, scope string) Family { return family(runPrefix(actor, scope)) }

// RunTimeBound is the first run time index key at or after t; RunOfTimeKey is the run key a
// run time index entry names (its value).
func RunTimeBound(t time.Time) []byte {
	return binary.BigEndian.AppendUint64([]byte{pRunTime}, uint64(t.UnixNano()))
}

// ParseRunKey splits a run key into actor and scope.
func ParseRunKey(k []byte) (actor, scope string, err error) {
	if len(k) < 2 || k[0] != pRun {
		return "", "", fmt.Errorf("%w: run key", ErrCorrupt)
	}
	for i := 1; i < len(k); i++ {
		if k[i] == 0 {
			return string(k[1:i]), string(k[i+1:]), nil
		}
	}
	return "", "", fmt.Errorf("%w: run key without scope", ErrCorrupt)
}

// CutPoint is the newest checkpoint a pass may prune the chain through: every event up to
// it is before limit (the first event of a record still held that the pass's scan of the
// chain found; past the head when none: all before it are of removed records), or was sealed
// before the event horizon (a zero horizon: none) — a held record's events there are
// carried forward first.
// checkpoints are the signed checkpoints after the current base, in order. It returns the
// chosen one's position, or ok false when the chain cannot be pruned further.
func CutPoint(checkpoints []LogEntry, limit uint64, horizon time.Time) (cut ChainPos, ok bool, err error) {
	for _, e := range checkpoints {
		cp, err := parseOwnCheckpoint(e.Value)
		if err != nil {
			return ChainPos{}, false, err
		}
		if cp.Seq < limit || (!horizon.IsZero() && cp.At.Before(horizon)) {
			cut, ok = ChainPos{Seq: cp.Seq, Hash: cp.Head}, true
			continue
		}
		break
	}
	return cut, ok, nil
}

// EventOf names the execution of an event line without decoding the rest of it: the pass
// reads every line of the prefix it prunes.
func EventOf(line []byte) (string, error) {
	var ev struct {
		ExecutionID string `json:"execution_id"`
	}
	// The id is the fifth field of every line this package writes; a decoder stops early
	// when the object's rest is not needed, so take the prefix up to "kind".
	head := line
	if i := bytes.Index(line, []byte(`,"kind":`)); i > 0 {
		head = append(line[:i:i], '}')
	}
	if err := json.Unmarshal(head, &ev); err != nil || ev.ExecutionID == "" {
		return "", fmt.Errorf("%w: event line without an execution id", ErrCorrupt)
	}
	return ev.ExecutionID, nil
}

// BackendStatus is a journal backend's size and health, for `postern doctor` and /metrics.
type BackendStatus struct {
	// Backend is "pebble" or "etcd".
	Backend string `json:"backend"`
	// Bytes: Pebble, the store's disk usage; etcd, the largest member's database file
	// (what the quota counts).
	Bytes int64 `json:"bytes"`
	// InUseBytes (etcd): the largest member's logical size in use; Bytes - InUseBytes is
	// free space inside the file that only a defragmentation returns.
	InUseBytes int64 `json:"in_use_bytes,omitempty"`
	// QuotaBytes (etcd): the members' backend quota as configured ([journal] quota_bytes).
	QuotaBytes int64 `json:"quota_bytes,omitempty"`
	// Alarms (etcd): the cluster's active alarms, e.g. NOSPACE (the quota was reached:
	// every write fails until space is freed, the members defragmented and the alarm
	// disarmed).
	Alarms []string `json:"alarms,omitempty"`
	// Members (etcd): each member's endpoint and sizes, or why it did not answer.
	Members []MemberStatus `json:"members,omitempty"`
	// BaseSeq and HeadSeq: the chain holds events BaseSeq+1..HeadSeq.
	BaseSeq uint64 `json:"base_seq"`
	HeadSeq uint64 `json:"head_seq"`
}

// MemberStatus is one etcd member as its endpoint answered.
type MemberStatus struct {
	Endpoint   string `json:"endpoint"`
	Bytes      int64  `json:"bytes,omitempty"`
	InUseBytes int64  `json:"in_use_bytes,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Backend is the store's size on disk and the range of its chain.
func (s *Store) Backend(context.Context) (BackendStatus, error) {
	if err := s.readable(); err != nil {
		return BackendStatus{}, err
	}
	base, err := readChainPos(s.db, metaBase)
	if err != nil {
		return BackendStatus{}, err
	}
	head, err := readChainPos(s.db, metaHead)
	if err != nil {
		return BackendStatus{}, err
	}
	return BackendStatus{Backend: "pebble", Bytes: s.diskUsage(), BaseSeq: base.Seq, HeadSeq: head.Seq}, nil
}

// sealedBefore is the newest of checkpoints signed before horizon (0: none, or no horizon).
func sealedBefore(checkpoints []LogEntry, horizon time.Time) (uint64, error) {
	if horizon.IsZero() {
		return 0, nil
	}
	var seq uint64
	for _, e := range checkpoints {
		cp, err := parseOwnCheckpoint(e.Value)
		if err != nil {
			return 0, err
		}
		if !cp.At.Before(horizon) {
			break
		}
		seq = cp.Seq
	}
	return seq, nil
}

// HeldFunc reports which of ids (execution ids) still have their record.
type HeldFunc func(ids []string) (map[string]bool, error)

// scanPage is how many events scanPrefix reads before it asks which of their records are
// still held.
const scanPage = 500

// scanPrefix reads a chain's events in order (from its base) for a pass: limit is the first
// event of a record still held (past the last event read when none), and carry the records
// still held with events up to horizonSeq, in order of their first event there. It stops
// once it has passed both.
func scanPrefix(ctx context.Context, events iter.Seq2[LogEntry, error], horizonSeq uint64, held HeldFunc) (limit uint64, carry []string, err error) {
	known := map[string]bool{}
	seen := map[string]bool{}
	last := uint64(0)
	type entry struct {
		seq uint64
		id  string
	}
	var page []entry
	// decide applies a page; it reports whether the scan is done.
	decide := func() (bool, error) {
		var ask []string
		for _, e := range page {
			if _, ok := known[e.id]; !ok && !slices.Contains(ask, e.id) {
				ask = append(ask, e.id)
			}
		}
		if len(ask) > 0 {
			got, err := held(ask)
			if err != nil {
				return false, err
			}
			for _, id := range ask {
				known[id] = got[id]
			}
		}
		for _, e := range page {
			if limit > 0 && e.seq > horizonSeq {
				return true, nil
			}
			if !known[e.id] {
				continue
			}
			if limit == 0 {
				limit = e.seq
			}
			if e.seq <= horizonSeq && !seen[e.id] {
				seen[e.id] = true
				carry = append(carry, e.id)
			}
		}
		page = page[:0]
		return false, nil
	}
	for e, err := range events {
		if err != nil {
			return 0, nil, err
		}
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		id, err := EventOf(e.Value)
		if err != nil {
			return 0, nil, fmt.Errorf("event %d: %w", e.Seq, err)
		}
		last = e.Seq
		page = append(page, entry{e.Seq, id})
		if len(page) == scanPage {
			done, err := decide()
			if err != nil {
				return 0, nil, err
			}
			if done {
				return limit, carry, nil
			}
		}
	}
	if _, err := decide(); err != nil {
		return 0, nil, err
	}
	if limit == 0 {
		limit = last + 1
	}
	return limit, carry, nil
}

// ScanPrefix is scanPrefix for another backend.
func ScanPrefix(ctx context.Context, events iter.Seq2[LogEntry, error], horizonSeq uint64, held HeldFunc) (uint64, []string, error) {
	return scanPrefix(ctx, events, horizonSeq, held)
}

// SealedBefore is sealedBefore for another backend.
func SealedBefore(checkpoints []LogEntry, horizon time.Time) (uint64, error) {
	return sealedBefore(checkpoints, horizon)
}
