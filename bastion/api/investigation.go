package api

import (
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// Investigation is the answer to the five questions about one execution.
type Investigation struct {
	ExecutionID string          `json:"execution_id"`
	Record      *markers.Record `json:"record"`
	// Answers are the five answers in order, one paragraph each.
	Answers []string `json:"answers"`

	// 1: every call of the intent, oldest first, and the agent runs that sent them.
	Calls []InvestigatedCall `json:"calls"`
	Runs  []*markers.Run     `json:"runs"`
	// Related are executions of the same command by the same actor from other agent runs
	// within the attach window: separate intents, shown so "two agents" is visible.
	Related []Sibling `json:"related,omitempty"`
	// 2
	Authorization Authorization `json:"authorization"`
	// Replicas (replicas on etcd) are the replicas that drove the execution, in order: the one
	// that accepted it, and each that approved, dispatched or took it over, with when and why.
	Replicas []ReplicaStep `json:"replicas,omitempty"`
	// 3
	Outcome ObservedOutcome `json:"outcome"`
	// 4
	Delivery DeliveryAnswer `json:"delivery"`
	// 5: the later calls are Calls after the first; Siblings are the executions of the
	// intent, oldest first (this one included).
	Siblings []Sibling `json:"siblings"`
	// Hosts are, for a fleet run, the five answers for each host's execution, in the run's
	// order (a host never started has none).
	Hosts []*Investigation `json:"hosts,omitempty"`
}

// InvestigatedCall is one call, the execution it touched and what it amounted to.
type InvestigatedCall struct {
	At          time.Time `json:"at"`
	ExecutionID string    `json:"execution_id"`
	markers.Call
	// What is the call in words: "created the execution", "joined (attach): …".
	What string `json:"what"`
}

// Authorization is the answer to question 2.
type Authorization struct {
	Decision     string     `json:"decision"`
	Rule         string     `json:"rule,omitempty"`
	Class        string     `json:"class,omitempty"`
	AcceptedAt   time.Time  `json:"accepted_at"`
	AuthorizedAt *time.Time `json:"authorized_at,omitempty"`
	DispatchedAt *time.Time `json:"dispatched_at,omitempty"`
	// Steps are the approval and rejection events (operator decisions included).
	Steps []string `json:"steps,omitempty"`
}

// ObservedOutcome is the answer to question 3: what the bastion journaled, and what the
// host's marker says now.
type ObservedOutcome struct {
	State      string     `json:"state"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Signal     string     `json:"signal,omitempty"`
	HTTPStatus int        `json:"http_status,omitempty"`
	ObservedAt *time.Time `json:"observed_at,omitempty"`
	Evidence   []string   `json:"evidence,omitempty"`
	// Marker is the host's marker, asked live; MarkerNote says what the host answered or
	// why it could not be asked.
	Marker     *hostproto.Marker `json:"marker,omitempty"`
	MarkerNote string            `json:"marker_note"`
}

// DeliveryAnswer is the answer to question 4.
type DeliveryAnswer struct {
	DeliveredAt *time.Time      `json:"delivered_at,omitempty"`
	Deliveries  []DeliveryEvent `json:"deliveries,omitempty"`
	Revocations []DeliveryEvent `json:"revocations,omitempty"`
	// Failures are the responses that carried the result without delivering it: the call,
	// and why (Note: the client went away, did not acknowledge every byte, …).
	Failures []DeliveryEvent `json:"failures,omitempty"`
}

// NotDeliveredNote begins the note of the update event that says why a response that
// carried an execution's result was not its delivery ("result not delivered: the client
// cancelled the request or went away").
const NotDeliveredNote = "result not delivered"

// DeliveryEvent is one delivery or revocation of the result.
type DeliveryEvent struct {
	At   time.Time     `json:"at"`
	Call *markers.Call `json:"call,omitempty"`
	Note string        `json:"note,omitempty"`
}

// Sibling is one execution of the intent (or a related one), summarized.
type Sibling struct {
	ExecutionID     string     `json:"execution_id"`
	State           string     `json:"state"`
	Scope           string     `json:"intent_scope"`
	AcceptedAt      time.Time  `json:"accepted_at"`
	DeliveredAt     *time.Time `json:"result_delivered_at,omitempty"`
	IdempotencyKey  string     `json:"idempotency_key,omitempty"`
	PreviousAttempt string     `json:"previous_attempt,omitempty"`
}

// ReplicaStep is one replica's turn at driving an execution.
type ReplicaStep struct {
	At      time.Time `json:"at"`
	Replica string    `json:"replica"`
	// What the step was: "accepted it", "dispatched it", "taken over by r1 from r0 (…)".
	What string `json:"what"`
}
