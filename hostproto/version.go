package hostproto

import (
	"encoding/json"
	"errors"
	"fmt"

	gossh "golang.org/x/crypto/ssh"
)

// Protocol versions (see the package comment, "Compatibility").
const (
	// Version is the protocol this release speaks: 2 added the hello; 3 the environment
	// sent without waiting for its reply (EnvRequest), the exec refused if it was not taken.
	Version = 3
	// MinVersion is the oldest protocol this release still speaks: the previous release's,
	// which sends no hello. Raise it one release after the one that stops needing it.
	MinVersion = 1
)

// HelloRequest is the global request (want-reply true) a client sends once per connection,
// right after the SSH handshake, with a Hello; the server answers true with its own Hello. A
// server of the previous release answers false, as to any request it does not know.
const HelloRequest = "postern-hello@postern"

// Hello is the payload of HelloRequest and of its reply.
type Hello struct {
	// Version is the sender's protocol version.
	Version int `json:"version"`
	// Build is the sender's build (internal/version), for operators; it decides nothing.
	Build string `json:"build,omitempty"`
}

// ErrVersion: the peer speaks a protocol outside this release's window.
var ErrVersion = errors.New("hostproto: protocol version outside the supported window")

// maxHelloBytes bounds a hello payload: the peer is not trusted to send a small one.
const maxHelloBytes = 4 << 10

// Agree is the version two peers speak: the lower of theirs and this release's, or ErrVersion
// if that is below MinVersion (the peer is too old) or theirs is not a version at all.
func Agree(theirs int) (int, error) {
	if theirs < 1 {
		return 0, fmt.Errorf("%w: the peer announced version %d", ErrVersion, theirs)
	}
	v := min(theirs, Version)
	if v < MinVersion {
		return 0, fmt.Errorf("%w: the peer speaks version %d, this release %d to %d", ErrVersion, theirs, MinVersion, Version)
	}
	return v, nil
}

// SayHello sends the client's hello on conn and returns the version both sides speak and the
// server's build ("" when it did not say). A server that answers false does not know the
// request: it is of the previous release and speaks version 1, the one without a hello.
func SayHello(conn gossh.Conn, build string) (version int, serverBuild string, err error) {
	payload, err := json.Marshal(Hello{Version: Version, Build: build})
	if err != nil {
		return 0, "", fmt.Errorf("hostproto: encode hello: %w", err)
	}
	ok, reply, err := conn.SendRequest(HelloRequest, true, payload)
	if err != nil {
		return 0, "", fmt.Errorf("hostproto: hello: %w", err)
	}
	if !ok {
		v, err := Agree(1)
		return v, "", err
	}
	var h Hello
	if len(reply) > maxHelloBytes || json.Unmarshal(reply, &h) != nil {
		return 0, "", fmt.Errorf("%w: unreadable hello reply", ErrVersion)
	}
	v, err := Agree(h.Version)
	return v, boundedText(h.Build, maxVersionBytes), err
}

// AnswerHello is the server's side of HelloRequest: it reads the client's hello from payload
// and returns the version both sides speak and the reply payload (the server's Hello). An
// error means the client is outside this release's window; the reply still says which
// version the server speaks.
func AnswerHello(payload []byte, build string) (version int, reply []byte, err error) {
	reply, merr := json.Marshal(Hello{Version: Version, Build: build})
	if merr != nil {
		return 0, nil, fmt.Errorf("hostproto: encode hello: %w", merr)
	}
	var h Hello
	if len(payload) > maxHelloBytes || json.Unmarshal(payload, &h) != nil {
		return 0, reply, fmt.Errorf("%w: unreadable hello", ErrVersion)
	}
	version, err = Agree(h.Version)
	return version, reply, err
}
