package markers

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Event is one line of the hash-chained log: a record created, moved to a new state, or
// updated. Record is the whole record after the change, so the log alone tells the story of
// every execution.
type Event struct {
	Type        string    `json:"type"` // always "event"
	Seq         uint64    `json:"seq"`
	At          time.Time `json:"at"`
	ExecutionID string    `json:"execution_id"`
	Kind        EventKind `json:"kind"`
	From        State     `json:"from,omitempty"`
	To          State     `json:"to,omitempty"`
	Note        string    `json:"note,omitempty"`
	// Call is the tool call behind a create, joined or delivery event, when the bastion
	// knows it.
	Call *Call `json:"call,omitempty"`
	// Carried (a carried event): the event lines of its execution that a retention pass
	// pruned from the chain's prefix while the execution was still held, as they were.
	Carried  []json.RawMessage `json:"carried,omitempty"`
	Record   json.RawMessage   `json:"record"`
	PrevHash string            `json:"prev_hash"`
	ThisHash string            `json:"this_hash,omitempty"`
}

// DecodedRecord is the record the event carries, as it stood after the event.
func (ev *Event) DecodedRecord() (*Record, error) {
	return DecodeRecord(append([]byte{recordVersion}, ev.Record...))
}

// EventKind says what an event did to its record.
type EventKind string

const (
	KindCreate     EventKind = "create"
	KindTransition EventKind = "transition"
	KindUpdate     EventKind = "update"
	// KindDeliveryRevoked clears a record's result_delivered_at: the client that was handed
	// the result abandoned its request (notifications/cancelled), so the result counts as
	// never delivered and a retry replays it.
	KindDeliveryRevoked EventKind = "delivery_revoked"
	// KindCarried changes nothing in its record: a retention pass pruning the chain's prefix
	// copied the record's events in it forward (Event.Carried), so that an execution still
	// held keeps its story in the journal.
	KindCarried EventKind = "carried"
)

// genesisHash is the prev_hash of the first event of a store.
var genesisHash = hex.EncodeToString(make([]byte, sha256.Size))

// An event line is its body — the JSON object without this_hash, in the field order of
// Event — with `,"this_hash":"<hex>"` spliced in before the closing brace:
//
//	this_hash = SHA-256(prev_hash bytes ‖ body)
//
// The hash covers the exact bytes of the line, so any change to it, reformatting included,
// breaks the chain; no canonicalization is needed on the hot path or in verify.
const hashField = `,"this_hash":"`

func chainHash(prevHash string, body []byte) (string, error) {
	prev, err := hex.DecodeString(prevHash)
	if err != nil || len(prev) != sha256.Size {
		return "", fmt.Errorf("prev_hash %q is not a hex SHA-256", prevHash)
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// seal fills ev.ThisHash and returns the event's line (no newline). The body is written by
// appendBody, byte for byte what json.Marshal makes of the event without this_hash, but
// without reflection and without re-scanning the record (json.Marshal validates and compacts
// a RawMessage: the biggest part of an event, already compact JSON from EncodeRecord).
func (ev *Event) seal() ([]byte, error) {
	ev.Type = "event"
	ev.ThisHash = ""
	var prev [sha256.Size]byte
	if n, err := hex.Decode(prev[:], []byte(ev.PrevHash)); err != nil || n != sha256.Size || len(ev.PrevHash) != 2*sha256.Size {
		return nil, fmt.Errorf("markers: event %d: prev_hash %q is not a hex SHA-256", ev.Seq, ev.PrevHash)
	}
	line := make([]byte, 0, len(ev.Record)+len(ev.Note)+len(ev.ExecutionID)+256+len(hashField)+2*sha256.Size)
	line, err := ev.appendBody(line)
	if err != nil {
		return nil, fmt.Errorf("markers: encode event %d: %w", ev.Seq, err)
	}
	// body is line + "}": hash it without the closing brace in place.
	h := sha256.New()
	h.Write(prev[:])
	h.Write(line)
	h.Write([]byte{'}'})
	var sum [sha256.Size]byte
	ev.ThisHash = hex.EncodeToString(h.Sum(sum[:0]))
	line = append(line, hashField...)
	line = append(line, ev.ThisHash...)
	return append(line, '"', '}'), nil
}

// appendBody appends the event's JSON without this_hash and without its closing brace.
func (ev *Event) appendBody(b []byte) ([]byte, error) {
	b = append(b, `{"type":`...)
	b = appendJSONString(b, ev.Type)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, ev.Seq, 10)
	b = append(b, `,"at":`...)
	if y := ev.At.Year(); y >= 0 && y <= 9999 && ev.At.Location() == time.UTC {
		b = append(b, '"')
		b = ev.At.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	} else { // rare: let json.Marshal format it, or report its error
		at, err := json.Marshal(ev.At)
		if err != nil {
			return nil, err
		}
		b = append(b, at...)
	}
	b = append(b, `,"execution_id":`...)
	b = appendJSONString(b, ev.ExecutionID)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, string(ev.Kind))
	if ev.From != "" {
		b = append(b, `,"from":`...)
		b = appendJSONString(b, string(ev.From))
	}
	if ev.To != "" {
		b = append(b, `,"to":`...)
		b = appendJSONString(b, string(ev.To))
	}
	if ev.Note != "" {
		b = append(b, `,"note":`...)
		b = appendJSONString(b, ev.Note)
	}
	if ev.Call != nil { // rare (one event per tool call): json.Marshal writes it as it would in place
		call, err := json.Marshal(ev.Call)
		if err != nil {
			return nil, err
		}
		b = append(b, `,"call":`...)
		b = append(b, call...)
	}
	if len(ev.Carried) > 0 { // rare (retention): each line is a compact event line already
		b = append(b, `,"carried":[`...)
		for i, line := range ev.Carried {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, line...)
		}
		b = append(b, ']')
	}
	b = append(b, `,"record":`...)
	if len(ev.Record) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, ev.Record...)
	}
	b = append(b, `,"prev_hash":`...)
	return appendJSONString(b, ev.PrevHash), nil
}

// appendJSONString appends s as json.Marshal writes it. Strings of plain printable ASCII
// (every id, state and hash, most notes) are copied; anything else goes through json.Marshal.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// splitLine recovers the body and this_hash of an event line.
func splitLine(line []byte) (body []byte, thisHash string, ok bool) {
	const tail = sha256.Size*2 + 2 // hex + `"}`
	n := len(line) - tail - len(hashField)
	if n < 1 || string(line[n:n+len(hashField)]) != hashField || string(line[len(line)-2:]) != `"}` {
		return nil, "", false
	}
	body = append(append(make([]byte, 0, n+1), line[:n]...), '}')
	return body, string(line[n+len(hashField) : len(line)-2]), true
}

// StoryOf is the events of one record as Events returns them: each carried event replaced
// by the events it carries (a pass interrupted between carrying and pruning may have
// carried some twice: each appears once), in sequence order.
func StoryOf(evs []Event) ([]Event, error) {
	out := make([]Event, 0, len(evs))
	seen := make(map[uint64]bool, len(evs))
	add := func(ev Event) {
		if !seen[ev.Seq] {
			seen[ev.Seq] = true
			out = append(out, ev)
		}
	}
	for _, ev := range evs {
		if ev.Kind != KindCarried {
			add(ev)
			continue
		}
		for _, line := range ev.Carried {
			var c Event
			if err := json.Unmarshal(line, &c); err != nil {
				return nil, fmt.Errorf("%w: event %d carries a line that is no event: %v", ErrCorrupt, ev.Seq, err)
			}
			add(c)
		}
	}
	slices.SortFunc(out, func(a, b Event) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}
