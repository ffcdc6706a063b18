package engine_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/markers"
)

// TestDialOutsideTheIntakeLocks: a call whose host has no pooled connection dials it without
// holding the intake's locks, so the same actor's calls to other hosts — which wait for its
// admission when it has limits — go on while that dial hangs; and once the dial fails, the
// call ends failed with nothing sent, as before.
func TestDialOutsideTheIntakeLocks(t *testing.T) {
	f := newFleet(t, func(c *config.Config) { c.Actors[0].MaxConcurrent = 5 })
	// A host that accepts TCP connections and never answers the SSH handshake.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	stalled := f.hostAs("stalled")
	stalled.Addr = ln.Addr().String()
	f.enroll(t, stalled)
	finished(t, f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "true"})) // h1's connection is pooled

	var wg sync.WaitGroup
	var hung *api.Execution
	var hungErr error
	hungDone := make(chan struct{})
	wg.Go(func() {
		defer close(hungDone)
		hung, hungErr = f.engine().Exec(context.Background(), alice, api.ExecArgs{Host: "stalled", Command: f.effect("stalled")}, nil)
	})
	var conn net.Conn
	select {
	case conn = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the call to the stalled host never dialed it")
	}
	// The dial hangs in the handshake; alice's call to h1 must not wait for it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		finished(t, f.exec(t, alice, api.ExecArgs{Host: "h1", Command: "echo another"}))
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("a call to another host waited for the stalled host's dial")
	}
	select {
	case <-hungDone:
		t.Fatalf("the stalled call ended before its dial did: %+v, %v", hung, hungErr)
	default:
	}
	conn.Close() // the handshake fails: the stalled call ends
	wg.Wait()
	<-done
	if hungErr != nil {
		t.Fatal(hungErr)
	}
	if hung.State != string(markers.Failed) {
		t.Errorf("the call to the stalled host ended %s; want failed (nothing sent)", hung.State)
	}
	if n := f.count(t, "stalled"); n != 0 {
		t.Errorf("the stalled host's command ran %d times", n)
	}
}
