package transport

import (
	"bytes"
	"log"
	"log/slog"
	"strings"

	"github.com/postern-dev/postern/internal/ratelog"
)

// Refusals are logged through internal/ratelog (a few lines per reason and minute, then a
// summary with the count) and counted by where and reason, so that a flood of refused
// connections or requests neither fills the disk nor goes unseen: the bastion's
// postern_refusals_total{where,reason}.

// Where a refusal happened: the "where" label.
const (
	WhereHTTP           = "http"
	WhereMCPSocket      = "mcp_socket"
	WhereOperatorSocket = "operator_socket"
)

// Why: the "reason" label. A closed set, never a value a client sent.
const (
	// Local sockets.
	ReasonPeerCredentials  = "peer_credentials"  // SO_PEERCRED could not be read
	ReasonUIDNotAllowed    = "uid_not_allowed"   // neither an owner nor a configured actor
	ReasonSocketFull       = "socket_full"       // MaxConns open
	ReasonKeptForOwners    = "kept_for_owners"   // the last slots are the owners'
	ReasonUIDLimit         = "uid_limit"         // MaxConnsPerUID open
	ReasonPeerUnidentified = "peer_unidentified" // the peer process could not be read from /proc

	// HTTP.
	ReasonUnauthenticated = "unauthenticated" // 401: no or no known bearer token
	ReasonTokenExpired    = "token_expired"   // 401: an issued token past its expiry
	ReasonTokenRevoked    = "token_revoked"   // 401: an issued token an operator revoked
	ReasonHostOrOrigin    = "host_or_origin"  // 403: Host or Origin refused
	ReasonBadRunHeader    = "bad_run_header"  // 400: Postern-Run
	ReasonBodyTooLarge    = "body_too_large"  // 413
	ReasonBodyTimeout     = "body_timeout"    // the body did not arrive in time
	ReasonActorBusy       = "actor_busy"      // 429: the actor's bodies in flight
	ReasonInvalidText     = "invalid_text"    // invalid UTF-8 or an unpaired surrogate
	ReasonPeerConnLimit   = "peer_conn_limit" // connections of one peer address
	ReasonTLSHandshake    = "tls_handshake"   // http.Server: TLS handshake error
	ReasonServerError     = "server_error"    // http.Server: any other error line
)

// CountRefusal is told of every refusal (a metrics counter); nil counts nothing.
type CountRefusal func(where, reason string)

func newRefusalLog(logger *slog.Logger, where string, count CountRefusal) *ratelog.Logger {
	return ratelog.New(logger, ratelog.Options{Where: where, Count: count})
}

// ServerErrorLog is an http.Server ErrorLog for where that goes through the refusal log:
// net/http logs a line per failed TLS handshake and per accept error, which anyone who can
// connect can cause.
func ServerErrorLog(logger *slog.Logger, where string, count CountRefusal) *log.Logger {
	return log.New(serverErrorWriter{newRefusalLog(loggerOrDiscard(logger), where, count)}, "", 0)
}

type serverErrorWriter struct{ log *ratelog.Logger }

func (w serverErrorWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	reason := ReasonServerError
	if strings.Contains(line, "TLS handshake error") {
		reason = ReasonTLSHandshake
	}
	if len(line) > 512 {
		line = line[:512] + "…"
	}
	w.log.Log(slog.LevelWarn, reason, "http server error", "error", line)
	return len(p), nil
}
