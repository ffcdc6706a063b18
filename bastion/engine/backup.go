package engine

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/journal"
)

// backupDirPrefix names the directories a backup's snapshot is taken into, in the state dir:
// the one place the daemon writes (its unit allows no other), and on the journal's file
// system, so that a Pebble checkpoint links its files instead of copying them.
const backupDirPrefix = ".backup-"

// Backup streams a consistent copy of the journal (journal.Snapshot) to w, as the operator
// API's backup stream (journal.WriteTar); `postern journal backup` makes the backup of it.
// Nothing is written to w before the snapshot is taken, so an error without output is the
// whole answer. One backup runs at a time; the snapshot is removed once streamed (and any a
// crash left behind, at the next backup).
func (b *Engine) Backup(ctx context.Context, w io.Writer) error {
	if b.readOnly {
		return errReadOnly
	}
	if !b.backups.TryLock() {
		return &api.ToolError{Code: api.CodeInvalidArgument, Message: "a backup is already being taken; wait for it to finish"}
	}
	defer b.backups.Unlock()
	stale, _ := filepath.Glob(filepath.Join(b.cfg.StateDir, backupDirPrefix+"*"))
	for _, dir := range stale {
		os.RemoveAll(dir)
	}
	dir := filepath.Join(b.cfg.StateDir, backupDirPrefix+rand.Text()[:10])
	defer os.RemoveAll(dir)
	if err := journal.Snapshot(b.journal, dir); err != nil {
		return fmt.Errorf("snapshot the journal: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return journal.WriteTar(w, dir)
}
