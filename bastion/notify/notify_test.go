package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/testutil"
)

// results counts what a Notifier reported.
type results struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *results) add(s string) { r.mu.Lock(); r.n[s]++; r.mu.Unlock() }
func (r *results) get(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[s]
}

// TestAnnounceSignsAndRetries: the request arrives as JSON, signed with the secret read from
// its file; a failed send is retried.
func TestAnnounceSignsAndRetries(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []*api.ApprovalRequest
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		mac := hmac.New(sha256.New, []byte("s3cret"))
		mac.Write(body)
		if want := "sha256=" + hex.EncodeToString(mac.Sum(nil)); r.Header.Get(SignatureHeader) != want || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("signature %q, content type %q; want %q, application/json", r.Header.Get(SignatureHeader), r.Header.Get("Content-Type"), want)
		}
		var req api.ApprovalRequest
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("body %s: %v", body, err)
		}
		got = append(got, &req)
	}))
	defer srv.Close()
	res := &results{n: map[string]int{}}
	n := New(Options{URL: srv.URL, SecretFile: secret, Result: res.add})
	defer n.Close()
	n.Announce(&api.ApprovalRequest{ExecutionID: "ex_1", Actor: "token:agent", What: "migrate up", Reason: "ship release 42"})
	testutil.WaitFor(t, "the request to be sent", func() bool { return res.get("sent") == 1 })
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 || len(got) != 1 || got[0].ExecutionID != "ex_1" || got[0].Reason != "ship release 42" {
		t.Fatalf("calls %d, got %+v; want one retry, then the request", calls, got)
	}
}

// TestAnnounceFailsAndDrops: a webhook that keeps failing is given up after its attempts;
// a full queue drops a request instead of blocking the call that announced it.
func TestAnnounceFailsAndDrops(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	defer srv.Close()
	res := &results{n: map[string]int{}}
	n := New(Options{URL: srv.URL, Result: res.add})
	for i := 0; i < queueLen+2; i++ {
		n.Announce(&api.ApprovalRequest{ExecutionID: "ex_x"})
	}
	if res.get("dropped") == 0 {
		t.Errorf("dropped %d; want some once the queue is full", res.get("dropped"))
	}
	close(release)
	n.Close()

	res = &results{n: map[string]int{}}
	n = New(Options{URL: srv.URL, Result: res.add})
	defer n.Close()
	n.Announce(&api.ApprovalRequest{ExecutionID: "ex_y"})
	testutil.WaitFor(t, "the request to be given up", func() bool { return res.get("failed") == 1 })
}

// TestSecretFile: an empty, missing or oversized secret is an error that says which file.
func TestSecretFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"empty": "\n", "big": string(make([]byte, maxSecretBytes+1))} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readSecret(p); err == nil {
			t.Errorf("readSecret(%s) = nil error", name)
		}
	}
	if _, err := readSecret(filepath.Join(dir, "missing")); err == nil {
		t.Error("readSecret(missing) = nil error")
	}
}
