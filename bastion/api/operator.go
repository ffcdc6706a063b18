package api

import (
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// DoctorReport is what the running bastion can tell `postern doctor`: its own build and,
// for every enrolled host, whether it answers with its pinned host key and which hostagent
// build it runs.
type DoctorReport struct {
	Version string       `json:"version"`
	Hosts   []HostHealth `json:"hosts"`
	// Journal is the journal backend's size and health, and its last retention pass.
	Journal *JournalHealth `json:"journal,omitempty"`
	// Serving is where the daemon listens, as bound: after `postern up --listen` or a port
	// 0 that is not what a config file says. Absent when read from the files.
	Serving *Serving `json:"serving,omitempty"`
}

// Serving is where a running daemon listens.
type Serving struct {
	// HTTP is the Streamable HTTP listener's address (host:port), "" when HTTP is disabled;
	// URL its MCP endpoint.
	HTTP string `json:"http,omitempty"`
	URL  string `json:"url,omitempty"`
	// MCPSocket and OperatorSocket are the unix sockets.
	MCPSocket      string `json:"mcp_socket"`
	OperatorSocket string `json:"operator_socket"`
}

// JournalHealth is the journal's backend as the running bastion sees it.
type JournalHealth struct {
	markers.BackendStatus
	// Error: the backend could not be asked.
	Error string `json:"error,omitempty"`
	// RetentionInterval is how often the scheduled retention pass runs (0: never).
	RetentionInterval time.Duration `json:"retention_interval"`
	// LastPass is this bastion's last retention pass, if it ran one since it started (with
	// replicas the elected one runs them).
	LastPass *RetentionPass `json:"last_pass,omitempty"`
}

// RetentionPass is what one retention pass did (`postern journal gc`, the scheduled pass).
type RetentionPass struct {
	markers.GCResult
	StartedAt time.Time `json:"started_at"`
	Seconds   float64   `json:"seconds"`
	// Error: the pass stopped on it (what it removed before stays removed).
	Error string `json:"error,omitempty"`
}

// HostHealth is one enrolled host, asked now.
type HostHealth struct {
	Name    string `json:"name"`
	Addr    string `json:"addr"`
	OK      bool   `json:"ok"`
	Version string `json:"version,omitempty"`
	// Protocol is the host protocol version the bastion's connection to it speaks
	// (hostproto.Version of the older side).
	Protocol int `json:"protocol,omitempty"`
	// Guarantee is set for hosts without the hostagent (no version to report).
	Guarantee string `json:"guarantee,omitempty"`
	// Problem and Fix say what is wrong and what to do about it (empty when OK).
	Problem string `json:"problem,omitempty"`
	Fix     string `json:"fix,omitempty"`
}

// ExecutionDetail is one execution for operators: the record, its event story and output.
type ExecutionDetail struct {
	Record *markers.Record `json:"record"`
	Events []markers.Event `json:"events"`
	// Output is the stored result as agents see it (an SSH output tail or an HTTP response),
	// when the execution has one.
	Output *Execution `json:"output,omitempty"`
	// Run is the agent run of its intent scope, as first seen (absent for executions
	// accepted before runs were journaled).
	Run *markers.Run `json:"run,omitempty"`
}

// Operator is who sent an operator's decision: the peer of the operator socket, by uid.
type Operator struct {
	// Name is how the journal names the operator ("operator:alice").
	Name string
	// UID is the peer's uid; -1 when it could not be read.
	UID int
}

// ApprovalPage is the executions awaiting approval, oldest first.
type ApprovalPage struct {
	Approvals []*ApprovalRequest `json:"approvals"`
}

// Daemon states, as Overview reports them.
const (
	// DaemonRunning: the daemon serves and carries every execution in flight.
	DaemonRunning = "running"
	// DaemonHeld: the daemon serves (reads, denials, reviews) but was started with --hold:
	// nothing is reconciled or sent until it is restarted without it.
	DaemonHeld = "held"
	// DaemonDown: no daemon; the answer was read from the journal's files.
	DaemonDown = "down"
)

// Overview is the bastion at a glance (postern status): what is in flight and what waits
// for an operator, and — when nothing carries the executions in flight (the daemon is down
// or held) — what starting it will do with each.
type Overview struct {
	Daemon   string `json:"daemon"`
	StateDir string `json:"state_dir"`
	// InFlight are the executions between acceptance and an outcome that no operator is
	// asked about: accepted, authorized, dispatched, running, or unknown and still being
	// resolved.
	InFlight []OverviewItem `json:"in_flight"`
	// AwaitingApproval wait for approve or deny; AwaitingReview are unknown outcomes only an
	// operator can settle (postern review).
	AwaitingApproval []OverviewItem `json:"awaiting_approval"`
	AwaitingReview   []OverviewItem `json:"awaiting_review"`
	// Truncated: a list was cut at its bound (executions list shows them all).
	Truncated bool `json:"truncated,omitempty"`
	// Config is the config in force: the start or the last reload that applied it (nil when
	// the files are read with the daemon down).
	Config *ConfigChange `json:"config,omitempty"`
}

// OverviewItem is one execution of an Overview.
type OverviewItem struct {
	Record *markers.Record `json:"record"`
	// AtStart is what starting the daemon (without --hold) does with it (verdict.AtStart);
	// set only when nothing carries it now.
	AtStart string `json:"at_start,omitempty"`
}

// ExecutionPage is one page of executions.
type ExecutionPage struct {
	Executions []*markers.Record `json:"executions"`
	Next       string            `json:"next,omitempty"`
}

// MarkerPage is a host's answer to a markers query.
type MarkerPage struct {
	Host    string              `json:"host"`
	Markers []*hostproto.Marker `json:"markers"`
	Next    string              `json:"next,omitempty"`
}

// RunPage is a list of agent runs.
type RunPage struct {
	Runs []*markers.Run `json:"runs"`
}

// OperatorError is the operator API's error body.
type OperatorError struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// ExecutionQuery selects executions for operators, newest first.
type ExecutionQuery struct {
	State markers.State
	// ReviewRequired selects the unknown executions that await an operator's review.
	ReviewRequired bool
	Actor, Host    string
	Since          time.Time
	Limit          int
	Cursor         string
}

// MarkerQuery selects a host's markers, newest first.
type MarkerQuery struct {
	State  string
	Limit  int
	Cursor string
}

// ConfigChange is a reload's answer (postern reload, SIGHUP), and a line of the reload log
// (<state dir>/reloads.jsonl).
type ConfigChange struct {
	At time.Time `json:"at"`
	// By is who asked: "operator:NAME" for postern reload, "signal:SIGHUP" for a signal.
	By string `json:"by"`
	// Digest is the hex SHA-256 of the config file now in force ("" for the defaults: no
	// file); Previous the one before.
	Digest   string `json:"digest"`
	Previous string `json:"previous"`
	// Changes say what changed, in words (config.Config.Changes); none: the file changed
	// nothing a reload applies.
	Changes []string `json:"changes"`
	// Replica is the replica that applied it (etcd journals; each replica reads its own
	// file).
	Replica string `json:"replica,omitempty"`
	// Warnings: parts checked beforehand that still failed to apply after the change was
	// logged (the HTTP actors, the MCP socket's uids), each with what stays as it was.
	Warnings []string `json:"warnings,omitempty"`
}

// TokenView is one credential of a remote actor as `postern token list` shows it: an issued
// token (bastion/tokens) or an actor's static config token. Never the token or its hash.
type TokenView struct {
	// ID is an issued token's id ("tok_…"); "config:NAME" for actor NAME's token_sha256.
	ID    string `json:"id"`
	Actor string `json:"actor"`
	// Source is "issued" or "config".
	Source string `json:"source"`
	// State is "active", "expired" or "revoked" at the time of the answer.
	State string `json:"state"`
	// Created is when an issued token was issued, and by whom (zero for config tokens).
	Created   time.Time `json:"created,omitzero"`
	CreatedBy string    `json:"created_by,omitempty"`
	// Expires is zero for never.
	Expires   time.Time `json:"expires,omitzero"`
	Revoked   time.Time `json:"revoked,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
	// LastUsed is the token's last accepted request since the daemon started (zero: none,
	// or the daemon is down).
	LastUsed time.Time `json:"last_used,omitzero"`
	// Note says what the bastion makes of it beyond its state ("actor not in the config").
	Note string `json:"note,omitempty"`
}

// TokenList is `postern token list`'s answer: the issued tokens, oldest first, then the
// config tokens by actor.
type TokenList struct {
	Tokens []TokenView `json:"tokens"`
}

// TokenRequest asks the daemon to issue a token (POST /v1/tokens).
type TokenRequest struct {
	Actor string `json:"actor"`
	// Expires is what `postern token --expires` took ("" or "never": no expiry).
	Expires string `json:"expires"`
}

// IssuedToken is the daemon's answer to a TokenRequest: the token, shown this once, and its
// entry in the store.
type IssuedToken struct {
	Token string    `json:"token"`
	View  TokenView `json:"view"`
}

// TokenRevocation is the answer to POST /v1/tokens/{id}/revoke. Changed is false when the
// token was revoked already.
type TokenRevocation struct {
	View    TokenView `json:"view"`
	Changed bool      `json:"changed"`
}
