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
