package markers

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/mod/sumdb/note"
)

// Report is the outcome of a verification.
type Report struct {
	OK     bool   `json:"ok"`
	Origin string `json:"origin,omitempty"`
	// FirstSeq..LastSeq is the range of events whose chain verified.
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	Events   uint64 `json:"events"`
	// SealedSeq is the last event covered by a valid checkpoint; events after it are the
	// unsealed tail (chained, but not yet attested by a signature).
	SealedSeq    uint64 `json:"sealed_seq"`
	Checkpoints  int    `json:"checkpoints"`
	UnsealedTail uint64 `json:"unsealed_tail"`
	Records      int    `json:"records,omitempty"`
	// PrunedThrough: events 1..PrunedThrough were pruned by retention; the log starts with
	// a base line there, attested by the checkpoint signed at PrunedAt. Exports made before
	// the pass hold them (see VerifyOptions.Joins).
	PrunedThrough uint64    `json:"pruned_through,omitempty"`
	PrunedHash    string    `json:"pruned_hash,omitempty"`
	PrunedAt      time.Time `json:"pruned_at,omitzero"`
	// Joins: the log holds event VerifyOptions.Joins with that hash (an archive reaching
	// the start of a pruned journal).
	Joins bool `json:"joins,omitempty"`
	// BadLine (1-based line of the JSONL) and BadSeq name the first bad record; Reason says why.
	BadLine int    `json:"bad_line,omitempty"`
	BadSeq  uint64 `json:"bad_seq,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

func (r Report) String() string {
	var b strings.Builder
	if r.OK {
		b.WriteString("PASS")
	} else {
		fmt.Fprintf(&b, "FAIL at line %d", r.BadLine)
		if r.BadSeq > 0 {
			fmt.Fprintf(&b, " (seq %d)", r.BadSeq)
		}
		fmt.Fprintf(&b, ": %s\n", r.Reason)
	}
	if r.PrunedThrough > 0 {
		fmt.Fprintf(&b, "  events 1..%d pruned by retention (attested by the checkpoint of %s; exports made before hold them)\n",
			r.PrunedThrough, r.PrunedAt.UTC().Format(time.RFC3339))
	}
	if r.Events > 0 {
		fmt.Fprintf(&b, "  validated events %d..%d (%d)", r.FirstSeq, r.LastSeq, r.Events)
	} else {
		b.WriteString("  no events validated")
	}
	fmt.Fprintf(&b, ", sealed through %d by %d checkpoint(s), unsealed tail %d", r.SealedSeq, r.Checkpoints, r.UnsealedTail)
	if r.Records > 0 {
		fmt.Fprintf(&b, ", %d records match their last event", r.Records)
	}
	if r.Joins {
		b.WriteString(", and reaches the start of the pruned log")
	}
	return b.String()
}

// VerifyOptions tune a verification.
type VerifyOptions struct {
	// RequireSealed fails a log whose last events are not covered by a checkpoint. Exports
	// always end sealed, so for an archived export a missing seal means it was truncated.
	RequireSealed bool
	// Joins, if set, fails a log that does not hold an event at Joins.Seq with hash
	// Joins.Hash: an archive (an export made before a retention pass) must reach the base of
	// the pruned log it archives, so that the two verify as one chain.
	Joins *ChainPos
}

// maxLineBytes bounds one JSONL line; records are far smaller.
const maxLineBytes = 4 << 20

// VerifyJSONL checks an exported log against the audit verifier key (the text in
// <audit key>.pub). Tampering is reported in the Report (OK false), not as an error; the
// error is for reading failures only.
func VerifyJSONL(r io.Reader, verifierKey string, opts VerifyOptions) (Report, error) {
	v, err := newChainVerifier(verifierKey)
	if err != nil {
		return Report{}, err
	}
	v.joins = opts.Joins
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, errTruncatedLine) && !errors.Is(err, errLongLine) {
			return v.rep, fmt.Errorf("markers: verify: read: %w", err)
		}
		v.line++
		if err != nil {
			v.fail(0, err.Error())
			break
		}
		if !v.add(line) {
			break
		}
	}
	v.finish(opts)
	return v.rep, nil
}

var (
	errTruncatedLine = errors.New("truncated: the last line has no newline")
	errLongLine      = fmt.Errorf("line longer than %d bytes", maxLineBytes)
)

func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > maxLineBytes {
			return nil, errLongLine
		}
		switch {
		case err == nil:
			return buf[:len(buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0:
			return buf, errTruncatedLine
		default:
			return nil, err
		}
	}
}

// VerifyDir verifies a store's data dir offline (the store must not be open elsewhere): the
// event chain and checkpoints as VerifyJSONL does, and that every record equals the record
// in its last event.
func VerifyDir(dir, verifierKey string, opts VerifyOptions) (Report, error) {
	o := Options{Graph: JournalGraph}
	o.EnsureDefaults()
	db, err := openPebble(dir, &o, true)
	if err != nil {
		return Report{}, err
	}
	defer db.Close()
	var buf bytes.Buffer
	if err := exportFrom(db, &buf); err != nil {
		return Report{}, err
	}
	rep, err := VerifyJSONL(&buf, verifierKey, opts)
	if err != nil || !rep.OK {
		return rep, err
	}
	return verifyRecords(db, rep)
}

// verifyRecords checks every record against the record carried by its newest event.
func verifyRecords(db *pebble.DB, rep Report) (Report, error) {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{pRecord}, UpperBound: []byte{pRecord + 1}})
	if err != nil {
		return rep, fmt.Errorf("markers: verify records: %w", err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		id := string(it.Key()[1:])
		stored := it.Value()
		if _, err := DecodeRecord(stored); err != nil {
			rep.OK, rep.Reason = false, fmt.Sprintf("record %s: %v", id, err)
			return rep, nil
		}
		prefix := append(joinKey(pExecEvents, id), 0)
		ei, err := db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
		if err != nil {
			return rep, err
		}
		var last []byte
		if ei.Last() {
			last = append([]byte{pEvent}, ei.Key()[len(prefix):]...)
		}
		if err := errors.Join(ei.Error(), ei.Close()); err != nil {
			return rep, err
		}
		if last == nil {
			rep.OK, rep.Reason = false, fmt.Sprintf("record %s has no event", id)
			return rep, nil
		}
		v, closer, err := db.Get(last)
		if errors.Is(err, pebble.ErrNotFound) {
			continue // its events were pruned by retention
		}
		if err != nil {
			return rep, err
		}
		var ev Event
		err = json.Unmarshal(v, &ev)
		closer.Close()
		if err != nil {
			return rep, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if !bytes.Equal(ev.Record, stored[1:]) {
			seq, _ := seqOf(last)
			rep.OK, rep.BadSeq = false, seq
			rep.Reason = fmt.Sprintf("record %s differs from its last event", id)
			return rep, nil
		}
		rep.Records++
	}
	return rep, it.Error()
}

// chainVerifier checks lines one at a time.
type chainVerifier struct {
	verifiers note.Verifiers
	rep       Report
	line      int
	prevSeq   uint64
	prevHash  string
	started   bool   // an event or base was seen
	baseSeq   uint64 // a base line awaiting its attesting checkpoint
	baseOpen  bool
	lastCP    uint64
	joins     *ChainPos
}

func newChainVerifier(verifierKey string) (*chainVerifier, error) {
	nv, err := note.NewVerifier(strings.TrimSpace(verifierKey))
	if err != nil {
		return nil, fmt.Errorf("markers: verifier key: %w", err)
	}
	return &chainVerifier{verifiers: note.VerifierList(nv), prevHash: genesisHash, rep: Report{OK: true}}, nil
}

func (v *chainVerifier) fail(seq uint64, reason string) {
	v.rep.OK, v.rep.BadLine, v.rep.BadSeq, v.rep.Reason = false, v.line, seq, reason
}

// add checks one line; false stops the verification at the first bad line.
func (v *chainVerifier) add(line []byte) bool {
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(line, &head); err != nil {
		v.fail(0, fmt.Sprintf("not a JSON object: %v", err))
		return false
	}
	switch head.Type {
	case "event":
		return v.addEvent(line)
	case "checkpoint":
		return v.addCheckpoint(line)
	case "base":
		return v.addBase(line)
	default:
		v.fail(0, fmt.Sprintf("unknown line type %q", head.Type))
		return false
	}
}

func (v *chainVerifier) addBase(line []byte) bool {
	var b baseLine
	if err := json.Unmarshal(line, &b); err != nil || v.started {
		v.fail(0, "a base line may only open the log")
		return false
	}
	v.started, v.baseOpen, v.baseSeq = true, true, b.Seq
	v.prevSeq, v.prevHash = b.Seq, b.Hash
	v.rep.PrunedThrough, v.rep.PrunedHash = b.Seq, b.Hash
	return true
}

func (v *chainVerifier) addEvent(line []byte) bool {
	var ev Event
	if err := json.Unmarshal(line, &ev); err != nil {
		v.fail(0, fmt.Sprintf("event is not valid JSON: %v", err))
		return false
	}
	if v.baseOpen {
		v.fail(ev.Seq, fmt.Sprintf("base %d is not attested by a checkpoint", v.baseSeq))
		return false
	}
	switch {
	case ev.Seq <= v.prevSeq:
		v.fail(ev.Seq, fmt.Sprintf("out of order: seq %d after %d", ev.Seq, v.prevSeq))
		return false
	case ev.Seq != v.prevSeq+1:
		v.fail(ev.Seq, fmt.Sprintf("gap: seq %d follows %d (events %d..%d missing or reordered)", ev.Seq, v.prevSeq, v.prevSeq+1, ev.Seq-1))
		return false
	case ev.PrevHash != v.prevHash:
		v.fail(ev.Seq, "prev_hash does not match the previous event's hash")
		return false
	}
	body, thisHash, ok := splitLine(line)
	if !ok || thisHash != ev.ThisHash {
		v.fail(ev.Seq, "this_hash is not the last field of the event line")
		return false
	}
	want, err := chainHash(ev.PrevHash, body)
	if err != nil {
		v.fail(ev.Seq, err.Error())
		return false
	}
	if want != ev.ThisHash {
		v.fail(ev.Seq, "this_hash does not match the event's content")
		return false
	}
	if _, err := DecodeRecord(append([]byte{recordVersion}, ev.Record...)); err != nil {
		v.fail(ev.Seq, fmt.Sprintf("event record: %v", err))
		return false
	}
	if !v.started || v.rep.Events == 0 {
		v.rep.FirstSeq = ev.Seq
	}
	v.started = true
	v.prevSeq, v.prevHash = ev.Seq, ev.ThisHash
	v.rep.LastSeq = ev.Seq
	v.rep.Events++
	if v.joins != nil && ev.Seq == v.joins.Seq {
		if ev.ThisHash != v.joins.Hash {
			v.fail(ev.Seq, fmt.Sprintf("event %d differs from the one the pruned log starts after (hash %s, not %s): not the same chain", ev.Seq, ev.ThisHash, v.joins.Hash))
			return false
		}
		v.rep.Joins = true
	}
	return true
}

func (v *chainVerifier) addCheckpoint(line []byte) bool {
	var cl checkpointLine
	if err := json.Unmarshal(line, &cl); err != nil {
		v.fail(0, fmt.Sprintf("checkpoint line: %v", err))
		return false
	}
	cp, err := openCheckpoint([]byte(cl.Note), v.verifiers)
	if err != nil {
		v.fail(0, err.Error())
		return false
	}
	switch {
	case v.rep.Origin != "" && cp.Origin != v.rep.Origin:
		v.fail(cp.Seq, fmt.Sprintf("checkpoint origin %q differs from %q", cp.Origin, v.rep.Origin))
		return false
	case cp.Seq > v.prevSeq:
		v.fail(cp.Seq, fmt.Sprintf("truncated: checkpoint covers seq %d but the log ends at %d", cp.Seq, v.prevSeq))
		return false
	case cp.Seq < v.prevSeq || cp.Seq < v.lastCP:
		v.fail(cp.Seq, fmt.Sprintf("checkpoint for seq %d is out of place after seq %d", cp.Seq, v.prevSeq))
		return false
	case cp.Head != v.prevHash:
		v.fail(cp.Seq, "checkpoint head hash does not match the chain")
		return false
	}
	v.rep.Origin = cp.Origin
	if v.baseOpen {
		v.rep.PrunedAt = cp.At
	}
	v.baseOpen = false
	v.lastCP = cp.Seq
	v.rep.SealedSeq = cp.Seq
	v.rep.Checkpoints++
	return true
}

func (v *chainVerifier) finish(opts VerifyOptions) {
	if !v.rep.OK {
		return
	}
	if v.baseOpen {
		v.fail(v.baseSeq, fmt.Sprintf("base %d is not attested by a checkpoint", v.baseSeq))
		return
	}
	if opts.RequireSealed && v.line == 0 {
		v.fail(0, "the log is empty: nothing in it is sealed (an export cut before its first line, or the wrong file)")
		return
	}
	v.rep.UnsealedTail = v.prevSeq - v.lastCP
	if opts.RequireSealed && v.rep.UnsealedTail > 0 {
		v.fail(v.lastCP+1, fmt.Sprintf("truncated or unsealed: %d events after the last checkpoint", v.rep.UnsealedTail))
		return
	}
	if j := opts.Joins; j != nil && !v.rep.Joins {
		first := v.rep.PrunedThrough + 1
		if v.rep.Events > 0 {
			first = v.rep.FirstSeq
		}
		v.fail(0, fmt.Sprintf("it holds events %d..%d, not event %d where the pruned log starts: events in between are in neither (export before every retention pass)", first, v.prevSeq, j.Seq))
	}
}
