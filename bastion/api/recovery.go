package api

import (
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/markers"
)

// RecoveryQuery is what `postern recover --from-hosts` asks.
type RecoveryQuery struct {
	// Confirm journals what recovery decided; without it nothing is written.
	Confirm bool
	// Since, if set, reads only the markers the hosts created from then on.
	Since time.Time
}

// Recovery is what recovery from the hosts found: every enrolled host's answer, and every
// execution a host has a marker of or the journal shows unfinished, with what recovery does
// with it (verdict.RecoverOn).
type Recovery struct {
	Confirmed bool           `json:"confirmed"`
	Hosts     []RecoveryHost `json:"hosts"`
	Items     []RecoveryItem `json:"executions"`
	Counts    map[string]int `json:"counts"`
}

// RecoveryHost is one host's part: how many markers it listed, or why it could not be asked,
// or that it keeps none.
type RecoveryHost struct {
	Name      string `json:"name"`
	Guarantee string `json:"guarantee"`
	Markers   int    `json:"markers"`
	// Problem: the host could not be asked; its markers are not known (run recover again).
	Problem string `json:"problem,omitempty"`
	Note    string `json:"note,omitempty"`
}

// RecoveryItem is one execution: what the journal and the host say, and what recovery does
// (journal, review, leave) and why; Journaled once a confirmed recovery wrote it, Error if
// that failed.
type RecoveryItem struct {
	ExecutionID string                `json:"execution_id"`
	Host        string                `json:"host"`
	Journal     markers.State         `json:"journal_state,omitempty"`
	Marker      hostproto.MarkerState `json:"marker_state,omitempty"`
	Command     string                `json:"command,omitempty"`
	Do          string                `json:"do"`
	Note        string                `json:"note"`
	Journaled   bool                  `json:"journaled,omitempty"`
	Error       string                `json:"error,omitempty"`
}
