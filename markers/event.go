package markers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gowebpki/jcs"
)

// Event is one line of the hash-chained log: a record created, moved to a new state, or
// updated. Record is the whole record after the change, so the log alone tells the story of
// every execution.
type Event struct {
	Type        string          `json:"type"` // always "event"
	Seq         uint64          `json:"seq"`
	At          time.Time       `json:"at"`
	ExecutionID string          `json:"execution_id"`
	Kind        EventKind       `json:"kind"`
	From        State           `json:"from,omitempty"`
	To          State           `json:"to,omitempty"`
	Note        string          `json:"note,omitempty"`
	Record      json.RawMessage `json:"record"`
	PrevHash    string          `json:"prev_hash"`
	ThisHash    string          `json:"this_hash,omitempty"`
}

// EventKind says what an event did to its record.
type EventKind string

const (
	KindCreate     EventKind = "create"
	KindTransition EventKind = "transition"
	KindUpdate     EventKind = "update"
)

// genesisHash is the prev_hash of the first event of a store.
var genesisHash = hex.EncodeToString(make([]byte, sha256.Size))

// chainHash computes this_hash = SHA-256(prev_hash bytes ‖ RFC 8785 canonical JSON of the
// event without this_hash). Canonical JSON makes the hash independent of how a line was
// formatted, and covers every field present in the line, known to us or not.
func chainHash(prevHash string, eventWithoutHash []byte) (string, error) {
	prev, err := hex.DecodeString(prevHash)
	if err != nil || len(prev) != sha256.Size {
		return "", fmt.Errorf("prev_hash %q is not a hex SHA-256", prevHash)
	}
	canon, err := jcs.Transform(eventWithoutHash)
	if err != nil {
		return "", fmt.Errorf("canonicalize event: %w", err)
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(canon)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// seal fills ev.ThisHash and returns the event's line (JSON, no newline).
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
	return json.Marshal(ev)
}
