package markers

import (
	"crypto/rand"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// ExecutionIDPrefix starts every execution id.
const ExecutionIDPrefix = "ex_"

// FleetRunIDPrefix starts every fleet run id: the journal record of one fleet_exec call,
// whose hosts each get an execution of their own (Record.Fleet, Record.FleetRun).
const FleetRunIDPrefix = "fr_"

var idGen struct {
	mu      sync.Mutex // guards entropy, which is not safe for concurrent use
	entropy io.Reader
}

// NewExecutionID returns a new execution id: "ex_" + a ULID (48-bit millisecond time, 80
// random bits from crypto/rand, monotonic within a millisecond), so ids sort by creation
// time.
func NewExecutionID(now time.Time) (string, error) { return newID(ExecutionIDPrefix, now) }

// NewFleetRunID returns a new fleet run id: "fr_" + a ULID, made as execution ids are.
func NewFleetRunID(now time.Time) (string, error) { return newID(FleetRunIDPrefix, now) }

func newID(prefix string, now time.Time) (string, error) {
	idGen.mu.Lock()
	defer idGen.mu.Unlock()
	if idGen.entropy == nil {
		idGen.entropy = ulid.Monotonic(rand.Reader, 0)
	}
	id, err := ulid.New(ulid.Timestamp(now), idGen.entropy)
	if err != nil {
		return "", fmt.Errorf("markers: new id: %w", err)
	}
	return prefix + id.String(), nil
}

// ValidExecutionID reports whether id is "ex_" + a canonical ULID: 26 upper-case Crockford
// base32 characters. Only the canonical spelling is accepted so that one execution cannot be
// named two ways (stores key on the exact text).
func ValidExecutionID(id string) bool { return validID(ExecutionIDPrefix, id) }

// ValidFleetRunID reports whether id is "fr_" + a canonical ULID. A fleet run id never
// travels to a host: only its executions' ids do.
func ValidFleetRunID(id string) bool { return validID(FleetRunIDPrefix, id) }

// ValidJournalID reports whether id names a record of the bastion's journal: an execution
// or a fleet run.
func ValidJournalID(id string) bool { return ValidExecutionID(id) || ValidFleetRunID(id) }

func validID(prefix, id string) bool {
	text, ok := strings.CutPrefix(id, prefix)
	if !ok || len(text) != ulid.EncodedSize {
		return false
	}
	u, err := ulid.ParseStrict(text)
	return err == nil && u.String() == text
}

// ExecutionIDTime is when id was made (its ULID's millisecond time, on the clock of the
// bastion that made it), or ok false for a string that is not an execution id.
func ExecutionIDTime(id string) (t time.Time, ok bool) {
	if !ValidExecutionID(id) {
		return time.Time{}, false
	}
	u := ulid.MustParseStrict(id[len(ExecutionIDPrefix):])
	return ulid.Time(u.Time()), true
}
