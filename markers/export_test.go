package markers

import "github.com/cockroachdb/pebble/v2"

// SetPresenceMinCap lets tests make the presence filter grow after a few keys.
func SetPresenceMinCap(n uint) (restore func()) {
	old := presenceMinCap
	presenceMinCap = n
	return func() { presenceMinCap = old }
}

// FailCommits makes every later commit of s fail with err, as a full disk or a failed fsync
// would.
func FailCommits(s *Store, err error) {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	s.commit = func(*pebble.Batch) error { return err }
}
