package markers

import (
	"errors"
	"fmt"
	"sync"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/cockroachdb/pebble/v2"
)

// presence is an in-memory Bloom filter over every record key and pointer index key ever
// written. Most lookups on the hot paths are for keys that do not exist — create-if-absent
// of a new execution id, the fingerprint of a new intent — and the filter answers those
// without touching Pebble, whose Get reads data blocks in the bottom level for every miss.
//
// It never answers "absent" for a key that exists: it is built from a scan at Open and every
// commit adds its keys before any writer is told the commit happened. Removed keys stay in
// it (false positives, which fall through to Pebble) until the next Open.
//
// It grows as a scalable Bloom filter: when one filter holds its capacity, a new one four
// times the size is added, keeping the false-positive rate of each near fpRate (and the
// number of filters a lookup tests small). All filters share k, so a lookup hashes the key
// once and tests the same locations in each.
type presence struct {
	mu      sync.RWMutex // guards filters and n
	filters []*bloom.BloomFilter
	n       uint // keys in the last filter
	cap     uint // capacity of the last filter
	minCap  uint // capacity of the first filter
}

// presenceMinCap is the capacity of the first filter (a variable so tests can make it grow).
var presenceMinCap uint = 1 << 14

const presenceFPRate = 0.01

// loadPresence scans the keys a lookup may ask for.
// minKeys sizes the first filter (at least presenceMinCap).
func loadPresence(r pebble.Reader, minKeys uint) (*presence, error) {
	p := &presence{minCap: max(minKeys, presenceMinCap)}
	var keys [][]byte
	for _, prefix := range []byte{pRecord, pFinger, pIdemKey, pOpKey} {
		it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
		if err != nil {
			return nil, fmt.Errorf("markers: scan keys: %w", err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			keys = append(keys, append([]byte(nil), it.Key()...))
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			return nil, fmt.Errorf("markers: scan keys: %w", err)
		}
	}
	p.grow(uint(len(keys)) * 2)
	for _, k := range keys {
		p.addLocked(k)
	}
	return p, nil
}

func (p *presence) grow(capacity uint) {
	p.cap = max(capacity, p.minCap)
	p.n = 0
	p.filters = append(p.filters, bloom.NewWithEstimates(p.cap, presenceFPRate))
}

func (p *presence) addLocked(key []byte) {
	if p.n >= p.cap {
		p.grow(p.cap * 4)
	}
	p.filters[len(p.filters)-1].Add(key)
	p.n++
}

// add records keys as present.
func (p *presence) add(keys ...[]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range keys {
		p.addLocked(k)
	}
}

// mayContain is false only for a key that was never written.
func (p *presence) mayContain(key []byte) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	locs := bloom.Locations(key, p.filters[0].K())
	for _, f := range p.filters {
		if f.TestLocations(locs) {
			return true
		}
	}
	return false
}
