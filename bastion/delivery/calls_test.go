package delivery

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// fakeClock is a settable clock for the registry.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestCancelRegistry(t *testing.T) {
	key := requestKey{actor: "token:agent", scope: "run-1", id: "3"}
	type step struct {
		do            string // begin, finish, cancel, wait
		delivered     []string
		wait          time.Duration
		wantRevoke    []string
		wantAborted   bool
		wantCancel    bool
		wantNotCancel bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "no cancel: nothing revoked", steps: []step{
			{do: "begin"}, {do: "finish", delivered: []string{"ex_1"}}, {do: "wait", wait: time.Second},
		}},
		{name: "cancel in flight: aborted, delivery never recorded", steps: []step{
			{do: "begin"}, {do: "cancel", wantAborted: true, wantCancel: true}, {do: "finish"},
		}},
		{name: "cancel while the delivery was being recorded: revoked at finish", steps: []step{
			{do: "begin"}, {do: "cancel", wantAborted: true, wantCancel: true}, {do: "finish", delivered: []string{"ex_1"}, wantRevoke: []string{"ex_1"}},
		}},
		{name: "cancel after delivery within the grace window: revoked", steps: []step{
			{do: "begin"}, {do: "finish", delivered: []string{"ex_1"}}, {do: "wait", wait: 29 * time.Second},
			{do: "cancel", wantRevoke: []string{"ex_1"}},
		}},
		{name: "second cancel revokes nothing more", steps: []step{
			{do: "begin"}, {do: "finish", delivered: []string{"ex_1"}},
			{do: "cancel", wantRevoke: []string{"ex_1"}}, {do: "cancel"},
		}},
		{name: "cancel after the grace window: delivery stands", steps: []step{
			{do: "begin"}, {do: "finish", delivered: []string{"ex_1"}}, {do: "wait", wait: 31 * time.Second},
			{do: "cancel"},
		}},
		{name: "cancel overtaking its call cancels it at begin", steps: []step{
			{do: "cancel"}, {do: "begin", wantCancel: true}, {do: "finish", delivered: []string{"ex_1"}, wantRevoke: []string{"ex_1"}},
		}},
		{name: "late cancel of a call that delivered nothing is no orphan", steps: []step{
			{do: "begin"}, {do: "finish"}, {do: "cancel"}, {do: "begin", wantNotCancel: true}, {do: "finish", delivered: []string{"ex_2"}},
		}},
		{name: "early cancel expires", steps: []step{
			{do: "cancel"}, {do: "wait", wait: 31 * time.Second}, {do: "begin"}, {do: "finish", delivered: []string{"ex_1"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(1000, 0)}
			reg := newCallRegistry(30*time.Second, clock.now)
			var call *trackedCall
			aborted := false
			for i, s := range tt.steps {
				var revoke []string
				switch s.do {
				case "begin":
					call = reg.begin(key, func() { aborted = true })
				case "finish":
					revoke = reg.finish(call, s.delivered)
				case "cancel":
					revoke = reg.abandon(key)
				case "wait":
					clock.t = clock.t.Add(s.wait)
				}
				if !slices.Equal(revoke, s.wantRevoke) {
					t.Fatalf("step %d %s: revoke = %v; want %v", i, s.do, revoke, s.wantRevoke)
				}
				if s.wantAborted && !aborted {
					t.Fatalf("step %d %s: the call's handler was not aborted", i, s.do)
				}
				if s.wantCancel && !reg.abandoned(call) {
					t.Fatalf("step %d %s: the call is not cancelled", i, s.do)
				}
				if s.wantNotCancel && reg.abandoned(call) {
					t.Fatalf("step %d %s: the call is cancelled", i, s.do)
				}
			}
		})
	}
}

func TestCancelRegistryKeys(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	reg := newCallRegistry(30*time.Second, clock.now)
	mine := reg.begin(requestKey{"token:agent", "run-1", "7"}, nil)
	otherRun := reg.begin(requestKey{"token:agent", "run-2", "7"}, nil)
	otherActor := reg.begin(requestKey{"token:other", "run-1", "7"}, nil)
	otherID := reg.begin(requestKey{"token:agent", "run-1", "8"}, nil)
	reg.abandon(requestKey{"token:agent", "run-1", "7"})
	for name, c := range map[string]*trackedCall{"another run": otherRun, "another actor": otherActor, "another request id": otherID} {
		if reg.abandoned(c) {
			t.Errorf("a cancel of another caller's request cancelled %s", name)
		}
	}
	if !reg.abandoned(mine) {
		t.Error("the cancel did not reach its own request")
	}
}

func TestCancelRegistryIsBounded(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	reg := newCallRegistry(30*time.Second, clock.now)
	for i := range maxFinishedCalls + 100 {
		c := reg.begin(requestKey{"token:agent", "", fmt.Sprint(i)}, nil)
		reg.finish(c, []string{"ex_1"})
		reg.abandon(requestKey{"token:agent", "", fmt.Sprint(-i - 1)}) // unmatched: kept
	}
	reg.mu.Lock()
	finished, keys := len(reg.finished), len(reg.calls)
	reg.mu.Unlock()
	if finished > maxFinishedCalls || keys > maxFinishedCalls {
		t.Errorf("registry holds %d finished calls under %d keys; want at most %d", finished, keys, maxFinishedCalls)
	}
	clock.t = clock.t.Add(time.Minute)
	reg.abandon(requestKey{"token:agent", "", "x"})
	reg.mu.Lock()
	finished = len(reg.finished)
	reg.mu.Unlock()
	if finished != 1 {
		t.Errorf("after the grace window the registry holds %d finished calls; want only the last cancel", finished)
	}
}

func TestPeekMessages(t *testing.T) {
	tests := []struct {
		name, body string
		want       []rpcPeek
	}{
		{name: "tools/call", body: `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ssh_exec"}}`, want: []rpcPeek{{Call: "3"}}},
		{name: "string id", body: `{"jsonrpc":"2.0","id":"a b","method":"tools/call"}`, want: []rpcPeek{{Call: `"a b"`}}},
		{name: "cancel", body: `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"timeout"}}`, want: []rpcPeek{{Cancelled: "3"}}},
		{name: "cancel with spaced id", body: `{"method":"notifications/cancelled","params":{"requestId": "x" }}`, want: []rpcPeek{{Cancelled: `"x"`}}},
		{name: "batch", body: `[{"id":1,"method":"tools/call"},{"method":"notifications/cancelled","params":{"requestId":0}}]`, want: []rpcPeek{{Call: "1"}, {Cancelled: "0"}}},
		{name: "other method", body: `{"id":1,"method":"tools/list"}`},
		{name: "call without id", body: `{"method":"tools/call"}`},
		{name: "null id", body: `{"id":null,"method":"tools/call"}`},
		{name: "object id", body: `{"id":{"a":1},"method":"tools/call"}`},
		{name: "cancel with an id is not a notification", body: `{"id":1,"method":"notifications/cancelled","params":{"requestId":2}}`},
		{name: "cancel without request id", body: `{"method":"notifications/cancelled","params":{}}`},
		{name: "not JSON", body: `hello`},
		{name: "empty", body: ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := peekMessages([]byte(tt.body)); !slices.Equal(got, tt.want) {
				t.Errorf("peekMessages(%s) = %+v; want %+v", tt.body, got, tt.want)
			}
		})
	}
}

func FuzzPeekMessages(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ssh_exec"}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"abc","reason":"x"}}`,
		`[{"id":1,"method":"tools/call"},{"method":"notifications/cancelled","params":{"requestId":1}}]`,
		`{"id":-1.5e3,"method":"tools/call"}`, `[`, `{"id":"\u0000"}`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, m := range peekMessages(body) {
			id := m.Call + m.Cancelled
			if (m.Call == "") == (m.Cancelled == "") {
				t.Fatalf("peek %+v: want exactly one of call and cancel", m)
			}
			if len(id) > maxRequestIDBytes || compactID([]byte(id)) != id {
				t.Fatalf("peek %+v: id is not a bounded compact JSON id", m)
			}
		}
	})
}
