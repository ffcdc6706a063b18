package markers_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

// A checkpoint taken while writers commit (synced and NoSync) is a prefix of the chain that
// verifies on its own, holds every write made before it, and is private (0600/0700).
func TestCheckpointWhileWriting(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	ctx := context.Background()
	for i := range 20 {
		if _, err := s.Create(ctx, &markers.Record{ID: fmt.Sprintf("ex_before%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// An unsynced write just before the checkpoint is in it.
	if _, err := s.UpdateWith(ctx, "ex_before00", "unsynced", markers.NoSync, func(r *markers.Record) error {
		r.Evidence = []string{"unsynced"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	before := s.Stats().Head

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := markers.Sync
				if i%2 == 1 {
					d = markers.NoSync
				}
				id := fmt.Sprintf("ex_during%d_%04d", w, i)
				if _, err := s.Create(ctx, &markers.Record{ID: id}); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.UpdateWith(ctx, id, "noted", d, nil); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	dir := filepath.Join(t.TempDir(), "backup")
	err := s.Checkpoint(dir)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(dir); err == nil {
		t.Fatal("a second checkpoint into the same dir succeeded")
	}

	rep, err := markers.VerifyDir(dir, s.VerifierKey, markers.VerifyOptions{})
	if err != nil || !rep.OK {
		t.Fatalf("verify the checkpoint: %v, %v", rep, err)
	}
	if rep.LastSeq < before || rep.LastSeq > s.Stats().Head {
		t.Fatalf("the checkpoint ends at %d; want at least %d (written before it) and at most %d", rep.LastSeq, before, s.Stats().Head)
	}
	head, err := markers.ReadHead(dir)
	if err != nil || head.Seq != rep.LastSeq {
		t.Fatalf("ReadHead = %+v, %v; want seq %d", head, err, rep.LastSeq)
	}

	// Every event the copy holds is the store's, byte for byte.
	var live, copied bytes.Buffer
	if err := s.Export(&live); err != nil {
		t.Fatal(err)
	}
	cs, err := markers.Open(dir, markers.Options{Graph: markers.JournalGraph, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := cs.Get("ex_before00"); err != nil || fmt.Sprint(rec.Evidence) != "[unsynced]" {
		t.Fatalf("the unsynced write before the checkpoint: %+v, %v", rec, err)
	}
	if err := cs.Export(&copied); err != nil {
		t.Fatal(err)
	}
	cs.Close()
	if got, want := eventLines(copied.Bytes()), eventLines(live.Bytes())[:len(eventLines(copied.Bytes()))]; !equalLines(got, want) {
		t.Fatal("the checkpoint's events differ from the store's")
	}

	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700 | fs.ModeDir
		}
		if info.Mode() != want {
			t.Errorf("%s is %v; want %v", path, info.Mode(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// eventLines are the event lines of an export (its checkpoints left out).
func eventLines(export []byte) [][]byte {
	var out [][]byte
	for line := range bytes.SplitSeq(bytes.TrimSpace(export), []byte("\n")) {
		if bytes.HasPrefix(line, []byte(`{"type":"event"`)) {
			out = append(out, line)
		}
	}
	return out
}

func equalLines(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// A store opened read-only (the bastion is down) checkpoints too: a copy of what it holds.
func TestCheckpointReadOnly(t *testing.T) {
	s := testutil.OpenStore(t, markers.JournalGraph)
	for i := range 5 {
		if _, err := s.Create(context.Background(), &markers.Record{ID: fmt.Sprintf("ex_%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	ro, err := markers.Open(s.Dir, markers.Options{Graph: markers.JournalGraph, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	dir := filepath.Join(t.TempDir(), "backup")
	if err := ro.Checkpoint(dir); err != nil {
		t.Fatal(err)
	}
	rep, err := markers.VerifyDir(dir, s.VerifierKey, markers.VerifyOptions{RequireSealed: true})
	if err != nil || !rep.OK || rep.LastSeq != 5 {
		t.Fatalf("verify the read-only store's checkpoint: %v, %v; want PASS through 5, sealed", rep, err)
	}
}
