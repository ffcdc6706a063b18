package markers

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"
)

// Export writes the event log as JSONL, one line per event in sequence order, each followed
// by the signed checkpoints that cover it. An export of a log pruned by retention starts with
// a base line and the checkpoint that attests it. The chain is sealed first, so an export
// always ends with a checkpoint — except from a store opened ReadOnly, which cannot sign:
// its export ends where the log ends, and verification reports any unsealed tail. Only
// durable events are exported.
func (s *Store) Export(w io.Writer) error {
	if err := s.readable(); err != nil {
		return err
	}
	if !s.opts.ReadOnly {
		if err := s.submit(&commitReq{seal: true}); err != nil {
			return fmt.Errorf("markers: seal before export: %w", err)
		}
	}
	s.commitMu.Lock()
	snap := s.db.NewSnapshot()
	s.commitMu.Unlock()
	defer snap.Close()
	return exportFrom(snap, w)
}

func exportFrom(r pebble.Reader, w io.Writer) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	base, err := readChainPos(r, metaBase)
	if err != nil {
		return err
	}
	line := func(b []byte) error {
		if _, err := bw.Write(b); err != nil {
			return err
		}
		return bw.WriteByte('\n')
	}
	cps, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{pCheckpoint}, UpperBound: []byte{pCheckpoint + 1}})
	if err != nil {
		return fmt.Errorf("markers: export: %w", err)
	}
	defer cps.Close()
	cpOK := cps.First()
	// checkpointsThrough writes every checkpoint up to seq.
	checkpointsThrough := func(seq uint64) error {
		for ; cpOK; cpOK = cps.Next() {
			cpSeq, err := seqOf(cps.Key())
			if err != nil {
				return err
			}
			if cpSeq > seq {
				return nil
			}
			b, _ := json.Marshal(checkpointLine{Type: "checkpoint", Note: string(cps.Value())})
			if err := line(b); err != nil {
				return err
			}
		}
		return cps.Error()
	}
	if base.Seq > 0 {
		b, _ := json.Marshal(baseLine{Type: "base", Seq: base.Seq, Hash: base.Hash})
		if err := line(b); err != nil {
			return err
		}
	}
	if err := checkpointsThrough(base.Seq); err != nil {
		return err
	}
	evs, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{pEvent}, UpperBound: []byte{pEvent + 1}})
	if err != nil {
		return fmt.Errorf("markers: export: %w", err)
	}
	defer evs.Close()
	for ok := evs.First(); ok; ok = evs.Next() {
		seq, err := seqOf(evs.Key())
		if err != nil {
			return err
		}
		if err := line(evs.Value()); err != nil {
			return fmt.Errorf("markers: export: %w", err)
		}
		if err := checkpointsThrough(seq); err != nil {
			return err
		}
	}
	if err := errors.Join(evs.Error(), checkpointsThrough(^uint64(0))); err != nil {
		return fmt.Errorf("markers: export: %w", err)
	}
	return bw.Flush()
}
