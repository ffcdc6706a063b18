package markers

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"
)

// Record is one execution: the bastion's journal entry or a host's marker. Fields that a graph
// does not use stay empty. Identity fields (ID, Graph, Actor, IntentScope, Fingerprint,
// IdempotencyKey, Principal, OperationKey, PreviousAttempt, RecoveredFrom, CreatedAt) are fixed
// at creation: the secondary indexes are built from them.
type Record struct {
	ID    string `json:"id"`
	Graph Graph  `json:"graph"`
	State State  `json:"state"`

	Actor string `json:"actor,omitempty"`
	// PolicyActor is the configured actor the bastion's policy decided the execution for
	// (bastion/policy); its limits count the execution.
	PolicyActor    string `json:"policy_actor,omitempty"`
	IntentScope    string `json:"intent_scope,omitempty"`
	Fingerprint    string `json:"fingerprint,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Principal (journal) holds the execution's idempotency key: the principal of the actor
	// that created it, or that actor itself when it belongs to none. A record that names one
	// has its key in SharedKeySpace; one made before principals existed has none, and its key
	// is in its actor's own space (KeySpace).
	Principal    string `json:"principal,omitempty"`
	OperationKey string `json:"operation_key,omitempty"`
	// PreviousAttempt is the execution this one is a new attempt of: a keyed request whose
	// execution ended failed (provably no effect) starts a new execution linked to it, and the
	// idempotency-key index then names the new one.
	PreviousAttempt string `json:"previous_attempt,omitempty"`
	// RecoveredFrom (journal) names the host whose marker this record was rebuilt from after
	// the journal lost it (`postern recover --from-hosts`): its actor, scope and calls were
	// lost with the journal (Actor and IntentScope are empty), its Fingerprint is the one the
	// marker kept. The bastion never drives such an execution — it waits for an operator's
	// review — and a call whose fingerprint names it is answered with it, never run again.
	RecoveredFrom string `json:"recovered_from,omitempty"`

	// What the execution does, as a summary for operators (the fingerprint covers the full
	// canonical action record; secrets never appear here).
	Tool    string   `json:"tool,omitempty"`
	Channel string   `json:"channel,omitempty"`
	Target  string   `json:"target,omitempty"`
	Account string   `json:"account,omitempty"`
	Command []string `json:"command,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	Class   string   `json:"class,omitempty"`
	// Decision is the policy's outcome for the execution (authorized, awaiting_approval or
	// rejected), fixed when it is accepted: a restart never re-decides. Rule names the policy
	// rule (or default) that decided it.
	Decision string `json:"decision,omitempty"`
	Rule     string `json:"rule,omitempty"`
	// Reason is why the agent says it wants the execution (its call's reason), shown to
	// whoever is asked to approve it.
	Reason string `json:"reason,omitempty"`
	// Replica (journal, replicas on etcd) is the bastion replica that drives the execution
	// or drove it last: the one that accepted, approved or dispatched it, or took it over
	// from another (an update event says from whom). Empty on a single node.
	Replica string `json:"replica,omitempty"`
	// Host is the inventory name of the target host (SSH) or the endpoint's name (HTTP).
	Host string `json:"host,omitempty"`
	// Request is what an HTTP execution sends (method, URL, headers, body — never the
	// credential), kept so the same request can be sent again under the same id.
	Request json.RawMessage `json:"request,omitempty"`
	// Env and TimeoutSeconds complete what the bastion needs to dispatch the execution again
	// after a restart (never secrets: secrets are resolved at dispatch, not stored).
	Env            map[string]string `json:"env,omitempty"`
	TimeoutSeconds int               `json:"timeout_s,omitempty"`

	CreatedAt  time.Time           `json:"created_at"`
	UpdatedAt  time.Time           `json:"updated_at"`
	StateTimes map[State]time.Time `json:"state_times,omitempty"`

	// Outcome.
	ExitCode   *int   `json:"exit_code,omitempty"`
	Signal     string `json:"signal,omitempty"`
	HTTPStatus int    `json:"http_status,omitempty"`
	IsError    bool   `json:"is_error,omitempty"`
	ResultRef  string `json:"result_ref,omitempty"`
	Output     Output `json:"output,omitzero"`
	// Evidence are human-readable notes on how the outcome is known (or why it is not).
	Evidence []string `json:"evidence,omitempty"`
	// ReviewRequired (journal): the outcome is unknown and nothing Postern can ask or send
	// will settle it — only an operator's review. It holds only while the record is unknown:
	// the store clears it on every transition out of unknown.
	ReviewRequired bool `json:"review_required,omitempty"`
	// StartError says why the command provably did not start: a host marker in start_failed
	// (e.g. "cwd /srv/app does not exist"), and the journal record of the failed execution.
	StartError        string     `json:"start_error,omitempty"`
	ResultDeliveredAt *time.Time `json:"result_delivered_at,omitempty"`
	// OperationTakenBy is the execution the host named as the holder of this execution's
	// operation key when it refused to start this one. It may belong to another actor: it is
	// for operators, and shown to an agent only when the agent owns that execution.
	OperationTakenBy string `json:"operation_taken_by,omitempty"`
	// FleetRun (an execution) is the fleet run it is one host's part of (fr_…); Fleet (a
	// fleet run) is what that run carries out: the hosts it selected and its brakes.
	FleetRun string   `json:"fleet_run,omitempty"`
	Fleet    *Rollout `json:"fleet,omitempty"`

	// Host process (hostagent markers).
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	SpoolDir string `json:"spool_dir,omitempty"`
	// BootID is the host's boot (/proc/sys/kernel/random/boot_id) the marker was created in:
	// the spool's records are not synced, so they prove nothing about a marker of an earlier
	// boot (see hostagent's recovery).
	BootID      string       `json:"boot_id,omitempty"`
	Checkpoints []Checkpoint `json:"checkpoints,omitempty"`
	Validated   bool         `json:"validated,omitempty"`
}

// Output describes the captured stdout and stderr of an execution.
type Output struct {
	StdoutBytes  int64  `json:"stdout_bytes,omitempty"`
	StderrBytes  int64  `json:"stderr_bytes,omitempty"`
	StdoutSHA256 string `json:"stdout_sha256,omitempty"`
	StderrSHA256 string `json:"stderr_sha256,omitempty"`
	Truncated    bool   `json:"truncated,omitempty"`
}

// Checkpoint is a progress point an executing command reported about itself.
type Checkpoint struct {
	At   time.Time `json:"at"`
	Note string    `json:"note"`
}

// recordVersion prefixes every encoded record so the encoding can change later; new fields
// are added to the JSON of version 1 without a bump.
const recordVersion byte = 1

// maxRecordBytes bounds a decoded record: anything larger is not one of ours.
const maxRecordBytes = 1 << 20

// ErrCorrupt: stored bytes are not a record or event this package wrote.
var ErrCorrupt = errors.New("markers: corrupt data")

// EncodeRecord returns the versioned storage form of r.
func EncodeRecord(r *Record) ([]byte, error) {
	b, err := appendRecord(append(make([]byte, 0, 1024), recordVersion), r)
	if err != nil {
		return nil, fmt.Errorf("markers: encode record %s: %w", r.ID, err)
	}
	return b, nil
}

// DecodeRecord parses the storage form written by EncodeRecord. It is safe on untrusted input.
func DecodeRecord(b []byte) (*Record, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty record", ErrCorrupt)
	}
	if len(b) > maxRecordBytes {
		return nil, fmt.Errorf("%w: record of %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != recordVersion {
		return nil, fmt.Errorf("%w: unknown record version %d", ErrCorrupt, b[0])
	}
	var r Record
	if err := json.Unmarshal(b[1:], &r); err != nil {
		return nil, fmt.Errorf("%w: record: %v", ErrCorrupt, err)
	}
	if err := r.validateIdentity(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if !r.Graph.Has(r.State) {
		return nil, fmt.Errorf("%w: state %q is not in the %s graph", ErrCorrupt, r.State, r.Graph)
	}
	return &r, nil
}

// Clone returns a deep copy, so callers can mutate a record without touching the store's.
func (r *Record) Clone() *Record {
	c := *r
	c.Command = append([]string(nil), r.Command...)
	c.Evidence = append([]string(nil), r.Evidence...)
	c.Checkpoints = append([]Checkpoint(nil), r.Checkpoints...)
	if r.Env != nil {
		c.Env = maps.Clone(r.Env)
	}
	c.Request = append(json.RawMessage(nil), r.Request...)
	if r.StateTimes != nil {
		c.StateTimes = make(map[State]time.Time, len(r.StateTimes))
		for k, v := range r.StateTimes {
			c.StateTimes[k] = v
		}
	}
	if r.ExitCode != nil {
		v := *r.ExitCode
		c.ExitCode = &v
	}
	if r.ResultDeliveredAt != nil {
		v := *r.ResultDeliveredAt
		c.ResultDeliveredAt = &v
	}
	if r.Fleet != nil {
		c.Fleet = r.Fleet.clone()
	}
	return &c
}

// maxKeyField bounds every string that becomes part of an index key.
const maxKeyField = 512

// validateIdentity checks the fields that become index keys: bounded, and free of the NUL
// byte that separates key components.
func (r *Record) validateIdentity() error {
	if !r.Graph.Valid() {
		return fmt.Errorf("unknown graph %q", r.Graph)
	}
	if r.ID == "" {
		return errors.New("empty execution id")
	}
	// An array, not a map: this runs on every decode and every create.
	for _, f := range [...]struct{ name, v string }{
		{"id", r.ID}, {"actor", r.Actor}, {"intent_scope", r.IntentScope}, {"fingerprint", r.Fingerprint},
		{"idempotency_key", r.IdempotencyKey}, {"principal", r.Principal}, {"operation_key", r.OperationKey},
		{"previous_attempt", r.PreviousAttempt}, {"recovered_from", r.RecoveredFrom},
	} {
		if len(f.v) > maxKeyField {
			return fmt.Errorf("%s is %d bytes, more than %d", f.name, len(f.v), maxKeyField)
		}
		if strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%s contains a NUL byte", f.name)
		}
	}
	return nil
}

func (r *Record) sameIdentity(o *Record) bool {
	return r.ID == o.ID && r.Graph == o.Graph && r.Actor == o.Actor && r.IntentScope == o.IntentScope &&
		r.Fingerprint == o.Fingerprint && r.IdempotencyKey == o.IdempotencyKey && r.Principal == o.Principal &&
		r.OperationKey == o.OperationKey && r.PreviousAttempt == o.PreviousAttempt &&
		r.RecoveredFrom == o.RecoveredFrom && r.CreatedAt.Equal(o.CreatedAt)
}
