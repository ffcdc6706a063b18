// Package plugins holds the contract between the bastion and its action-channel plugins: the
// go-plugin handshake and plugin map, the action and response types, the Journal the plugin
// reports lifecycle points into, the gRPC client and server (JSON over gRPC, no generated code),
// and the host-side Manager that runs the plugin process.
//
// # Invariants
//
//   - A credential crosses the process boundary only inside an HTTPAction over the AutoMTLS
//     channel; String, GoString, Format and LogValue of Credential and HTTPAction never print the
//     secret.
//   - A response or message that may carry the secret back (an echoing target, an error) goes
//     through the credential's Redactor before it is journaled, logged or returned: the plugin
//     redacts what it reports, and the bastion redacts again at the journal.
//   - Every Journal method returns only once the point is durable; a plugin that cannot journal
//     Dispatched sends nothing.
//   - The plugin depends on nothing of the bastion but the Journal it is handed per call.
package plugins

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/go-plugin"
)

// ChannelHTTP is the plugin map key of the HTTP action channel.
const ChannelHTTP = "http"

// Handshake is shared by the bastion and every plugin binary. It is not a security measure (the
// pinned checksum and AutoMTLS are); it stops a plugin binary from being run by hand by mistake.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "POSTERN_PLUGIN",
	MagicCookieValue: "5b0f1e9c7a3d4e62b8c1f04d9e7a2c35",
}

// PluginMap is the set of plugins the host can dispense. The host side needs no implementation.
var PluginMap = map[string]plugin.Plugin{
	ChannelHTTP: &ChannelPlugin{},
}

// Outcome states, as stored in the journal.
const (
	StateCompleted = "completed"
	StateFailed    = "failed"
	StateUnknown   = "unknown"
)

// Credential kinds.
const (
	CredentialBearer = "bearer"
	CredentialBasic  = "basic"
	CredentialHeader = "header"
)

var (
	// ErrPluginCrashed is returned by Manager.Perform when the plugin process died or the RPC
	// broke during the call. The caller decides the outcome from what its journal recorded.
	ErrPluginCrashed = errors.New("plugins: plugin process crashed or its connection broke")
	// ErrChecksumMismatch is returned when the plugin binary does not have the pinned SHA-256.
	ErrChecksumMismatch = errors.New("plugins: plugin binary checksum mismatch")
)

// HTTPAction is one execution for the HTTP channel. It carries a resolved credential: never log
// it, never echo it. Its String, GoString, Format and LogValue omit the secret, the header
// values and the body.
type HTTPAction struct {
	ExecutionID string              `json:"execution_id"`
	Method      string              `json:"method"`
	URL         string              `json:"url"`              // absolute http(s) URL, query already normalized
	Header      map[string][]string `json:"header,omitempty"` // non-auth headers chosen by the agent (validated by the bastion)
	Body        []byte              `json:"body,omitempty"`
	Credential  *Credential         `json:"credential,omitempty"`
	Timeout     time.Duration       `json:"timeout"` // whole request, dial to last body byte
	// MaxResponseBytes caps the stored body; the rest is read, counted, discarded and
	// HTTPResponse.BodyTruncated set.
	MaxResponseBytes int64 `json:"max_response_bytes"`
	// KeepHeaders names the response headers to return; everything else is dropped, and
	// credential-bearing headers are dropped even when named.
	KeepHeaders []string `json:"keep_headers,omitempty"`
}

// String describes the action without its credential secret, header values or body.
func (a HTTPAction) String() string {
	return fmt.Sprintf("HTTPAction{execution_id=%s method=%s url=%s headers=%d body_bytes=%d credential=%s timeout=%s}",
		a.ExecutionID, a.Method, a.URL, len(a.Header), len(a.Body), a.credentialString(), a.Timeout)
}

func (a HTTPAction) credentialString() string {
	if a.Credential == nil {
		return "none"
	}
	return a.Credential.String()
}

// GoString is String: %#v must not dump the credential.
func (a HTTPAction) GoString() string { return a.String() }

// Format makes every fmt verb (%v, %+v, %#v, %s, %q, ...) print String.
func (a HTTPAction) Format(f fmt.State, _ rune) { _, _ = fmt.Fprint(f, a.String()) }

// LogValue gives slog the redacted form.
func (a HTTPAction) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("execution_id", a.ExecutionID),
		slog.String("method", a.Method),
		slog.String("url", a.URL),
		slog.Int("body_bytes", len(a.Body)),
		slog.String("credential", a.credentialString()),
		slog.Duration("timeout", a.Timeout),
	)
}

// Credential is a resolved secret and how to present it.
type Credential struct {
	// Ref is the credential's name in the bastion's config (credential_ref): it names the
	// secret in redaction markers, "[REDACTED:<ref>]".
	Ref      string `json:"ref,omitempty"`
	Kind     string `json:"kind"`               // CredentialBearer, CredentialBasic or CredentialHeader
	Header   string `json:"header,omitempty"`   // for CredentialHeader: the header name (e.g. X-Api-Key)
	Username string `json:"username,omitempty"` // for CredentialBasic
	Secret   string `json:"secret"`
}

// String describes the credential without its secret.
func (c Credential) String() string {
	switch c.Kind {
	case CredentialHeader:
		return fmt.Sprintf("Credential{kind=%s header=%s secret=REDACTED}", c.Kind, c.Header)
	case CredentialBasic:
		return fmt.Sprintf("Credential{kind=%s username=%s secret=REDACTED}", c.Kind, c.Username)
	default:
		return fmt.Sprintf("Credential{kind=%s secret=REDACTED}", c.Kind)
	}
}

// GoString is String: %#v must not dump the secret.
func (c Credential) GoString() string { return c.String() }

// Format makes every fmt verb print String.
func (c Credential) Format(f fmt.State, _ rune) { _, _ = fmt.Fprint(f, c.String()) }

// LogValue gives slog the redacted form.
func (c Credential) LogValue() slog.Value { return slog.StringValue(c.String()) }

// HTTPResponse is what the target answered, reduced to what may be stored.
type HTTPResponse struct {
	Status int `json:"status"`
	// Header holds only the action's KeepHeaders, never Set-Cookie, Authorization,
	// Proxy-Authorization or WWW-Authenticate.
	Header        map[string][]string `json:"header,omitempty"`
	Body          []byte              `json:"body,omitempty"` // at most MaxResponseBytes
	BodyBytes     int64               `json:"body_bytes"`     // total received
	BodyTruncated bool                `json:"body_truncated,omitempty"`
	// IdempotentReplayed is set when the target sent "Idempotent-Replayed: true".
	IdempotentReplayed bool `json:"idempotent_replayed,omitempty"`
}

// Journal is implemented by the bastion and reached by the plugin through the go-plugin broker.
// Every method returns only once the point is durable in the bastion's journal. If Dispatched
// returns an error, the plugin sends nothing (fail closed) and reports Failed.
type Journal interface {
	Dispatched(ctx context.Context, executionID string) error
	Completed(ctx context.Context, executionID string, resp HTTPResponse) error
	// Failed: provably no byte of the request was written.
	Failed(ctx context.Context, executionID, reason string) error
	// Unknown: the exchange failed after request bytes were written.
	Unknown(ctx context.Context, executionID, reason string) error
}

// Outcome is what Perform returns; the journal already has it.
type Outcome struct {
	State    string        `json:"state"` // StateCompleted, StateFailed or StateUnknown
	Response *HTTPResponse `json:"response,omitempty"`
	Reason   string        `json:"reason,omitempty"`
}

// Channel performs actions. Implemented in the plugin process by httpchannel; on the host side
// by the gRPC client.
type Channel interface {
	Perform(ctx context.Context, action HTTPAction, journal Journal) (Outcome, error)
}
