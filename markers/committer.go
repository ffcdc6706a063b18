package markers

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// submit commits req through the group-commit queue and returns once its group is durable
// (or failed); see groupcommit.Queue.Commit.
func (s *Store) submit(req *commitReq) error {
	s.mu.RLock() // held until the write is done, so Close waits for it
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	if s.opts.ReadOnly {
		return ErrReadOnly
	}
	if req.Write != nil {
		s.indexMu.RLock()
		defer s.indexMu.RUnlock()
	}
	return s.writes.Commit(req)
}

// sealPeriodically seals the chain every CheckpointInterval while there are unsealed events.
func (s *Store) sealPeriodically() {
	defer s.wg.Done()
	ticker := time.NewTicker(s.opts.CheckpointInterval)
	defer ticker.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-ticker.C:
			if err := s.submit(&commitReq{seal: true}); err != nil && !errors.Is(err, ErrClosed) {
				s.log.Error("periodic checkpoint failed", "err", err)
			}
		}
	}
}

// commitGroup writes the records, index entries and chained events of group, plus a
// checkpoint when one is due (or forced and anything is unsealed), in one synced batch.
func (s *Store) commitGroup(group []*commitReq) {
	forceSeal := false
	if s.broken != nil {
		for _, r := range group {
			r.Answer(fmt.Errorf("%w: %v", ErrBroken, s.broken))
		}
		return
	}
	b := s.db.NewBatch()
	defer b.Close()
	head := s.head
	committed := group[:0:0]
	staged := uint64(0)
	// The group is one batch: it is synced if any of its writes asks for it (a checkpoint
	// always does), which also makes every earlier unsynced write durable (see NoSync).
	synced := false
	for _, r := range group {
		if r.seal {
			forceSeal = true
			committed = append(committed, r)
			continue
		}
		next, err := s.stage(b, head, r)
		if err != nil {
			r.Answer(err)
			continue
		}
		head = next
		staged += uint64(len(r.steps))
		committed = append(committed, r)
		synced = synced || r.durability == Sync
	}
	sealing := head.Seq > s.sealedSeq &&
		(forceSeal || head.Seq-s.sealedSeq >= uint64(s.opts.CheckpointEvery))
	now := s.opts.Now()
	if sealing {
		synced = true
		signed, err := signCheckpoint(s.opts.Signer, s.opts.Origin, head.Seq, head.Hash, now)
		if err != nil {
			s.fail(committed, fmt.Errorf("sign checkpoint %d: %w", head.Seq, err))
			return
		}
		if err := b.Set(seqKey(pCheckpoint, head.Seq), signed, nil); err != nil {
			s.fail(committed, err)
			return
		}
	}
	if staged == 0 && !sealing {
		for _, r := range committed {
			r.Answer(nil)
		}
		return
	}
	pos, _ := json.Marshal(head)
	if err := b.Set(metaHead, pos, nil); err != nil {
		s.fail(committed, err)
		return
	}
	wo := pebble.NoSync
	if synced {
		wo = pebble.Sync
	}
	s.commitMu.Lock()
	err := s.commit(b, wo)
	s.commitMu.Unlock()
	if err != nil {
		s.fail(committed, fmt.Errorf("commit: %w", err))
		return
	}
	s.head = head
	s.headSeq.Store(head.Seq)
	if sealing {
		s.sealedSeq = head.Seq
		s.lastSealAt = now
	}
	var created [][]byte
	for _, r := range committed {
		if r.Write != nil && r.prev == nil {
			created = append(append(created, recordKey(r.rec.ID)), pointerKeys(r.rec)...)
		}
	}
	if len(created) > 0 {
		s.present.add(created...)
	}
	if synced {
		s.commits.Add(1)
	} else {
		s.unsynced.Add(1)
	}
	s.events.Add(staged)
	for _, r := range committed {
		if r.Write != nil {
			s.records.put(r.rec)
		}
	}
	for _, r := range committed {
		r.Answer(nil)
	}
}

// stage adds one request's writes to b and returns the new chain head.
func (s *Store) stage(b *pebble.Batch, head ChainPos, r *commitReq) (ChainPos, error) {
	events, next, err := r.Chain(head)
	if err != nil {
		return head, err
	}
	set := func(k, v []byte) {
		if err == nil {
			err = b.Set(k, v, nil)
		}
	}
	for _, kv := range r.ChainKeys(events) {
		set(kv.Key, kv.Value)
	}
	if run := r.NewRun(); run != nil && err == nil {
		err = s.stageRun(b, run)
	}
	puts, dels := r.Mutations()
	for _, k := range dels {
		if err == nil {
			err = b.Delete(k, nil)
		}
	}
	for _, f := range r.DeleteRanges() {
		if err == nil {
			err = b.DeleteRange(f.Start, f.End, nil)
		}
	}
	for _, kv := range puts {
		set(kv.Key, kv.Value)
	}
	if err != nil {
		return head, fmt.Errorf("markers: stage %s: %w", r.rec.ID, err)
	}
	return next, nil
}

// fail marks the store broken after a failed durable write: nothing may proceed on it, and
// every later write is refused until the store is reopened (which recovers the durable head).
func (s *Store) fail(group []*commitReq, err error) {
	s.broken = err
	s.log.Error("durable write failed; refusing further writes", "err", err)
	for _, r := range group {
		r.Answer(fmt.Errorf("%w: %v", ErrBroken, err))
	}
}
