package engine

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestTailKeepsTheLastBytesByOffset(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, capacity := range []int{1, 7, 64} {
		tl := newTail(capacity)
		var all []byte
		for range 200 {
			chunk := make([]byte, rng.IntN(20))
			for i := range chunk {
				chunk[i] = byte('a' + rng.IntN(26))
			}
			tl.Write(chunk)
			all = append(all, chunk...)
			total := int64(len(all))
			if tl.size() != total {
				t.Fatalf("cap %d: size %d; want %d", capacity, tl.size(), total)
			}
			from := rng.Int64N(total + 1)
			got, at := tl.read(from, 1<<20)
			oldest := max(total-int64(capacity), 0)
			wantAt := max(from, oldest)
			if at != wantAt || !bytes.Equal(got, all[wantAt:]) {
				t.Fatalf("cap %d: read(%d) = %q at %d; want %q at %d", capacity, from, got, at, all[wantAt:], wantAt)
			}
		}
	}
}

func TestTailRestartSkipsWhatWasSeen(t *testing.T) {
	tl := newTail(16)
	tl.Write([]byte("hello "))
	tl.restart() // a re-attach streams the output again from offset zero
	tl.Write([]byte("hel"))
	tl.Write([]byte("lo world"))
	if got, at := tl.read(0, 100); string(got) != "hello world" || at != 0 {
		t.Fatalf("after re-verdict.Attach: %q at %d; want \"hello world\" at 0", got, at)
	}
}
