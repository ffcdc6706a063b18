package engine

import "sync"

// tail keeps the last cap bytes of one output stream, addressed by absolute offset, so a
// command streaming a gigabyte costs the bastion cap bytes of memory.
type tail struct {
	mu sync.Mutex // guards the fields below; never held while another lock is taken
	// ring grows as output arrives (most commands print little) up to limit bytes, then
	// wraps: it holds [total-len(ring), total).
	ring  []byte
	limit int
	total int64 // bytes ever written
	// skip discards this many bytes of the next writes: a re-attach streams the output
	// again from offset zero, and what was already received must not be counted twice.
	skip int64
}

func newTail(limit int) *tail { return &tail{limit: limit} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if t.skip > 0 {
		drop := min(int64(len(p)), t.skip)
		t.skip -= drop
		p = p[drop:]
	}
	for len(p) > 0 {
		if len(t.ring) < t.limit {
			k := min(t.limit-len(t.ring), len(p))
			t.ring = append(t.ring, p[:k]...)
			p = p[k:]
			t.total += int64(k)
			continue
		}
		at := int(t.total % int64(t.limit))
		k := copy(t.ring[at:], p)
		p = p[k:]
		t.total += int64(k)
	}
	return n, nil
}

// restart prepares for the stream to be sent again from offset zero.
func (t *tail) restart() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.skip = t.total
}

// read returns up to limit bytes from absolute offset from (or from the oldest byte still
// held, if from is older) and the offset of the first byte returned.
func (t *tail) read(from int64, limit int) ([]byte, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	oldest := t.total - int64(len(t.ring))
	from = min(max(from, oldest), t.total)
	n := min(t.total-from, int64(limit))
	out := make([]byte, n)
	for i := int64(0); i < n; {
		at := (from + i) % int64(t.limit)
		if len(t.ring) < t.limit {
			at = from + i // not wrapped yet: ring index is the offset
		}
		k := copy(out[i:], t.ring[at:])
		i += int64(k)
	}
	return out, from
}

// last returns the final limit bytes and their starting offset.
func (t *tail) last(limit int) ([]byte, int64) {
	t.mu.Lock()
	from := max(t.total-int64(limit), 0)
	t.mu.Unlock()
	return t.read(from, limit)
}

func (t *tail) size() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}
