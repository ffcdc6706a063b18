package markers

import (
	"errors"
	"fmt"
	"os"

	"github.com/cockroachdb/pebble/v2"
)

// Checkpoint writes a consistent copy of the store into dir, which must not exist: a Pebble
// checkpoint (sstables hard-linked when dir is on the same file system, else copied; the
// write-ahead log copied), files 0600 and directories 0700 like the store's own. It is what
// `postern journal backup` takes of a journal while the bastion serves.
//
// The copy holds every write committed before it and none after: the chain is sealed first
// (so a backup taken while nothing is written ends with a signed checkpoint), then no commit
// runs while the checkpoint is taken (commitMu), and the log is synced first, so writes made
// without an fsync (NoSync) are in it as well — the copy is a prefix of the chain, as a
// crash would leave it, never a write the store itself could still lose. Writers wait for
// the checkpoint: linking the sstables and copying the log, milliseconds for a journal's
// memtable-sized log. A store opened ReadOnly is copied key for key instead (ImportRaw).
func (s *Store) Checkpoint(dir string) error {
	if err := s.readable(); err != nil {
		return err
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("markers: checkpoint into %s: it exists (a checkpoint goes to a new directory)", dir)
	}
	if s.opts.ReadOnly {
		// Pebble checkpoints only a store it writes; a read-only one (nothing writes it) is
		// copied key for key from one snapshot, which is as consistent.
		_, err := ImportRaw(dir, s.opts, s.Raw())
		return err
	}
	if err := s.submit(&commitReq{seal: true}); err != nil {
		return fmt.Errorf("markers: seal before checkpoint: %w", err)
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("markers: checkpoint into %s: %w", dir, err)
	}
	return nil
}

// ReadHead is the chain head of the store in dir (which no process may hold open), read
// without opening it for writing: a backup's or a restored journal's newest event.
func ReadHead(dir string) (ChainPos, error) {
	o := Options{Graph: JournalGraph}
	o.EnsureDefaults()
	db, err := openPebble(dir, &o, true)
	if err != nil {
		return ChainPos{}, err
	}
	defer db.Close()
	return readChainPos(db, metaHead)
}
