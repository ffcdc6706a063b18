package hostproto

// Exec under a marker: a raw SSH session channel, so that the hostagent's MarkerRequest
// messages are seen (x/crypto's ssh.Session discards unknown channel requests), carrying the
// environment, the command, its output and its exit status.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// MarkerRequest is the channel request that carries a MarkerMessage (want-reply false): once
// when the marker is created or found, and once with the final marker before exit-status.
const MarkerRequest = "postern-marker@postern"

// EnvRequest is the channel request (want-reply true) that sets a session's whole
// environment at once: one round trip instead of one per variable. Its payload is an SSH
// string holding a JSON array of EnvVar. The reply is true only if every variable was
// accepted; a hostagent of an earlier release answers false to the unknown request, so a
// false reply is followed by one env request per variable, which names what was refused.
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
// the output and returns once the exit status arrived. If the channel closes without one it
// returns ErrExitMissing (with whatever markers arrived). ctx cancellation closes the
// channel — the command goes on on the host.
func Run(ctx context.Context, conn gossh.Conn, x Exec) (Result, error) {
	ch, reqs, err := conn.OpenChannel("session", nil)
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
		for req := range reqs {
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

	env := map[string]string{EnvExecutionID: x.ExecutionID}
	for k, v := range x.Env {
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
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	batch := make([]EnvVar, len(names))
	for i, k := range names {
		batch[i] = EnvVar{Name: k, Value: env[k]}
	}
	payload, err := json.Marshal(batch)
	if err != nil {
		return fail(fmt.Errorf("encode env: %w", err))
	}
	ok, err := ch.SendRequest(EnvRequest, true, gossh.Marshal(&struct{ Env string }{string(payload)}))
	if err != nil {
		return fail(fmt.Errorf("send env: %w", err))
	}
	for _, k := range names {
		if ok {
			break // all accepted at once
		}
		msg := struct{ Name, Value string }{k, env[k]}
		if ok, err := ch.SendRequest("env", true, gossh.Marshal(&msg)); err != nil {
			return fail(fmt.Errorf("send env %s: %w", k, err))
		} else if !ok {
			return fail(fmt.Errorf("%w: env %s (not accepted by the host's accept_env)", ErrRefused, k))
		}
	}
	cmd := struct{ Command string }{x.Command}
	if ok, err := ch.SendRequest("exec", true, gossh.Marshal(&cmd)); err != nil {
		return fail(fmt.Errorf("send exec: %w", err))
	} else if !ok {
		return fail(fmt.Errorf("%w: exec", ErrRefused))
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
