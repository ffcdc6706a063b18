package markers

import (
	"context"

	"github.com/cockroachdb/pebble/v2"
)

// SetPresenceMinCap lets tests make the presence filter grow after a few keys.
func SetPresenceMinCap(n uint) (restore func()) {
	old := presenceMinCap
	presenceMinCap = n
	return func() { presenceMinCap = old }
}

// FailCommits makes every later commit of s fail with err, as a full disk or a failed fsync
// would.
func FailCommits(s *Store, err error) {
	s.commitMu.Lock() // the leader calls s.commit under commitMu
	defer s.commitMu.Unlock()
	s.commit = func(*pebble.Batch, *pebble.WriteOptions) error { return err }
}

// EventBody is the event's JSON without this_hash as the store writes it (to compare with
// json.Marshal).
func EventBody(ev *Event) ([]byte, error) {
	b, err := ev.appendBody(nil)
	if err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// SetIndexed makes List read as a store without the actor and run indexes does (scanning
// the time index): the baseline of BenchmarkListByActor.
func (s *Store) SetIndexed(v bool) { s.indexed = v }

// CompactAll flushes the memtables and compacts every key, so that the tables hold exactly
// what the store keeps, and returns their size: BenchmarkCapacity's bytes on disk.
func (s *Store) CompactAll() (int64, error) {
	if err := s.db.Flush(); err != nil {
		return 0, err
	}
	if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		return 0, err
	}
	s.awaitObsoleteDeleted(context.Background())
	return int64(s.db.Metrics().Table.Local.LiveSize), nil
}
