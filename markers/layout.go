package markers

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"time"
)

// The key layout (keys.go) for a journal backend other than Pebble: it keeps the same keys
// (under a prefix of its own), so both backends index alike and a journal copies between them
// key for key.

// RecordKey is the key of execution id's record.
func RecordKey(id string) []byte { return recordKey(id) }

// ResultKey is the key of execution id's stored result.
func ResultKey(id string) []byte { return resultKey(id) }

// EventKey is the key of event seq; EventKeys bounds every event key.
func EventKey(seq uint64) []byte { return seqKey(pEvent, seq) }

// CheckpointKey is the key of the checkpoint covering events 1..seq.
func CheckpointKey(seq uint64) []byte { return seqKey(pCheckpoint, seq) }

// Family is the [start, end) range of every key of one family.
type Family struct{ Start, End []byte }

var (
	EventFamily      = Family{[]byte{pEvent}, []byte{pEvent + 1}}
	CheckpointFamily = Family{[]byte{pCheckpoint}, []byte{pCheckpoint + 1}}
	RunTimeFamily    = Family{[]byte{pRunTime}, []byte{pRunTime + 1}}
	TimeFamily       = Family{[]byte{pTime}, []byte{pTime + 1}}
)

// ExecEventFamily holds the event index keys of execution id; ExecEventSeq parses one.
func ExecEventFamily(id string) Family { return family(append(joinKey(pExecEvents, id), 0)) }

// ExecEventSeq is the event sequence number at the end of an ExecEventFamily key.
func ExecEventSeq(key []byte) (uint64, error) {
	if len(key) < 9 {
		return 0, fmt.Errorf("%w: event index key of %d bytes", ErrCorrupt, len(key))
	}
	return seqOf(append([]byte{pEvent}, key[len(key)-8:]...))
}

// StateFamily holds the state index keys of state: the prefix, then the id.
func StateFamily(s State) Family { return family(append(joinKey(pState, string(s)), 0)) }

// SiblingFamily holds the sibling index keys of one intent: the prefix, then the id.
func SiblingFamily(actor, scope, fingerprint string) Family {
	return family(append(joinKey(pSiblings, actor, scope, fingerprint), 0))
}

func family(prefix []byte) Family { return Family{prefix, prefixEnd(prefix)} }

// TimeBound is the first time index key at or after t; TimeKeyID is the id of a time key.
func TimeBound(t time.Time) []byte { return timePrefix(t) }

func TimeKeyID(key []byte) string { return string(key[9:]) }

// FingerprintKey, IdempotencyKeyKey and OperationKeyKey are the pointer index keys whose
// value is the newest such execution's id.
func FingerprintKey(actor, scope, fp string) []byte { return fingerprintKey(actor, scope, fp) }
func IdempotencyKeyKey(space, key string) []byte    { return idempotencyKey(space, key) }
func OperationKeyKey(key string) []byte             { return operationKey(key) }

// PointerKeys are the pointer index keys a new record r takes over.
func PointerKeys(r *Record) [][]byte { return pointerKeys(r) }

// RunKey and RunTimeKey are the keys of an agent run and of its first-seen time index.
func RunKey(actor, scope string) []byte { return runKey(actor, scope) }
func RunTimeKey(r *Run) []byte          { return runTimeKey(r.FirstSeen, r.Actor, r.Scope) }

// HeadKey holds the chain head (a JSON ChainPos); BaseKey the position events were pruned
// through by retention (absent: none were).
func HeadKey() []byte { return metaHead }
func BaseKey() []byte { return metaBase }

// LogEntry is one stored event line or signed checkpoint with its sequence number.
type LogEntry struct {
	Seq   uint64
	Value []byte
}

// WriteExport writes the JSONL export of a log (see Store.Export) from base (the pruned
// prefix, Seq 0 if none), its checkpoints and its event lines, both in sequence order.
// Events up to the base, and checkpoints before it, are left out: a retention pass on etcd
// moves the base before it deletes them, in several transactions.
func WriteExport(w io.Writer, base ChainPos, checkpoints, events iter.Seq2[LogEntry, error]) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	line := func(b []byte) error {
		if _, err := bw.Write(b); err != nil {
			return err
		}
		return bw.WriteByte('\n')
	}
	nextCP, stop := iter.Pull2(checkpoints)
	defer stop()
	cp, cpErr, cpOK := nextCP()
	// checkpointsThrough writes every checkpoint up to seq.
	checkpointsThrough := func(seq uint64) error {
		for ; cpOK; cp, cpErr, cpOK = nextCP() {
			if cpErr != nil {
				return cpErr
			}
			if cp.Seq > seq {
				return nil
			}
			if cp.Seq < base.Seq {
				continue // left over by a pass interrupted before it deleted them
			}
			b, _ := json.Marshal(checkpointLine{Type: "checkpoint", Note: string(cp.Value)})
			if err := line(b); err != nil {
				return err
			}
		}
		return nil
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
	for ev, err := range events {
		if err != nil {
			return fmt.Errorf("markers: export: %w", err)
		}
		if ev.Seq <= base.Seq {
			continue // pruned: a pass sets the base before it deletes the events
		}
		if err := line(ev.Value); err != nil {
			return fmt.Errorf("markers: export: %w", err)
		}
		if err := checkpointsThrough(ev.Seq); err != nil {
			return err
		}
	}
	if err := checkpointsThrough(^uint64(0)); err != nil {
		return fmt.Errorf("markers: export: %w", err)
	}
	return bw.Flush()
}
