package transport

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// httpFixture is the test server behind HTTPHandler on 127.0.0.1.
type httpFixture struct {
	url        string
	innerCalls atomic.Int64 // requests that reached the MCP handler
	tokens     map[string]string
}

const testMaxBody = 64 << 10

func newHTTPFixture(t *testing.T) *httpFixture {
	t.Helper()
	f := &httpFixture{tokens: map[string]string{}}
	var actors []Actor
	for _, name := range []string{"alice", "bob"} {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		f.tokens[name] = tok
		actors = append(actors, Actor{Name: name, TokenSHA256: HashToken(tok)})
	}
	ts := newTestServer(t, nil)
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.innerCalls.Add(1)
		ts.handler.ServeHTTP(w, r)
	})
	h, err := HTTPHandler(counted, HTTPOptions{
		Actors:         actors,
		MaxBodyBytes:   testMaxBody,
		AllowedOrigins: []string{"https://console.example"},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	f.url = srv.URL + "/mcp"
	return f
}

func (f *httpFixture) connect(t *testing.T, header http.Header) (*mcp.ClientSession, error) {
	t.Helper()
	client := &http.Client{Transport: headerRoundTripper{header: header, base: http.DefaultTransport}}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "0"}, nil)
	return c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: f.url, HTTPClient: client}, nil)
}

func TestHTTPCallerReachesToolHandler(t *testing.T) {
	f := newHTTPFixture(t)
	tests := []struct {
		name   string
		header http.Header
		want   Caller
	}{
		{
			name:   "alice",
			header: http.Header{"Authorization": {"Bearer " + f.tokens["alice"]}},
			want:   Caller{Actor: "token:alice"},
		},
		{
			name:   "bob with a run id",
			header: http.Header{"Authorization": {"Bearer " + f.tokens["bob"]}, RunHeader: {"ci-build-42"}},
			want:   Caller{Actor: "token:bob", RunID: "ci-build-42"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs, err := f.connect(t, tt.header)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer cs.Close()
			got := callWhoami(t, cs)
			if !got.OK || got.Caller != tt.want {
				t.Errorf("whoami = %+v; want ok and %+v", got, tt.want)
			}
			if got.SawAuthorization {
				t.Error("the Authorization header reached the tool handler")
			}
		})
	}
}

func TestHTTPClientWithoutValidTokenCannotConnect(t *testing.T) {
	f := newHTTPFixture(t)
	for name, header := range map[string]http.Header{
		"missing": nil,
		"wrong":   {"Authorization": {"Bearer pst_not-a-configured-token"}},
		"hash":    {"Authorization": {"Bearer " + HashToken(f.tokens["alice"])}},
	} {
		t.Run(name, func(t *testing.T) {
			cs, err := f.connect(t, header)
			if err == nil {
				cs.Close()
				t.Fatal("connect succeeded; want an error")
			}
			if !strings.Contains(err.Error(), "401") && !strings.Contains(err.Error(), "Unauthorized") {
				t.Errorf("connect error = %v; want a 401", err)
			}
		})
	}
	if n := f.innerCalls.Load(); n != 0 {
		t.Errorf("MCP handler saw %d unauthenticated requests; want 0", n)
	}
}

// chunkedReader hides the body length so that net/http sends it chunked.
type chunkedReader struct{ io.Reader }

func TestHTTPRefusals(t *testing.T) {
	f := newHTTPFixture(t)
	listTools := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`
	big := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"` + strings.Repeat("x", testMaxBody) + `"}}`
	tests := []struct {
		name           string
		host, origin   string
		auth           string
		runID          []string
		body           io.Reader
		wantStatus     int
		wantChallenge  bool
		wantInnerCalls int64
	}{
		{name: "good token", auth: "alice", body: strings.NewReader(listTools), wantStatus: 200, wantInnerCalls: 1},
		{name: "missing token", body: strings.NewReader(listTools), wantStatus: 401, wantChallenge: true},
		{name: "bad token", auth: "nobody", body: strings.NewReader(listTools), wantStatus: 401, wantChallenge: true},
		{name: "rebinding host", host: "evil.example", auth: "alice", body: strings.NewReader(listTools), wantStatus: 403},
		{name: "rebinding host with port", host: "evil.example:80", auth: "alice", body: strings.NewReader(listTools), wantStatus: 403},
		{name: "localhost host", host: "localhost:1234", auth: "alice", body: strings.NewReader(listTools), wantStatus: 200, wantInnerCalls: 1},
		{name: "foreign origin", origin: "https://evil.example", auth: "alice", body: strings.NewReader(listTools), wantStatus: 403},
		{name: "allowed origin", origin: "https://console.example", auth: "alice", body: strings.NewReader(listTools), wantStatus: 200, wantInnerCalls: 1},
		{name: "loopback origin", origin: "http://localhost:6274", auth: "alice", body: strings.NewReader(listTools), wantStatus: 200, wantInnerCalls: 1},
		{name: "null origin", origin: "null", auth: "alice", body: strings.NewReader(listTools), wantStatus: 403},
		{name: "oversize body", auth: "alice", body: strings.NewReader(big), wantStatus: 413},
		{name: "oversize chunked body", auth: "alice", body: chunkedReader{strings.NewReader(big)}, wantStatus: 413},
		{name: "valid run id", auth: "alice", runID: []string{"run-1"}, body: strings.NewReader(listTools), wantStatus: 200, wantInnerCalls: 1},
		{name: "run id with space", auth: "alice", runID: []string{"run 1"}, body: strings.NewReader(listTools), wantStatus: 400},
		{name: "run id too long", auth: "alice", runID: []string{strings.Repeat("r", 129)}, body: strings.NewReader(listTools), wantStatus: 400},
		{name: "two run ids", auth: "alice", runID: []string{"a", "b"}, body: strings.NewReader(listTools), wantStatus: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.url, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tt.host != "" {
				req.Host = tt.host
			}
			if tt.origin != "" {
				req.Header.Set("Origin", tt.origin)
			}
			if tt.auth != "" {
				tok, ok := f.tokens[tt.auth]
				if !ok {
					tok = "pst_" + tt.auth
				}
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			req.Header[RunHeader] = tt.runID
			before := f.innerCalls.Load()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status = %d; want %d", resp.StatusCode, tt.wantStatus)
			}
			challenge := resp.Header.Get("WWW-Authenticate")
			if gotChallenge := strings.HasPrefix(challenge, "Bearer"); gotChallenge != tt.wantChallenge {
				t.Errorf("WWW-Authenticate = %q; want a Bearer challenge: %v", challenge, tt.wantChallenge)
			}
			if got := f.innerCalls.Load() - before; got != tt.wantInnerCalls {
				t.Errorf("MCP handler calls = %d; want %d", got, tt.wantInnerCalls)
			}
		})
	}
}

func TestHTTPHandlerRejectsBadActorConfig(t *testing.T) {
	good := HashToken("a")
	tests := []struct {
		name   string
		actors []Actor
		want   string
	}{
		{name: "empty name", actors: []Actor{{Name: "", TokenSHA256: good}}, want: "non-empty"},
		{name: "short hash", actors: []Actor{{Name: "a", TokenSHA256: "abcd"}}, want: "64 hex"},
		{name: "duplicate name", actors: []Actor{{Name: "a", TokenSHA256: good}, {Name: "a", TokenSHA256: HashToken("b")}}, want: "twice"},
		{name: "shared token", actors: []Actor{{Name: "a", TokenSHA256: good}, {Name: "b", TokenSHA256: good}}, want: "same token hash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := HTTPHandler(http.NotFoundHandler(), HTTPOptions{Actors: tt.actors})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v; want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestNewToken(t *testing.T) {
	a, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	if a == b || !strings.HasPrefix(a, "pst_") || len(a) != len("pst_")+43 {
		t.Errorf("NewToken = %q, %q; want two distinct pst_ + 43 base64url characters", a, b)
	}
	if h := HashToken(a); len(h) != 64 || bytes.ContainsAny([]byte(h), "ABCDEF") {
		t.Errorf("HashToken = %q; want 64 lower-case hex digits", h)
	}
}

func FuzzValidRunID(f *testing.F) {
	for _, s := range []string{"", "run-1", "run 1", strings.Repeat("r", 128), strings.Repeat("r", 129), "é", "a\x00b", "a\nb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ok := ValidRunID(s)
		_, err := runIDFromHeader(http.Header{RunHeader: {s}})
		if ok != (err == nil) {
			t.Fatalf("ValidRunID(%q) = %v but header check err = %v", s, ok, err)
		}
		if !ok {
			return
		}
		if len(s) > maxRunIDBytes || strings.ContainsAny(s, " \t\r\n") {
			t.Fatalf("ValidRunID(%q) accepted an over-long or spaced value", s)
		}
		for _, r := range s {
			if r < 0x21 || r > 0x7e {
				t.Fatalf("ValidRunID(%q) accepted %U", s, r)
			}
		}
	})
}
