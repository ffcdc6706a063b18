package markers_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

func TestMain(m *testing.M) {
	switch testutil.Role() {
	case "crash-writer":
		os.Exit(crashWriter())
	case "rss-probe":
		os.Exit(rssProbe())
	}
	os.Exit(m.Run())
}

// crashWriter writes executions from 8 goroutines until it is killed, printing "ack ID STATE"
// after each write returns (i.e. is durable).
func crashWriter() int {
	dir, keyPath, prefix := os.Getenv("STORE_DIR"), os.Getenv("AUDIT_KEY"), os.Getenv("ID_PREFIX")
	signer, _, err := markers.LoadOrCreateAuditKey(keyPath, "postern-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s, err := markers.Open(dir, markers.Options{Graph: markers.HostGraph, Signer: signer, CheckpointEvery: 50, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var out sync.Mutex
	ack := func(id string, st markers.State) {
		out.Lock()
		fmt.Fprintf(os.Stdout, "ack %s %s\n", id, st)
		out.Unlock()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("ex_%s_%d_%d", prefix, w, i)
				if _, err := s.Create(ctx, &markers.Record{ID: id}); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(3)
				}
				ack(id, markers.Started)
				for _, step := range [][2]markers.State{{markers.Started, markers.Running}, {markers.Running, markers.Exited}} {
					if _, err := s.Transition(ctx, id, step[0], step[1], "", nil); err != nil {
						fmt.Fprintln(os.Stderr, err)
						os.Exit(3)
					}
					ack(id, step[1])
				}
			}
		})
	}
	wg.Wait()
	return 0
}

// TestCrashKeepsAcknowledgedWrites SIGKILLs a writing process at random moments; after each
// crash every acknowledged write must be there and the chain must verify with no gap.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	rng := testutil.Rand(t)
	dir := t.TempDir()
	storeDir, keyPath := dir+"/store", dir+"/audit.key"
	_, vkey, err := markers.LoadOrCreateAuditKey(keyPath, "postern-test")
	if err != nil {
		t.Fatal(err)
	}
	order := map[markers.State]int{markers.Started: 0, markers.Running: 1, markers.Exited: 2}
	acked := map[string]markers.State{}
	for round := range 6 {
		cmd := testutil.Reexec(t, "crash-writer", "STORE_DIR="+storeDir, "AUDIT_KEY="+keyPath, fmt.Sprintf("ID_PREFIX=r%d", round))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill after a random number of acknowledgements, so the kill lands mid-stream.
		killAfter := 20 + rng.IntN(400)
		sc := bufio.NewScanner(stdout)
		n := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[0] != "ack" {
				t.Fatalf("child said %q", sc.Text())
			}
			acked[f[1]] = markers.State(f[2])
			if n++; n == killAfter {
				cmd.Process.Signal(syscall.SIGKILL)
			}
		}
		cmd.Wait()
		if n < killAfter {
			t.Fatalf("round %d: child ended after %d acks, before the kill", round, n)
		}

		rep, err := markers.VerifyDir(storeDir, vkey, markers.VerifyOptions{})
		if err != nil || !rep.OK {
			t.Fatalf("round %d: verify after crash = %v, %v", round, rep, err)
		}
		opts, _ := testutil.AuditKey(t)
		signer, _, _ := markers.LoadOrCreateAuditKey(keyPath, "postern-test")
		opts.Graph, opts.Signer = markers.HostGraph, signer
		s, err := markers.Open(storeDir, opts)
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		for id, st := range acked {
			rec, err := s.Get(id)
			if err != nil {
				t.Fatalf("round %d: acknowledged %s (%s) lost: %v", round, id, st, err)
			}
			if order[rec.State] < order[st] {
				t.Fatalf("round %d: %s is %s; acknowledged %s", round, id, rec.State, st)
			}
		}
		s.Close()
		t.Logf("round %d: killed after %d acks; %d events verified, sealed through %d", round, n, rep.Events, rep.SealedSeq)
	}
}
