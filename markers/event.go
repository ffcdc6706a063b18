package markers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
	Call     *Call           `json:"call,omitempty"`
	Record   json.RawMessage `json:"record"`
	PrevHash string          `json:"prev_hash"`
	ThisHash string          `json:"this_hash,omitempty"`
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

// seal fills ev.ThisHash and returns the event's line (no newline).
func (ev *Event) seal() ([]byte, error) {
	ev.Type = "event"
	ev.ThisHash = ""
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("markers: encode event %d: %w", ev.Seq, err)
	}
	ev.ThisHash, err = chainHash(ev.PrevHash, body)
	if err != nil {
		return nil, fmt.Errorf("markers: event %d: %w", ev.Seq, err)
	}
	line := make([]byte, 0, len(body)+len(hashField)+sha256.Size*2+2)
	line = append(line, body[:len(body)-1]...)
	line = append(line, hashField...)
	line = append(line, ev.ThisHash...)
	return append(line, '"', '}'), nil
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
