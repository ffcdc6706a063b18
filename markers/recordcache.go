package markers

import (
	"container/list"
	"sync"
)

// recordCache keeps the decoded records of the most recently used executions, so that a
// write does not JSON-decode the record it is about to change, nor a read the record it
// returns.
//
// Coherence rests on the per-id lock: an entry is only put or dropped while its id's lock is
// held — by a read that decoded the stored record, by the writer whose batch just committed
// (the commit leader puts it while that writer waits, lock held, for its reply), or by GC
// removing the record — so an entry is always the record as last committed. Entries are
// shared and never mutated: the store hands callers clones.
type recordCache struct {
	max int // entries; 0 disables the cache

	mu   sync.Mutex // guards byID and lru
	byID map[string]*list.Element
	lru  list.List // of *Record, most recently used first
}

func newRecordCache(entries int) *recordCache {
	return &recordCache{max: max(entries, 0), byID: make(map[string]*list.Element)}
}

// get returns the cached record of id (shared: not to be mutated), or nil.
func (c *recordCache) get(id string) *Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.byID[id]
	if e == nil {
		return nil
	}
	c.lru.MoveToFront(e)
	return e.Value.(*Record)
}

// put caches rec as its id's committed record, evicting the least recently used entry past
// the bound. rec must not be mutated afterwards.
func (c *recordCache) put(rec *Record) {
	if c.max == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.byID[rec.ID]; e != nil {
		e.Value = rec
		c.lru.MoveToFront(e)
		return
	}
	c.byID[rec.ID] = c.lru.PushFront(rec)
	if c.lru.Len() > c.max {
		oldest := c.lru.Back()
		c.lru.Remove(oldest)
		delete(c.byID, oldest.Value.(*Record).ID)
	}
}

// drop forgets id's record.
func (c *recordCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.byID[id]; e != nil {
		c.lru.Remove(e)
		delete(c.byID, id)
	}
}
