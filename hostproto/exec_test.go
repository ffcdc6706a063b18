package hostproto

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

func TestExecCheck(t *testing.T) {
	ok := Exec{ExecutionID: "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW", Command: "true", Cwd: "/srv/app", Env: map[string]string{"LANG": "C"}, OperationKey: "m:1", Timeout: time.Minute}
	for _, tc := range []struct {
		name    string
		change  func(*Exec)
		wantErr string
	}{
		{name: "ok", change: func(*Exec) {}},
		{name: "no id", change: func(x *Exec) { x.ExecutionID = "" }, wantErr: "execution id"},
		{name: "NUL in cwd", change: func(x *Exec) { x.Cwd = "/srv/\x00" }, wantErr: "control characters"},
		{name: "newline in cwd", change: func(x *Exec) { x.Cwd = "/srv/\n" }, wantErr: "control characters"},
		{name: "long cwd", change: func(x *Exec) { x.Cwd = "/" + strings.Repeat("a", MaxCwdBytes) }, wantErr: "more than 4096"},
		{name: "relative cwd", change: func(x *Exec) { x.Cwd = "srv" }, wantErr: "absolute, clean"},
		{name: "cwd with ..", change: func(x *Exec) { x.Cwd = "/srv/../etc" }, wantErr: "absolute, clean"},
		{name: "env name with a newline", change: func(x *Exec) { x.Env = map[string]string{"A\nB": "x"} }, wantErr: "not a variable name"},
		{name: "NUL in an env value", change: func(x *Exec) { x.Env = map[string]string{"LANG": "\x00"} }, wantErr: "NUL"},
		{name: "NUL in the command", change: func(x *Exec) { x.Command = "a\x00" }, wantErr: "NUL"},
		{name: "command past one request", change: func(x *Exec) { x.Command = strings.Repeat("x", MaxCommandBytes+1) }, wantErr: "more than the"},
		{name: "operation key with a space", change: func(x *Exec) { x.OperationKey = "a b" }, wantErr: "operation key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := ok
			tc.change(&x)
			err := x.Check()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Check = %v", err)
			case tc.wantErr != "" && (!errors.Is(err, ErrInvalidExec) || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Check = %v; want ErrInvalidExec saying %q", err, tc.wantErr)
			}
		})
	}
}

// sizeServer is an SSH server that accepts sessions, answers every request yes, exits 0
// after exec, and records the largest request payload it was sent.
type sizeServer struct {
	mu       sync.Mutex // guards largest and channels
	largest  int
	channels int
}

func (s *sizeServer) serve(t *testing.T, c net.Conn) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Error(err)
		return
	}
	cfg := &gossh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer)
	_, chans, reqs, err := gossh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	go gossh.DiscardRequests(reqs)
	for nc := range chans {
		ch, in, err := nc.Accept()
		if err != nil {
			continue
		}
		s.mu.Lock()
		s.channels++
		s.mu.Unlock()
		go func() {
			for req := range in {
				s.mu.Lock()
				s.largest = max(s.largest, len(req.Payload))
				s.mu.Unlock()
				req.Reply(true, nil)
				if req.Type == "exec" {
					ch.SendRequest("exit-status", false, gossh.Marshal(&struct{ Status uint32 }{0}))
					ch.Close()
				}
			}
		}()
	}
}

// TestRunKeepsEveryRequestInOnePacket: an environment whose one request would be larger
// than an SSH packet goes one variable a request; a command too large for one is not sent;
// the connection serves on.
func TestRunKeepsEveryRequestInOnePacket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &sizeServer{}
	go func() {
		if c, err := ln.Accept(); err == nil {
			s.serve(t, c)
		}
	}()
	client, err := gossh.Dial("tcp", ln.Addr().String(), &gossh.ClientConfig{HostKeyCallback: gossh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	env := map[string]string{}
	for i := range 32 {
		env[fmt.Sprintf("LC_X%d", i)] = strings.Repeat("<", 4096) // 6 bytes each escaped in JSON
	}
	ctx := context.Background()
	res, err := Run(ctx, client, Exec{ExecutionID: "ex_1", Command: "true", Env: env})
	if err != nil || res.ExitStatus != 0 {
		t.Fatalf("Run with the large environment = %+v, %v", res, err)
	}
	if s.largest > MaxRequestPayload {
		t.Errorf("a request of %d bytes was sent; want at most %d", s.largest, MaxRequestPayload)
	}

	_, err = Run(ctx, client, Exec{ExecutionID: "ex_2", Command: strings.Repeat("x", MaxCommandBytes+1)})
	if !errors.Is(err, ErrRefused) || !errors.Is(err, ErrInvalidExec) {
		t.Fatalf("Run with a command past one request = %v; want ErrRefused and ErrInvalidExec", err)
	}
	if res, err := Run(ctx, client, Exec{ExecutionID: "ex_3", Command: strings.Repeat("x", MaxCommandBytes)}); err != nil || res.ExitStatus != 0 {
		t.Fatalf("Run after the refusal, with a command of the bound = %+v, %v; the connection broke", res, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.channels != 2 {
		t.Errorf("%d channels opened; want 2 (none for the refused request)", s.channels)
	}
}
