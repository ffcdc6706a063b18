package markers_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/markers"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata golden files from the current behaviour")

// TestTransitionGraph drives a real store through every (from, to) pair of each graph and
// compares what the store allowed with testdata/transitions (regenerate with -rewrite).
func TestTransitionGraph(t *testing.T) {
	ctx := context.Background()
	var got strings.Builder
	for _, g := range []markers.Graph{markers.JournalGraph, markers.HostGraph} {
		s := testutil.OpenStore(t, g)
		states := g.States()
		n := 0
		for _, from := range states {
			path, ok := pathTo(g, from)
			if !ok {
				t.Fatalf("%s: no path from %s to %s", g, g.Initial(), from)
			}
			for _, to := range states {
				n++
				id := fmt.Sprintf("ex_%s_%d", g, n)
				if _, err := s.Create(ctx, &markers.Record{ID: id, Actor: "a"}); err != nil {
					t.Fatal(err)
				}
				for i := 1; i < len(path); i++ {
					if _, err := s.Transition(ctx, id, path[i-1], path[i], "", nil); err != nil {
						t.Fatalf("%s: walk %v: %v", g, path, err)
					}
				}
				_, err := s.Transition(ctx, id, from, to, "", nil)
				verdict := "ok"
				if errors.Is(err, markers.ErrIllegalTransition) {
					verdict = "illegal"
				} else if err != nil {
					t.Fatalf("%s %s→%s: unexpected %v", g, from, to, err)
				}
				after, err := s.Get(id)
				if err != nil {
					t.Fatal(err)
				}
				want := from
				if verdict == "ok" {
					want = to
				}
				if after.State != want {
					t.Errorf("%s %s→%s (%s): state = %s; want %s", g, from, to, verdict, after.State, want)
				}
				fmt.Fprintf(&got, "%s %s -> %s: %s\n", g, from, to, verdict)
			}
		}
	}
	golden := filepath.Join("testdata", "transitions")
	if *rewrite {
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("transitions differ from %s (run with -rewrite to accept):\n%s", golden, diffLines(string(want), got.String()))
	}
}

// pathTo finds a walk from g's initial state to target along legal edges (BFS).
func pathTo(g markers.Graph, target markers.State) ([]markers.State, bool) {
	prev := map[markers.State]markers.State{}
	queue := []markers.State{g.Initial()}
	seen := map[markers.State]bool{g.Initial(): true}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == target {
			path := []markers.State{cur}
			for cur != g.Initial() {
				cur = prev[cur]
				path = append([]markers.State{cur}, path...)
			}
			return path, true
		}
		for _, next := range g.States() {
			if g.Allows(cur, next) && !seen[next] {
				seen[next], prev[next] = true, cur
				queue = append(queue, next)
			}
		}
	}
	return nil, false
}

func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "- %s\n+ %s\n", wl, gl)
		}
	}
	return b.String()
}
