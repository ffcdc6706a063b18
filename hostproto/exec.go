package hostproto

// Exec under a marker: a raw SSH session channel, so that the hostagent's MarkerRequest
// messages are seen (x/crypto's ssh.Session discards unknown channel requests), carrying the
// environment, the command, its output and its exit status.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/internal/envpolicy"
)

// MarkerRequest is the channel request that carries a MarkerMessage (want-reply false): once
// when the marker is created or found, and once with the final marker before exit-status.
const MarkerRequest = "postern-marker@postern"

// EnvRequest is the channel request (want-reply true) that sets a session's whole
// environment at once: one round trip instead of one per variable. Its payload is an SSH
// string holding a JSON array of EnvVar. The reply is true only if every variable was
// accepted; a hostagent of an earlier release answers false to the unknown request, so a
// false reply is followed by one env request per variable, which names what was refused.
//
// From protocol 3 a client may send it with want-reply false and the exec request right
// behind it: the hostagent then refuses the exec if the environment was not taken whole, and
// the client, on that refusal, sends one env request per variable to learn which.
const EnvRequest = "postern-env@postern"

// EnvVar is one variable of an EnvRequest.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Environment variables with a meaning to the hostagent.
const (
	// EnvExecutionID names the execution; the hostagent refuses (or assigns) a command
	// without one.
	EnvExecutionID = "POSTERN_EXECUTION_ID"
	// EnvOperationKey is a host-wide key that refuses a second execution of one operation.
	EnvOperationKey = "POSTERN_OPERATION_KEY"
	// EnvTimeout is the command's timeout in whole seconds.
	EnvTimeout = "POSTERN_TIMEOUT_S"
	// EnvFingerprint is the bastion's intent fingerprint, kept in the marker.
	EnvFingerprint = "POSTERN_FINGERPRINT"
	// EnvCwd is the absolute working directory (default: the account's home).
	EnvCwd = "POSTERN_CWD"
	// EnvMarkerSocket is set by the hostagent in a command's environment: where the command
	// reports its checkpoints (`postern-hostagent marker checkpoint`).
	EnvMarkerSocket = "POSTERN_MARKER_SOCKET"
)

// Exit statuses the hostagent reports for an execution it did not run to an exit code; any
// other status is the command's own (or 128+n for a command killed by signal n).
const (
	// ExitRefused: the request was refused or the command could not start; nothing ran.
	// The same status OpenSSH's client uses for its own errors.
	ExitRefused = 255
	// ExitUnknownOutcome: the execution was interrupted (its process vanished without an
	// exit record), or its outcome could not be read; it is not run again.
	ExitUnknownOutcome = 254
	// ExitOperationTaken: the hostagent did not start the request because its operation key
	// belongs to another execution. Its owner also gets that execution's marker; another
	// identity gets none (nothing tells it which execution holds the key).
	ExitOperationTaken = 253
	// ExitTimedOut: the command outlived its timeout and was killed; as timeout(1).
	ExitTimedOut = 124
)

// MarkerMessage is the payload of a MarkerRequest.
type MarkerMessage struct {
	Marker *Marker `json:"marker"`
	// Replayed: the execution existed before this request; nothing new was started.
	Replayed bool `json:"replayed,omitempty"`
	// Final: the marker after the execution ended, sent just before exit-status.
	Final bool `json:"final,omitempty"`
}

// ErrExitMissing: the channel closed without an exit status (connection lost, hostagent
// killed): whether and how the command ran is unknown until the marker is asked for.
var ErrExitMissing = errors.New("hostproto: channel closed without exit status")

// ErrRefused: the hostagent refused the session's env or exec request, so the command was
// never started.
var ErrRefused = errors.New("hostproto: request refused")

// ErrInvalidExec: Run did not send the request — it has a field no hostagent accepts, or one
// a request cannot carry — so nothing was started. Run's error wraps ErrRefused too.
var ErrInvalidExec = errors.New("hostproto: invalid exec request")

// Bounds of what Run sends. SSH carries a channel request in one packet, and
// implementations (x/crypto, OpenSSH) end the whole connection — every channel on it — at a
// packet over 256 KiB; so Run never sends a larger request, and a caller that checks its
// request with Exec.Check first never sends one Run would refuse.
const (
	// MaxRequestPayload bounds one channel request's payload: 256 KiB less 1 KiB of framing.
	MaxRequestPayload = 255 << 10
	// MaxCommandBytes is the longest command an exec request carries.
	MaxCommandBytes = MaxRequestPayload - 64
	// MaxCwdBytes bounds EnvCwd (PATH_MAX).
	MaxCwdBytes = 4096
	// maxFieldBytes bounds the execution id and the fingerprint.
	maxFieldBytes = 256
)

// CheckCwd is the rule for a working directory (EnvCwd), on both sides: an absolute, clean
// path of at most MaxCwdBytes of UTF-8 text without control characters (a NUL, a newline).
// Its error says what is wrong.
func CheckCwd(cwd string) error {
	switch {
	case len(cwd) > MaxCwdBytes:
		return fmt.Errorf("cwd is %d bytes, more than %d", len(cwd), MaxCwdBytes)
	case !utf8.ValidString(cwd) || strings.ContainsFunc(cwd, isControl):
		return errors.New("cwd must be UTF-8 text without control characters (NUL, newline)")
	case !path.IsAbs(cwd) || path.Clean(cwd) != cwd:
		return errors.New("cwd must be an absolute, clean path (no .., no //, no trailing /)")
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// Check reports why Run would not send x (an error wrapping ErrInvalidExec naming the
// field), or nil.
func (x Exec) Check() error {
	_, err := x.requests()
	return err
}

// execRequests are the payloads Run sends for an Exec.
type execRequests struct {
	env []EnvVar // sorted by name
	// batch is the EnvRequest payload; nil when it would be larger than MaxRequestPayload
	// (then one env request per variable).
	batch []byte
	exec  []byte
}

// requests checks x and encodes what Run sends for it.
func (x Exec) requests() (execRequests, error) {
	invalid := func(format string, args ...any) (execRequests, error) {
		return execRequests{}, fmt.Errorf("%w: %s", ErrInvalidExec, fmt.Sprintf(format, args...))
	}
	switch {
	case x.ExecutionID == "" || len(x.ExecutionID) > maxFieldBytes || !printable(x.ExecutionID):
		return invalid("execution id must be 1 to %d printable ASCII characters", maxFieldBytes)
	case len(x.Fingerprint) > maxFieldBytes || !printable(x.Fingerprint):
		return invalid("fingerprint must be at most %d printable ASCII characters", maxFieldBytes)
	case len(x.OperationKey) > MaxOperationKeyLen || !printable(x.OperationKey) || strings.Contains(x.OperationKey, " "):
		return invalid("operation key must be at most %d visible ASCII characters", MaxOperationKeyLen)
	case x.Command == "":
		return invalid("command is empty")
	case len(x.Command) > MaxCommandBytes:
		return invalid("command is %d bytes, more than the %d an exec request carries", len(x.Command), MaxCommandBytes)
	case strings.IndexByte(x.Command, 0) >= 0:
		return invalid("command holds a NUL byte")
	case x.Timeout < 0:
		return invalid("timeout is negative")
	}
	if x.Cwd != "" {
		if err := CheckCwd(x.Cwd); err != nil {
			return execRequests{}, fmt.Errorf("%w: %w", ErrInvalidExec, err)
		}
	}
	env := map[string]string{EnvExecutionID: x.ExecutionID}
	for k, v := range x.Env {
		switch {
		case !envpolicy.ValidName(k):
			return invalid("env name %q is not a variable name", boundName(k))
		case strings.IndexByte(v, 0) >= 0:
			return invalid("env %s holds a NUL byte", k)
		case len(k)+len(v) > MaxRequestPayload-64:
			return invalid("env %s is %d bytes, more than an env request carries", k, len(v))
		}
		env[k] = v
	}
	if x.OperationKey != "" {
		env[EnvOperationKey] = x.OperationKey
	}
	if x.Timeout > 0 {
		env[EnvTimeout] = strconv.Itoa(int(x.Timeout.Round(time.Second) / time.Second))
	}
	if x.Fingerprint != "" {
		env[EnvFingerprint] = x.Fingerprint
	}
	if x.Cwd != "" {
		env[EnvCwd] = x.Cwd
	}
	var r execRequests
	for _, k := range slices.Sorted(maps.Keys(env)) {
		r.env = append(r.env, EnvVar{Name: k, Value: env[k]})
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r.env); err != nil {
		return invalid("encode env: %v", err)
	}
	if batch := gossh.Marshal(&struct{ Env string }{strings.TrimSuffix(buf.String(), "\n")}); len(batch) <= MaxRequestPayload {
		r.batch = batch
	}
	r.exec = gossh.Marshal(&struct{ Command string }{x.Command})
	return r, nil
}

// printable reports whether s is printable ASCII (space included).
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// boundName shortens a name for an error message.
func boundName(s string) string {
	if len(s) > 64 {
		return strings.ToValidUTF8(s[:64], "") + "…"
	}
	return s
}

// Exec describes one command to run under a marker.
type Exec struct {
	ExecutionID  string
	Command      string
	OperationKey string
	Timeout      time.Duration
	Fingerprint  string
	// Cwd is the absolute working directory; "" means the account's home.
	Cwd string
	// Env holds extra variables (the hostagent accepts only its allowlist).
	Env map[string]string
	// Stdout and Stderr receive the output; nil discards it.
	Stdout, Stderr io.Writer
	// OnMarker, if set, is called for each marker message as it arrives.
	OnMarker func(MarkerMessage)
	// Protocol is the version conn speaks (SayHello), 0 if unknown. From 3 the environment
	// goes with the exec request in one round trip (EnvRequest).
	Protocol int
}

// Result is how an Exec ended.
type Result struct {
	ExitStatus int
	// ExitSignal is set when the server reported exit-signal instead of a status.
	ExitSignal string
	// First is the marker message sent when the marker was created or found (nil if none
	// arrived); Final the one sent before the exit status.
	First, Final *MarkerMessage
}

// Replayed reports whether the hostagent answered from an existing execution.
func (r Result) Replayed() bool { return r.First != nil && r.First.Replayed }

// Run opens a session channel on conn, sends the environment and the exec request, copies
// the output and returns once the exit status arrived. It sends nothing for an x that
// Check refuses (the error wraps ErrRefused and ErrInvalidExec). If the channel closes without one it
// returns ErrExitMissing (with whatever markers arrived). ctx cancellation closes the
// channel — the command goes on on the host.
func Run(ctx context.Context, conn gossh.Conn, x Exec) (Result, error) {
	reqs, err := x.requests()
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	ch, in, err := conn.OpenChannel("session", nil)
	if err != nil {
		return Result{}, fmt.Errorf("open session: %w", err)
	}
	defer ch.Close()
	stop := context.AfterFunc(ctx, func() { ch.Close() })
	defer stop()

	// The request loop ends when the hostagent closes the channel, after the exit status.
	var res Result
	gotExit := false
	var loop sync.WaitGroup
	loop.Go(func() {
		for req := range in {
			switch req.Type {
			case MarkerRequest:
				var m MarkerMessage
				if json.Unmarshal(req.Payload, &m) == nil && m.Marker != nil {
					if m.Final {
						res.Final = &m
					} else if res.First == nil {
						res.First = &m
					}
					if x.OnMarker != nil {
						x.OnMarker(m)
					}
				}
			case "exit-status", "exit-signal":
				if code, signal, ok := ParseExit(req); ok && signal != "" {
					res.ExitSignal, gotExit = signal, true
				} else if ok {
					res.ExitStatus, gotExit = code, true
				}
			}
			if req.WantReply {
				req.Reply(false, nil)
			}
		}
	})
	// Until the loop is waited for, res belongs to it: every return below waits first.
	fail := func(err error) (Result, error) {
		ch.Close()
		loop.Wait()
		return res, err
	}

	// Every request fits in one packet (requests): a larger one would end the connection,
	// and every other execution's channel on it.
	sendEnv := func() error {
		for _, kv := range reqs.env {
			msg := struct{ Name, Value string }{kv.Name, kv.Value}
			if ok, err := ch.SendRequest("env", true, gossh.Marshal(&msg)); err != nil {
				return fmt.Errorf("send env %s: %w", kv.Name, err)
			} else if !ok {
				return fmt.Errorf("%w: env %s (not accepted by the host's accept_env)", ErrRefused, kv.Name)
			}
		}
		return nil
	}
	if reqs.batch != nil && x.Protocol >= 3 {
		// The environment and the exec in one round trip: a hostagent of protocol 3 refuses
		// the exec if it did not take the environment whole.
		if _, err := ch.SendRequest(EnvRequest, false, reqs.batch); err != nil {
			return fail(fmt.Errorf("send env: %w", err))
		}
		ok, err := ch.SendRequest("exec", true, reqs.exec)
		if err != nil {
			return fail(fmt.Errorf("send exec: %w", err))
		}
		if !ok {
			// Nothing started: the variables one by one name the one refused, if any.
			if err := sendEnv(); err != nil {
				return fail(err)
			}
			return fail(fmt.Errorf("%w: exec", ErrRefused))
		}
	} else {
		if reqs.batch != nil {
			ok, err := ch.SendRequest(EnvRequest, true, reqs.batch)
			if err != nil {
				return fail(fmt.Errorf("send env: %w", err))
			}
			if ok {
				reqs.env = nil // all accepted at once
			}
		}
		if err := sendEnv(); err != nil {
			return fail(err)
		}
		if ok, err := ch.SendRequest("exec", true, reqs.exec); err != nil {
			return fail(fmt.Errorf("send exec: %w", err))
		} else if !ok {
			return fail(fmt.Errorf("%w: exec", ErrRefused))
		}
	}
	ch.CloseWrite()

	var copies sync.WaitGroup
	copies.Go(func() { io.Copy(orDiscard(x.Stdout), ch) })
	copies.Go(func() { io.Copy(orDiscard(x.Stderr), ch.Stderr()) })
	copies.Wait()
	loop.Wait()
	switch {
	case ctx.Err() != nil:
		return res, ctx.Err()
	case !gotExit:
		return res, ErrExitMissing
	}
	return res, nil
}

// ParseExit reads an exit-status (code) or exit-signal ("SIG"+name) channel request; ok is
// false for any other request or a malformed payload.
func ParseExit(req *gossh.Request) (code int, signal string, ok bool) {
	switch req.Type {
	case "exit-status":
		var st struct{ Status uint32 }
		if gossh.Unmarshal(req.Payload, &st) == nil {
			return int(st.Status), "", true
		}
	case "exit-signal":
		var sig struct {
			Signal     string
			CoreDumped bool
			Error      string
			Lang       string
		}
		if gossh.Unmarshal(req.Payload, &sig) == nil {
			return 0, "SIG" + sig.Signal, true
		}
	}
	return 0, "", false
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
