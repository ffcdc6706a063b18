package oauth

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeIntrospection is an RFC 7662 endpoint on 127.0.0.1 answering from a table of tokens,
// for the client bastion/secret only; it counts its requests.
type fakeIntrospection struct {
	url    string
	calls  atomic.Int64
	mu     sync.Mutex
	tokens map[string]map[string]any
}

func newFakeIntrospection(t *testing.T) *fakeIntrospection {
	t.Helper()
	f := &fakeIntrospection{tokens: map[string]map[string]any{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		if id, secret, ok := r.BasicAuth(); !ok || id != "bastion" || secret != "s3cret" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		f.mu.Lock()
		answer, ok := f.tokens[r.FormValue("token")]
		f.mu.Unlock()
		if !ok {
			answer = map[string]any{"active": false}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL + "/introspect"
	return f
}

func (f *fakeIntrospection) set(token string, answer map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens[token] = answer
}

func TestIntrospection(t *testing.T) {
	in := newFakeIntrospection(t)
	clk := &clock{now: time.Now()}
	const issuer = "https://idp.example.com"
	v, err := New(Options{Issuer: issuer, Resource: testResource, Now: clk.Now,
		Introspection: &Introspection{URL: in.url, ClientID: "bastion", ClientSecret: "s3cret"},
		Rules:         Rules{Actors: []Rule{{Actor: "ops", Groups: []string{"sre"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	now := clk.Now()
	answer := func(over map[string]any) map[string]any {
		a := map[string]any{"active": true, "iss": issuer, "sub": "alice", "aud": testResource, "client_id": "cli",
			"scope": "postern:read", "groups": []string{"sre"}, "exp": now.Add(5 * time.Minute).Unix()}
		for k, val := range over {
			if val == nil {
				delete(a, k)
			} else {
				a[k] = val
			}
		}
		return a
	}
	in.set("good", answer(nil))
	id, m, err := v.Verify(t.Context(), "good")
	if err != nil || id.Subject != "alice" || m.Actor != "ops" || strings.Join(id.Scopes, " ") != "postern:read" {
		t.Fatalf("an active token: %+v %+v %v", id, m, err)
	}
	for name, tc := range map[string]struct {
		answer map[string]any
		says   string
	}{
		"inactive":        {map[string]any{"active": false}, "not active"},
		"another issuer":  {answer(map[string]any{"iss": "https://evil.example"}), "issued by"},
		"other audience":  {answer(map[string]any{"aud": "https://other.example/mcp"}), "audience"},
		"no audience":     {answer(map[string]any{"aud": nil}), "audience"},
		"expired":         {answer(map[string]any{"exp": now.Add(-10 * time.Minute).Unix()}), "expired"},
		"no exp":          {answer(map[string]any{"exp": nil}), "no expiry"},
		"not yet valid":   {answer(map[string]any{"nbf": now.Add(10 * time.Minute).Unix()}), "not valid before"},
		"no subject":      {answer(map[string]any{"sub": nil}), "subject"},
		"active a string": {answer(map[string]any{"active": "true"}), "not active"},
	} {
		t.Run(name, func(t *testing.T) {
			tok := "tok-" + strings.ReplaceAll(name, " ", "-")
			in.set(tok, tc.answer)
			if _, _, err := v.Verify(t.Context(), tok); !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want ErrInvalidToken saying %q", err, tc.says)
			}
		})
	}
	// Remembered for 30 s: the provider is asked once; after a revocation there, the token is
	// refused once the 30 s are over.
	before := in.calls.Load()
	for range 5 {
		if _, _, err := v.Verify(t.Context(), "good"); err != nil {
			t.Fatal(err)
		}
	}
	if n := in.calls.Load() - before; n != 0 {
		t.Fatalf("%d introspections for a remembered token", n)
	}
	in.set("good", map[string]any{"active": false})
	clk.Add(introspectionTTL + time.Second)
	if _, _, err := v.Verify(t.Context(), "good"); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a token revoked at the provider, after the TTL: %v", err)
	}
	// A wrong client secret: the provider answers 401, the bastion says unavailable (503).
	bad, err := New(Options{Issuer: issuer, Resource: testResource,
		Introspection: &Introspection{URL: in.url, ClientID: "bastion", ClientSecret: "wrong"},
		Rules:         Rules{Actors: []Rule{{Actor: "ops", Groups: []string{"sre"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bad.Verify(t.Context(), "good"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a refused introspection: %v, want ErrUnavailable", err)
	}
}
