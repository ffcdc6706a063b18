package httpchannel_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postern-dev/postern/internal/testutil"
	"github.com/postern-dev/postern/plugins"
	httpchannel "github.com/postern-dev/postern/plugins/http"
)

const secret = "s3cret-token-value-7f3a"

// event is one journal call.
type event struct {
	kind   string
	id     string
	reason string
	resp   *plugins.HTTPResponse
}

// fakeJournal records journal calls in order; it can be told to fail one kind.
type fakeJournal struct {
	failDispatched error
	failCompleted  error

	mu     sync.Mutex
	events []event
}

func (j *fakeJournal) record(e event, fail error) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if fail != nil {
		return fail
	}
	j.events = append(j.events, e)
	return nil
}

func (j *fakeJournal) Dispatched(_ context.Context, id string) error {
	return j.record(event{kind: "dispatched", id: id}, j.failDispatched)
}

func (j *fakeJournal) Completed(_ context.Context, id string, resp plugins.HTTPResponse) error {
	return j.record(event{kind: "completed", id: id, resp: &resp}, j.failCompleted)
}

func (j *fakeJournal) Failed(_ context.Context, id, reason string) error {
	return j.record(event{kind: "failed", id: id, reason: reason}, nil)
}

func (j *fakeJournal) Unknown(_ context.Context, id, reason string) error {
	return j.record(event{kind: "unknown", id: id, reason: reason}, nil)
}

func (j *fakeJournal) kinds() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var ks []string
	for _, e := range j.events {
		ks = append(ks, e.kind)
	}
	return strings.Join(ks, ",")
}

// newChannel returns a channel whose log output is checked for the secret when the test ends.
func newChannel(t *testing.T, tlsConfig *tls.Config) *httpchannel.Channel {
	t.Helper()
	var logs testutil.LockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the secret appears in the channel's log:\n%s", logs.String())
		}
	})
	return httpchannel.New(httpchannel.Options{Logger: logger, TLSConfig: tlsConfig})
}

func action(id, url string) plugins.HTTPAction {
	return plugins.HTTPAction{
		ExecutionID:      id,
		Method:           http.MethodPost,
		URL:              url,
		Body:             []byte(`{"amount":10}`),
		Credential:       &plugins.Credential{Kind: plugins.CredentialBearer, Secret: secret},
		Timeout:          20 * time.Second,
		MaxResponseBytes: 1 << 20,
	}
}

func TestPerformCompletedDispatchedBeforeTargetSeesRequest(t *testing.T) {
	journal := &fakeJournal{}
	type seen struct {
		journalAtArrival string
		header           http.Header
		body             string
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{journalAtArrival: journal.kinds(), header: r.Header.Clone(), body: string(body)}
		w.Header().Set("X-Request-Id", "req-1")
		w.Header().Set("Set-Cookie", "session=abc")
		w.Header().Set("WWW-Authenticate", "Bearer")
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close)

	a := action("ex_01J8", srv.URL+"/v1/charges?x=1")
	a.Header = map[string][]string{
		"Authorization":   {"Bearer agent-chosen"},
		"cookie":          {"a=b"},
		"Idempotency-Key": {"agent-key"},
		"Content-Type":    {"application/json"},
	}
	a.KeepHeaders = []string{"x-request-id", "Set-Cookie", "Www-Authenticate", "Authorization"}
	out, err := newChannel(t, nil).Perform(context.Background(), a, journal)
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	s := <-got
	if s.journalAtArrival != "dispatched" {
		t.Errorf("journal when the target saw the request = %q; want %q", s.journalAtArrival, "dispatched")
	}
	for name, want := range map[string]string{
		"Idempotency-Key": `"ex_01J8"`,
		"Authorization":   "Bearer " + secret,
		"Cookie":          "",
		"Content-Type":    "application/json",
	} {
		if v := s.header.Values(name); strings.Join(v, "|") != want {
			t.Errorf("target saw %s = %q; want %q", name, v, want)
		}
	}
	if s.body != `{"amount":10}` {
		t.Errorf("target saw body %q", s.body)
	}
	if out.State != plugins.StateCompleted || out.Response == nil {
		t.Fatalf("outcome = %+v; want completed with a response", out)
	}
	resp := out.Response
	if resp.Status != http.StatusCreated || string(resp.Body) != `{"ok":true}` || resp.BodyBytes != 11 || resp.BodyTruncated {
		t.Errorf("response = %d %q (%d bytes, truncated %v); want 201 {\"ok\":true} (11 bytes)", resp.Status, resp.Body, resp.BodyBytes, resp.BodyTruncated)
	}
	if !resp.IdempotentReplayed {
		t.Error("IdempotentReplayed = false; want true")
	}
	if len(resp.Header) != 1 || resp.Header["X-Request-Id"][0] != "req-1" {
		t.Errorf("response headers = %v; want only X-Request-Id", resp.Header)
	}
	if k := journal.kinds(); k != "dispatched,completed" {
		t.Errorf("journal = %q; want dispatched,completed", k)
	}
}

func TestCredentialInjection(t *testing.T) {
	tests := []struct {
		name        string
		cred        *plugins.Credential
		agentHeader map[string][]string
		wantHeader  string
		wantValue   string
	}{
		{name: "bearer", cred: &plugins.Credential{Kind: "bearer", Secret: secret},
			agentHeader: map[string][]string{"Proxy-Authorization": {"x"}},
			wantHeader:  "Authorization", wantValue: "Bearer " + secret},
		{name: "basic", cred: &plugins.Credential{Kind: "basic", Username: "svc", Secret: secret},
			wantHeader: "Authorization", wantValue: "Basic c3ZjOnMzY3JldC10b2tlbi12YWx1ZS03ZjNh"},
		{name: "named header replaces the agent's", cred: &plugins.Credential{Kind: "header", Header: "x-api-key", Secret: secret},
			agentHeader: map[string][]string{"X-Api-Key": {"agent-guess"}, "Authorization": {"Bearer agent"}},
			wantHeader:  "X-Api-Key", wantValue: secret},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan http.Header, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.Header.Clone()
			}))
			t.Cleanup(srv.Close)
			a := action("ex_cred", srv.URL)
			a.Credential = tt.cred
			a.Header = tt.agentHeader
			if _, err := newChannel(t, nil).Perform(context.Background(), a, &fakeJournal{}); err != nil {
				t.Fatalf("Perform: %v", err)
			}
			h := <-got
			if v := h.Values(tt.wantHeader); len(v) != 1 || v[0] != tt.wantValue {
				t.Errorf("%s = %q; want [%q]", tt.wantHeader, v, tt.wantValue)
			}
			for _, name := range []string{"Authorization", "Proxy-Authorization"} {
				if name != tt.wantHeader && h.Get(name) != "" {
					t.Errorf("%s = %q reached the target; want it stripped", name, h.Get(name))
				}
			}
		})
	}
}

// freeAddr returns a 127.0.0.1 address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestFailedWhenNothingWasWritten(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(untrusted.Close)

	tests := []struct {
		name       string
		url        string
		journal    *fakeJournal
		mutate     func(*plugins.HTTPAction)
		wantReason string
	}{
		{name: "connection refused", url: "http://" + freeAddr(t) + "/x", journal: &fakeJournal{}, wantReason: "refused"},
		{name: "tls handshake fails", url: untrusted.URL, journal: &fakeJournal{}, wantReason: "tls handshake"},
		{name: "journaling dispatched fails", url: srv.URL, journal: &fakeJournal{failDispatched: errors.New("disk full")}, wantReason: "disk full"},
		{name: "header injection", url: srv.URL, journal: &fakeJournal{},
			mutate: func(a *plugins.HTTPAction) { a.Header = map[string][]string{"X-A": {"v\r\nX-Evil: 1"}} }, wantReason: "invalid value"},
		{name: "unknown credential kind", url: srv.URL, journal: &fakeJournal{},
			mutate: func(a *plugins.HTTPAction) { a.Credential = &plugins.Credential{Kind: "cookie", Secret: secret} }, wantReason: "credential kind"},
		{name: "scheme", url: "ftp://127.0.0.1/x", journal: &fakeJournal{}, wantReason: "scheme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := action("ex_failed", tt.url)
			if tt.mutate != nil {
				tt.mutate(&a)
			}
			out, err := newChannel(t, nil).Perform(context.Background(), a, tt.journal)
			if err != nil {
				t.Fatalf("Perform: %v", err)
			}
			if out.State != plugins.StateFailed || !strings.Contains(out.Reason, tt.wantReason) {
				t.Errorf("outcome = %s %q; want failed containing %q", out.State, out.Reason, tt.wantReason)
			}
			if k := tt.journal.kinds(); k != "failed" {
				t.Errorf("journal = %q; want failed", k)
			}
			if strings.Contains(out.Reason, secret) {
				t.Errorf("reason carries the secret: %q", out.Reason)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("targets saw %d requests; want 0", n)
	}
}

// hijackAfterRequest reads the whole request, then closes the connection without answering.
func hijackAfterRequest(requests *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		requests.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}
}

func TestUnknownWhenTheConnectionDropsAfterTheRequest(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(hijackAfterRequest(&requests))
	t.Cleanup(srv.Close)
	journal := &fakeJournal{}
	out, err := newChannel(t, nil).Perform(context.Background(), action("ex_unknown", srv.URL), journal)
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	if out.State != plugins.StateUnknown || !strings.Contains(out.Reason, "request written") {
		t.Errorf("outcome = %s %q; want unknown, request written", out.State, out.Reason)
	}
	if k := journal.kinds(); k != "dispatched,unknown" {
		t.Errorf("journal = %q; want dispatched,unknown", k)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("target saw %d requests; want exactly 1 (no transport retry)", n)
	}
}

func TestUnknownWhenTheResponseNeverComes(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	journal := &fakeJournal{}
	a := action("ex_timeout", srv.URL)
	a.Timeout = 300 * time.Millisecond
	out, err := newChannel(t, nil).Perform(context.Background(), a, journal)
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	if out.State != plugins.StateUnknown {
		t.Errorf("outcome = %s %q; want unknown", out.State, out.Reason)
	}
	if k := journal.kinds(); k != "dispatched,unknown" {
		t.Errorf("journal = %q; want dispatched,unknown", k)
	}
}

func TestResponseBodyCap(t *testing.T) {
	tests := []struct {
		name          string
		size          int
		limit         int64
		wantStored    int
		wantTruncated bool
	}{
		{name: "under the cap", size: 100, limit: 1000, wantStored: 100},
		{name: "exactly the cap", size: 1000, limit: 1000, wantStored: 1000},
		{name: "over the cap", size: 100_000, limit: 1000, wantStored: 1000, wantTruncated: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write(bytes.Repeat([]byte("a"), tt.size))
			}))
			t.Cleanup(srv.Close)
			a := action("ex_cap", srv.URL)
			a.MaxResponseBytes = tt.limit
			out, err := newChannel(t, nil).Perform(context.Background(), a, &fakeJournal{})
			if err != nil {
				t.Fatalf("Perform: %v", err)
			}
			r := out.Response
			if len(r.Body) != tt.wantStored || r.BodyBytes != int64(tt.size) || r.BodyTruncated != tt.wantTruncated {
				t.Errorf("stored %d of %d bytes, truncated %v; want %d of %d, truncated %v",
					len(r.Body), r.BodyBytes, r.BodyTruncated, tt.wantStored, tt.size, tt.wantTruncated)
			}
		})
	}
}

func TestRedirectIsNotFollowed(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	}))
	t.Cleanup(srv.Close)
	out, err := newChannel(t, nil).Perform(context.Background(), action("ex_redirect", srv.URL+"/here"), &fakeJournal{})
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	if out.Response == nil || out.Response.Status != http.StatusFound || hits.Load() != 1 {
		t.Errorf("outcome %+v after %d requests; want 302 after 1", out, hits.Load())
	}
}

func TestHTTPS(t *testing.T) {
	journal := &fakeJournal{}
	arrival := make(chan string, 1)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrival <- journal.kinds() + " " + r.Header.Get("Idempotency-Key")
		_, _ = io.WriteString(w, "secure")
	}))
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	out, err := newChannel(t, &tls.Config{RootCAs: roots}).Perform(context.Background(), action("ex_tls", srv.URL), journal)
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	if got := <-arrival; got != `dispatched "ex_tls"` {
		t.Errorf("at arrival: %q; want dispatched with key \"ex_tls\"", got)
	}
	if out.State != plugins.StateCompleted || string(out.Response.Body) != "secure" {
		t.Errorf("outcome = %+v; want completed \"secure\"", out)
	}
}

func TestJournalCompletedErrorIsReturned(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(srv.Close)
	_, err := newChannel(t, nil).Perform(context.Background(), action("ex_jerr", srv.URL),
		&fakeJournal{failCompleted: errors.New("journal closed")})
	if err == nil || !strings.Contains(err.Error(), "journal closed") {
		t.Errorf("err = %v; want the journal's error", err)
	}
}

// TestRawRequestOnTheWire checks the bytes the target receives: exactly one Idempotency-Key,
// an sf-string, and no agent authority headers.
func TestRawRequestOnTheWire(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	raw := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			raw <- ""
			return
		}
		defer func() { _ = conn.Close() }()
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			raw <- ""
			return
		}
		var b strings.Builder
		_ = req.Header.Write(&b)
		raw <- b.String()
		_, _ = io.WriteString(conn, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
	}()
	a := action(`ex_q"uote`, "http://"+ln.Addr().String()+"/")
	a.Header = map[string][]string{"idempotency-key": {"other"}, "X-Trace": {"t1"}}
	out, err := newChannel(t, nil).Perform(context.Background(), a, &fakeJournal{})
	if err != nil {
		t.Fatalf("Perform: %v", err)
	}
	got := <-raw
	if strings.Count(got, "Idempotency-Key:") != 1 || !strings.Contains(got, `Idempotency-Key: "ex_q\"uote"`) {
		t.Errorf("headers on the wire:\n%s\nwant one Idempotency-Key: \"ex_q\\\"uote\"", got)
	}
	if !strings.Contains(got, "X-Trace: t1") {
		t.Errorf("headers on the wire:\n%s\nwant the agent's X-Trace", got)
	}
	if out.Response.Status != http.StatusNoContent {
		t.Errorf("status = %d; want 204", out.Response.Status)
	}
}

// TestReflectedCredentialIsRedacted: a target that echoes the request's headers gets the
// secret back to the plugin in headers and body; what the plugin journals and returns holds
// the marker instead, in every form, also when the body cap falls inside the secret.
func TestReflectedCredentialIsRedacted(t *testing.T) {
	target := testutil.StartHTTPTarget(t, testutil.HTTPTargetOptions{})
	bearer := &plugins.Credential{Ref: "api", Kind: plugins.CredentialBearer, Secret: secret}
	basic := &plugins.Credential{Ref: "api", Kind: plugins.CredentialBasic, Username: "svc", Secret: secret}
	named := &plugins.Credential{Ref: "api", Kind: plugins.CredentialHeader, Header: "X-Api-Key", Secret: secret}
	basicValue := "Basic " + base64.StdEncoding.EncodeToString([]byte("svc:"+secret))
	tests := []struct {
		name  string
		cred  *plugins.Credential
		query string
		cap   int64
	}{
		{name: "bearer, all headers", cred: bearer, cap: 1 << 20},
		{name: "bearer, json", cred: bearer, query: "format=json", cap: 1 << 20},
		{name: "basic, all headers", cred: basic, cap: 1 << 20},
		{name: "named header", cred: named, query: "header=X-Api-Key", cap: 1 << 20},
		// The cap falls in the middle of the echoed secret.
		{name: "bearer cut in the secret", cred: bearer, query: "header=Authorization&pad=100", cap: 100 + int64(len("Bearer ")+len(secret)/2)},
		{name: "basic cut in the value", cred: basic, query: "header=Authorization&pad=100", cap: 100 + int64(len(basicValue)/2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			journal := &fakeJournal{}
			a := action("ex_echo", target.URL+"/v1/echo?"+tt.query)
			a.Credential = tt.cred
			a.MaxResponseBytes = tt.cap
			a.KeepHeaders = []string{"Echo-Authorization", "Echo-X-Api-Key", "Content-Type"}
			out, err := newChannel(t, nil).Perform(context.Background(), a, journal)
			if err != nil || out.Response == nil {
				t.Fatalf("Perform = %+v, %v; want a response", out, err)
			}
			if n := len(target.RequestsTo("/v1/echo")); n == 0 {
				t.Fatal("the target saw no request")
			}
			journal.mu.Lock()
			events := append([]event(nil), journal.events...)
			journal.mu.Unlock()
			if len(events) != 2 || events[1].resp == nil {
				t.Fatalf("journal = %+v; want dispatched, completed", events)
			}
			for where, resp := range map[string]plugins.HTTPResponse{"journal": *events[1].resp, "outcome": *out.Response} {
				stored, _ := json.Marshal(resp)
				raw := string(resp.Body) + fmt.Sprint(resp.Header)
				for _, form := range []string{secret, secret[:len(secret)/2], base64.StdEncoding.EncodeToString([]byte("svc:" + secret)), basicValue[:len(basicValue)/2+1]} {
					if strings.Contains(raw, form) || strings.Contains(string(stored), form) {
						t.Errorf("%s: %q is in the stored response: %s", where, form, stored)
					}
				}
				if !strings.Contains(raw, "[REDACTED:api]") && !resp.BodyTruncated {
					t.Errorf("%s: no marker in %s", where, stored)
				}
			}
		})
	}
}
