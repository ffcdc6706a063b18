package journal

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/internal/durable"
	"github.com/postern-dev/postern/markers"
)

// Backups (docs/operations.md, "Backup and restore"). A backup is a directory:
//
//	backup.json  the manifest, written last: a directory without one is not a backup
//	journal/     the journal as a Pebble store, whatever backend it was taken from
//	state/       the state files that give the journal its meaning (StateFiles)
//
// Invariants: every file in it is 0600 and every directory 0700 (it holds the bastion's
// keys); it is built beside its final name and renamed into place once complete and
// verified, so a directory by that name is always a whole backup; its journal is a prefix
// of the journal it was taken from (Snapshot), and its manifest names the head and the
// export digest that a restore checks again.

const (
	manifestName   = "backup.json"
	journalSubdir  = "journal"
	stateSubdir    = "state"
	manifestFormat = 1
)

// Manifest describes a backup.
type Manifest struct {
	Format    int       `json:"format"`
	CreatedAt time.Time `json:"created_at"`
	// Source is where the journal was read: "the running bastion" or "the journal files"
	// (Pebble), "etcd" with its prefix.
	Source string `json:"source"`
	// Head is the newest event of the backed-up journal; Sealed the last one a signed
	// checkpoint covers.
	Head   markers.ChainPos `json:"head"`
	Sealed uint64           `json:"sealed_seq"`
	// ExportSHA256 is the digest of the backed-up journal's export (markers' JSONL).
	ExportSHA256 string `json:"export_sha256"`
	// StateFiles are the names under state/.
	StateFiles []string `json:"state_files"`
}

// StateFile is one state file a backup carries: its name in the backup and where this
// configuration keeps it.
type StateFile struct{ Name, Path string }

// StateFiles are the files besides the journal that a bastion needs to carry on from it: the
// fingerprint key (without it no retry matches its execution), the audit key and its
// verifier (the chain's signatures), the bastion's SSH key (the hosts authorize it), the
// inventory (the hosts and their pinned keys), and the config a state dir may hold (`postern
// up` keeps its own there: the actors and their token hashes).
func StateFiles(cfg config.Config) []StateFile {
	return []StateFile{
		{"fingerprint.key", cfg.FingerprintKeyPath()},
		{"audit.key", cfg.AuditKeyPath()},
		{"audit.key.pub", cfg.AuditKeyPath() + ".pub"},
		{"bastion_ed25519", cfg.ClientKeyPath()},
		{"bastion_ed25519.pub", cfg.ClientPublicKeyPath()},
		{"hosts.toml", cfg.InventoryPath()},
		{"postern.toml", filepath.Join(cfg.StateDir, "postern.toml")},
	}
}

// Snapshot writes a consistent copy of jl into dir, which must not exist: a Pebble
// checkpoint of a Pebble journal (markers.Store.Checkpoint), or, from etcd, every key of the
// prefix read at one revision through the client, into a new Pebble store.
func Snapshot(jl markers.JournalStore, dir string) error {
	if s, ok := jl.(*markers.Store); ok {
		return s.Checkpoint(dir)
	}
	raw, ok := jl.(markers.RawJournal)
	if !ok {
		return fmt.Errorf("journal: a %T cannot be backed up", jl)
	}
	_, err := markers.ImportRaw(dir, markers.Options{Graph: markers.JournalGraph, Logger: slog.New(slog.DiscardHandler)}, raw.Raw())
	return err
}

// The stream of a snapshot (the operator API's GET /v1/journal/backup): a tar of the
// snapshot's files under journal/, then a last entry named tarEnd, so a stream cut short is
// told from a whole one.
const tarEnd = "end"

// WriteTar streams the files of dir (a Snapshot: a flat directory) to w.
func WriteTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			return fmt.Errorf("journal: backup: %s in the snapshot is not a regular file", e.Name())
		}
		if err := tarFile(tw, filepath.Join(dir, e.Name()), journalSubdir+"/"+e.Name()); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: tarEnd, Mode: 0o600, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	return tw.Close()
}

func tarFile(tw *tar.Writer, path, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: info.Size(), Typeflag: tar.TypeReg, ModTime: info.ModTime()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// ExtractTar writes a WriteTar stream's journal files into dir, which must not exist
// (created 0700, files 0600, each synced). Only plain names under journal/ are accepted.
func ExtractTar(r io.Reader, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return errors.New("journal: the backup stream ended early (see the bastion's log)")
		}
		if err != nil {
			return fmt.Errorf("journal: read the backup stream: %w", err)
		}
		if h.Name == tarEnd {
			return durable.SyncDir(dir)
		}
		name, ok := strings.CutPrefix(h.Name, journalSubdir+"/")
		if !ok || h.Typeflag != tar.TypeReg || name == "" || name != filepath.Base(name) || name == "." || name == ".." {
			return fmt.Errorf("journal: unexpected entry %q in the backup stream", h.Name)
		}
		if err := writeSynced(filepath.Join(dir, name), tr); err != nil {
			return err
		}
	}
}

// writeSynced creates path (0600, it must not exist) with what r holds, synced.
func writeSynced(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// WriteBackup makes a backup in dir, which must not exist (its parent must): fill writes the
// journal's snapshot into the directory it is given and says where it read it (the
// manifest's Source); the state files of cfg are copied
// beside it; the copy is verified against the audit verifier key and its export digested;
// the manifest is written last and the whole renamed into place.
func WriteBackup(cfg config.Config, dir string, now time.Time, fill func(journalDir string) (source string, err error)) (*Manifest, error) {
	dir = filepath.Clean(dir)
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s exists: a backup goes to a new directory", dir)
	}
	parent := filepath.Dir(dir)
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".partial-")
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	complete := false
	defer func() {
		if !complete {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o700); err != nil {
		return nil, err
	}
	source, err := fill(filepath.Join(tmp, journalSubdir))
	if err != nil {
		return nil, fmt.Errorf("backup the journal: %w", err)
	}
	m := &Manifest{Format: manifestFormat, CreatedAt: now.UTC(), Source: source}
	if err := os.Mkdir(filepath.Join(tmp, stateSubdir), 0o700); err != nil {
		return nil, err
	}
	for _, sf := range StateFiles(cfg) {
		data, err := os.ReadFile(sf.Path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // e.g. no host enrolled yet
		}
		if err != nil {
			return nil, fmt.Errorf("backup %s: %w", sf.Path, err)
		}
		if err := writeSynced(filepath.Join(tmp, stateSubdir, sf.Name), bytes.NewReader(data)); err != nil {
			return nil, err
		}
		m.StateFiles = append(m.StateFiles, sf.Name)
	}
	if err := durable.SyncDir(filepath.Join(tmp, stateSubdir)); err != nil {
		return nil, err
	}
	if err := m.check(tmp); err != nil {
		return nil, err
	}
	data, _ := json.MarshalIndent(m, "", "  ")
	if err := writeSynced(filepath.Join(tmp, manifestName), bytes.NewReader(append(data, '\n'))); err != nil {
		return nil, err
	}
	if err := durable.SyncDir(tmp); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	complete = true
	return m, durable.SyncDir(parent)
}

// check verifies the journal of the backup in dir against the backup's own audit verifier
// key and fills in its head, seal and export digest.
func (m *Manifest) check(dir string) error {
	vkey, err := markers.ReadAuditVerifier(filepath.Join(dir, stateSubdir, "audit.key"))
	if err != nil {
		return fmt.Errorf("the backup has no audit verifier key: %w", err)
	}
	jdir := filepath.Join(dir, journalSubdir)
	rep, err := markers.VerifyDir(jdir, vkey, markers.VerifyOptions{})
	if err != nil {
		return fmt.Errorf("verify the backed-up journal: %w", err)
	}
	if !rep.OK {
		return fmt.Errorf("the backed-up journal does not verify: %s", rep)
	}
	if m.Head, err = markers.ReadHead(jdir); err != nil {
		return err
	}
	m.Sealed = rep.SealedSeq
	m.ExportSHA256, err = exportDigestOf(jdir)
	return err
}

func exportDigestOf(dir string) (string, error) {
	s, err := markers.Open(dir, markers.Options{Graph: markers.JournalGraph, ReadOnly: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return "", err
	}
	d, err := ExportDigest(s)
	return d, errors.Join(err, s.Close())
}

// ExportDigest is the SHA-256 of j's export.
func ExportDigest(j markers.JournalStore) (string, error) {
	h := sha256.New()
	if err := j.Export(h); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ReadBackup reads the manifest of the backup in dir and verifies its journal again: what
// it holds is what the manifest says.
func ReadBackup(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s is not a backup (no %s): make one with postern journal backup", dir, manifestName)
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", manifestName, err)
	}
	if m.Format != manifestFormat {
		return nil, fmt.Errorf("%s: format %d, this postern reads %d", manifestName, m.Format, manifestFormat)
	}
	again := Manifest{}
	if err := again.check(dir); err != nil {
		return nil, err
	}
	if again.Head != m.Head || again.ExportSHA256 != m.ExportSHA256 {
		return nil, fmt.Errorf("the backup's journal is not the one its manifest describes (head %d, export %s; the manifest says %d, %s)",
			again.Head.Seq, again.ExportSHA256, m.Head.Seq, m.ExportSHA256)
	}
	return &m, nil
}

// Restore brings the backup in dir (read with ReadBackup) back as cfg's journal and state
// files. No bastion of cfg may run: the caller holds the state dir's lock (Pebble), and on
// etcd it refuses while a replica serves the prefix. What exists is replaced only with
// replace: a Pebble journal and state files that differ are set aside (renamed with a
// .replaced-TIME suffix), an etcd prefix is cleared. Every step is reported to say. The
// restored journal's export is checked against the manifest's digest.
func Restore(ctx context.Context, cfg config.Config, dir string, m *Manifest, replace bool, now time.Time, say func(string)) error {
	suffix := ".replaced-" + now.UTC().Format("20060102T150405Z")
	// Plan the state files first: nothing changes unless all of them can be restored.
	type fileStep struct {
		sf      StateFile
		data    []byte
		replace bool
	}
	var files []fileStep
	var conflicts []string
	for _, sf := range StateFiles(cfg) {
		if !slices.Contains(m.StateFiles, sf.Name) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, stateSubdir, sf.Name))
		if err != nil {
			return err
		}
		cur, err := os.ReadFile(sf.Path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			files = append(files, fileStep{sf: sf, data: data})
		case err != nil:
			return err
		case bytes.Equal(cur, data):
			say(fmt.Sprintf("kept %s: it is the backup's", sf.Path))
		default:
			conflicts = append(conflicts, sf.Path)
			files = append(files, fileStep{sf: sf, data: data, replace: true})
		}
	}
	if len(conflicts) > 0 && !replace {
		return fmt.Errorf("%s differ from the backup's: --replace sets them aside (%s) and restores the backup's", strings.Join(conflicts, ", "), suffix)
	}
	if err := restoreJournal(ctx, cfg, dir, replace, suffix, say); err != nil {
		return err
	}
	for _, f := range files {
		if f.replace {
			if err := os.Rename(f.sf.Path, f.sf.Path+suffix); err != nil {
				return err
			}
			say(fmt.Sprintf("set %s aside as %s", f.sf.Path, f.sf.Path+suffix))
		}
		if err := os.MkdirAll(filepath.Dir(f.sf.Path), 0o700); err != nil {
			return err
		}
		if err := durable.CreateFile(f.sf.Path, f.data, 0o600); err != nil {
			return err
		}
		say("restored " + f.sf.Path)
	}
	restored, err := OpenReadOnly(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	digest, err := ExportDigest(restored)
	if err = errors.Join(err, restored.Close()); err != nil {
		return fmt.Errorf("export the restored journal: %w", err)
	}
	if digest != m.ExportSHA256 {
		return fmt.Errorf("the restored journal's export differs from the backup's (sha256 %s, not %s)", digest, m.ExportSHA256)
	}
	return nil
}

func restoreJournal(ctx context.Context, cfg config.Config, dir string, replace bool, suffix string, say func(string)) error {
	src, err := markers.Open(filepath.Join(dir, journalSubdir), markers.Options{Graph: markers.JournalGraph, ReadOnly: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer src.Close()
	if !cfg.Journal.Etcd() {
		jdir := cfg.JournalDir()
		if _, err := os.Lstat(jdir); err == nil {
			if !replace {
				return fmt.Errorf("%s holds a journal: --replace sets it aside (as %s) and restores the backup", jdir, filepath.Base(jdir)+suffix)
			}
			if err := os.Rename(jdir, jdir+suffix); err != nil {
				return err
			}
			say(fmt.Sprintf("set the journal %s aside as %s", jdir, jdir+suffix))
		}
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return err
		}
		// Built beside it and renamed, so the state dir never holds half a journal.
		tmp := fmt.Sprintf("%s.restoring-%s", jdir, rand.Text()[:8])
		n, err := markers.ImportRaw(tmp, markers.Options{Graph: markers.JournalGraph, Logger: slog.New(slog.DiscardHandler)}, src.Raw())
		if err != nil {
			os.RemoveAll(tmp)
			return err
		}
		if err := os.Rename(tmp, jdir); err != nil {
			os.RemoveAll(tmp)
			return err
		}
		say(fmt.Sprintf("restored the journal into %s (%d keys)", jdir, n))
		return durable.SyncDir(cfg.StateDir)
	}
	dst, err := OpenReadOnly(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer dst.Close()
	ej := dst.(etcdJournal)
	if live, err := ej.LiveReplicas(ctx); err != nil {
		return err
	} else if len(live) > 0 {
		return fmt.Errorf("replicas %v serve the journal in etcd: stop every replica first", live)
	}
	prefix := orDefault(cfg.Journal.Prefix, "/postern/")
	if !ej.Empty() {
		if !replace {
			return fmt.Errorf("etcd holds a journal under %s: --replace deletes it and restores the backup", prefix)
		}
		deleted, err := ej.Clear(ctx)
		if err != nil {
			return err
		}
		say(fmt.Sprintf("deleted the journal in etcd under %s (%d keys)", prefix, deleted))
	}
	n, err := ej.Import(src.Raw())
	if err != nil {
		return err
	}
	say(fmt.Sprintf("restored the journal into etcd under %s (%d keys)", prefix, n))
	return nil
}
