package transport

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a log sink the handler writes while the test reads (internal/testutil
// imports this package).
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestActorTableAuthenticate(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	table, err := newActorTable([]Actor{
		{Name: "alice", TokenSHA256: HashToken("tok-a")},
		{Name: "bob", TokenSHA256: HashToken("tok-b")},
		{Name: "carol"}, // issued tokens only
	}, []IssuedToken{
		{ID: "tok_c1", Actor: "carol", SHA256: HashToken("tok-c1")},
		{ID: "tok_c2", Actor: "carol", SHA256: HashToken("tok-c2"), Expires: now.Add(time.Second)},
		{ID: "tok_c3", Actor: "carol", SHA256: HashToken("tok-c3"), Expires: now},
		{ID: "tok_c4", Actor: "carol", SHA256: HashToken("tok-c4"), Revoked: true},
		{ID: "tok_c5", Actor: "carol", SHA256: HashToken("tok-c5"), Revoked: true, Expires: now.Add(-time.Hour)},
		{ID: "tok_d1", Actor: "dave", SHA256: HashToken("tok-d1")}, // no such actor
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		token, want string
		wantErr     error
	}{
		{"tok-a", "alice", nil},
		{"tok-b", "bob", nil},
		{"tok-c1", "carol", nil},
		{"tok-c2", "carol", nil},
		{"tok-c3", "", errTokenExpired}, // expires at its expiry itself
		{"tok-c4", "", errTokenRevoked},
		{"tok-c5", "", errTokenRevoked}, // revoked wins
		{"tok-d1", "", errUnknownToken},
		{"tok-x", "", errUnknownToken},
		{"", "", errUnknownToken},
		{strings.Repeat("x", maxTokenBytes+1), "", errUnknownToken},
	}
	for _, tt := range tests {
		got, err := table.authenticate(tt.token, now)
		if got != tt.want || err != tt.wantErr {
			t.Errorf("authenticate(%.10q) = %q, %v; want %q, %v", tt.token, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestActorSetRefusesSharedHashes(t *testing.T) {
	h := HashToken("same")
	if _, err := NewActorSet([]Actor{{Name: "a", TokenSHA256: h}}, []IssuedToken{{ID: "tok_1", Actor: "a", SHA256: h}}, nil); err == nil || !strings.Contains(err.Error(), "same token hash") {
		t.Fatalf("err = %v; want a shared hash refused", err)
	}
	s, err := NewActorSet([]Actor{{Name: "a"}}, []IssuedToken{{ID: "tok_1", Actor: "a", SHA256: h}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckActors([]Actor{{Name: "a", TokenSHA256: h}}); err == nil {
		t.Fatal("a reload whose static token equals an issued one was accepted")
	}
}

// A token is checked on every request: revoked or expired, the next request on the same
// keep-alive connection is refused with the challenge the MCP client reads, and the
// operator's log says which it was.
func TestHTTPIssuedTokenRefusedOnOpenConnection(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	issued := []IssuedToken{
		{ID: "tok_r", Actor: "carol", SHA256: HashToken("pst_revoke-me")},
		{ID: "tok_e", Actor: "carol", SHA256: HashToken("pst_expire-me"), Expires: now.Add(time.Minute)},
	}
	set, err := NewActorSet([]Actor{{Name: "carol"}}, issued, clock)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	h, err := HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }),
		HTTPOptions{ActorSet: set, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := srv.Client()
	conns := 0
	get := func(token string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/mcp", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+token)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				if !info.Reused {
					conns++
				}
			},
		}))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) // so that the connection is reused
		resp.Body.Close()
		return resp
	}
	for _, tok := range []string{"pst_revoke-me", "pst_expire-me"} {
		if resp := get(tok); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d before revocation or expiry", tok, resp.StatusCode)
		}
	}
	if !set.LastUsed("tok_r").Equal(now) || !set.LastUsed("tok_x").IsZero() {
		t.Errorf("last used = %v, %v; want %v and zero", set.LastUsed("tok_r"), set.LastUsed("tok_x"), now)
	}

	issued[0].Revoked = true
	if err := set.SetIssued(issued); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	for tok, want := range map[string]string{"pst_revoke-me": "token revoked", "pst_expire-me": "token expired", "pst_unknown": "unknown token"} {
		resp := get(tok)
		challenge := resp.Header.Get("WWW-Authenticate")
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(challenge, `error="invalid_token"`) || !strings.Contains(challenge, want) {
			t.Errorf("%s: status %d, challenge %q; want 401 with invalid_token and %q", tok, resp.StatusCode, challenge, want)
		}
	}
	if conns != 1 {
		t.Errorf("requests used %d connections; want 1 (the refusals on the open connection)", conns)
	}
	// The handler logs after it answered: wait for the last line.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "reason=unauthenticated") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	for _, line := range []string{"refused a revoked token", "refused an expired token", "reason=token_revoked", "reason=token_expired"} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("log lacks %q:\n%s", line, logs.String())
		}
	}
	if strings.Contains(logs.String(), "pst_") {
		t.Errorf("a token reached the log:\n%s", logs.String())
	}
}
