package markers

import (
	"fmt"
	"io"
	"iter"

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
	base, err := readChainPos(r, metaBase)
	if err != nil {
		return err
	}
	return WriteExport(w, base, scanSeq(r, CheckpointFamily), scanSeq(r, EventFamily))
}

// scanSeq yields the entries of a family of sequence-numbered keys in order.
func scanSeq(r pebble.Reader, f Family) iter.Seq2[LogEntry, error] {
	return func(yield func(LogEntry, error) bool) {
		it, err := r.NewIter(&pebble.IterOptions{LowerBound: f.Start, UpperBound: f.End})
		if err != nil {
			yield(LogEntry{}, fmt.Errorf("markers: export: %w", err))
			return
		}
		defer it.Close()
		for ok := it.First(); ok; ok = it.Next() {
			seq, err := seqOf(it.Key())
			if !yield(LogEntry{Seq: seq, Value: it.Value()}, err) || err != nil {
				return
			}
		}
		if err := it.Error(); err != nil {
			yield(LogEntry{}, err)
		}
	}
}
