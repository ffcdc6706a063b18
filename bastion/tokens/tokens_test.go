package tokens

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func hashOf(b byte) string { return strings.Repeat(string("0123456789abcdef"[b%16]), 64) }

func TestParseExpiry(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Time
		wantErr string
	}{
		{in: "", want: now.Add(DefaultLifetime)},
		{in: "never", want: time.Time{}},
		{in: "30d", want: now.Add(30 * 24 * time.Hour)},
		{in: "12h", want: now.Add(12 * time.Hour)},
		{in: "1h30m", want: now.Add(90 * time.Minute)},
		{in: "2s", want: now.Add(2 * time.Second)},
		{in: "2026-12-31T00:00:00Z", want: time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC)},
		{in: "2026-12-31T01:00:00+01:00", want: time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC)},
		{in: "0d", wantErr: "positive"},
		{in: "-5d", wantErr: "positive"},
		{in: "-1h", wantErr: "positive"},
		{in: "1825d", want: now.Add(1825 * 24 * time.Hour)},
		{in: "1826d", wantErr: "at most 1825d"},
		{in: "99999999999999999999d", wantErr: "want a lifetime"}, // not an int
		{in: "9223372036d", wantErr: "at most 1825d"},             // would overflow a Duration
		{in: "2026-12-02T12:00:00Z", wantErr: "not in the future"},
		{in: "2020-01-01T00:00:00Z", wantErr: "not in the future"},
		{in: "2040-01-01T00:00:00Z", wantErr: "at most 1825d from now"},
		{in: "2026-12-31", wantErr: "want a lifetime"},
		{in: "tomorrow", wantErr: "want a lifetime"},
		{in: "30 d", wantErr: "want a lifetime"},
	}
	for _, tt := range tests {
		got, err := ParseExpiry(tt.in, now)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseExpiry(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !got.Equal(tt.want) {
			t.Errorf("ParseExpiry(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func FuzzParseExpiry(f *testing.F) {
	for _, s := range []string{"30d", "12h", "never", "2026-12-31T00:00:00Z", "-1d", "9223372036854775807d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		at, err := ParseExpiry(s, now)
		if err != nil {
			return
		}
		if !at.IsZero() && (!at.After(now) || at.Sub(now) > MaxLifetime) {
			t.Fatalf("ParseExpiry(%q) = %v: outside (now, now+MaxLifetime]", s, at)
		}
	})
}

func TestStateAt(t *testing.T) {
	exp := now.Add(time.Hour)
	tests := []struct {
		name string
		tok  Token
		at   time.Time
		want State
	}{
		{"never expires", Token{}, now.Add(100 * 365 * 24 * time.Hour), Active},
		{"before expiry", Token{Expires: exp}, exp.Add(-time.Nanosecond), Active},
		{"at expiry", Token{Expires: exp}, exp, Expired},
		{"revoked", Token{Revoked: now}, now, Revoked},
		{"revoked and expired", Token{Revoked: now, Expires: exp}, exp.Add(time.Hour), Revoked},
	}
	for _, tt := range tests {
		if got := tt.tok.StateAt(tt.at); got != tt.want {
			t.Errorf("%s: %s; want %s", tt.name, got, tt.want)
		}
	}
}

// Issue and revoke are logged and stored before they apply; a reopened store has them;
// a revocation is final and a second one writes nothing.
func TestStoreIssueRevoke(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Issue("ci", hashOf(1), now.Add(time.Hour), "operator:alice", now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Issue("ci", hashOf(2), time.Time{}, "operator:alice", now)
	if err != nil {
		t.Fatal(err)
	}
	if !ValidID(a.ID) || a.ID == b.ID || a.StateAt(now) != Active {
		t.Fatalf("issued %+v, %+v", a, b)
	}
	if _, err := s.Issue("ci", hashOf(1), time.Time{}, "operator:alice", now); err == nil {
		t.Fatal("a second token with the same hash was issued")
	}
	if _, err := s.Issue("bad name", hashOf(3), time.Time{}, "operator:alice", now); err == nil {
		t.Fatal("a token for an invalid actor name was issued")
	}
	rev, changed, err := s.Revoke(a.ID, "operator:bob", now.Add(time.Minute))
	if err != nil || !changed || rev.StateAt(now.Add(time.Minute)) != Revoked || rev.RevokedBy != "operator:bob" {
		t.Fatalf("revoke = %+v, %v, %v", rev, changed, err)
	}
	if _, changed, err := s.Revoke(a.ID, "operator:carol", now.Add(2*time.Minute)); err != nil || changed {
		t.Fatalf("second revoke: changed %v, %v; want unchanged", changed, err)
	}
	if _, _, err := s.Revoke("tok_aaaaaaaaaaaaaaaa", "operator:bob", now); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke of an unknown id: %v; want ErrNotFound", err)
	}

	reopened, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := reopened.Tokens()
	if len(got) != 2 || got[0].ID != a.ID || got[0].StateAt(now) != Revoked || got[0].RevokedBy != "operator:bob" || got[1].ID != b.ID || !got[1].Expires.IsZero() {
		t.Fatalf("reopened store = %+v", got)
	}
	events := readLog(t, dir)
	if len(events) != 3 || events[0].Event != "issue" || events[1].Event != "issue" || events[2].Event != "revoke" ||
		events[2].ID != a.ID || events[2].By != "operator:bob" || !events[2].At.Equal(now.Add(time.Minute)) || !events[0].Expires.Equal(a.Expires) {
		t.Fatalf("token log = %+v; want issue, issue, revoke (by bob)", events)
	}
	for _, name := range []string{StoreFile, LogFile} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", name, err, fi.Mode())
		}
	}
	if data, _ := os.ReadFile(filepath.Join(dir, StoreFile)); strings.Contains(string(data), "pst_") {
		t.Error("the store holds a token")
	}
}

// Ended tokens are dropped from the store once Retain has passed; the log keeps them.
func TestStoreRetain(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := s.Issue("ci", hashOf(1), now.Add(time.Hour), "op", now)
	keep, _ := s.Issue("ci", hashOf(2), time.Time{}, "op", now)
	later := now.Add(time.Hour + Retain + time.Second)
	if _, err := s.Issue("ci", hashOf(3), time.Time{}, "op", later); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tok := range s.Tokens() {
		ids = append(ids, tok.ID)
		if tok.ID == old.ID {
			t.Errorf("%s expired more than %v ago and is still stored", old.ID, Retain)
		}
	}
	if len(ids) != 2 || ids[0] != keep.ID {
		t.Errorf("tokens = %v", ids)
	}
	if n := len(readLog(t, dir)); n != 3 {
		t.Errorf("log has %d events; want 3", n)
	}
}

// A store file that does not parse, or breaks an invariant, is refused: the daemon must not
// start with revocations lost.
func TestLoadRefusesBadStore(t *testing.T) {
	good := Token{ID: "tok_aaaaaaaaaaaaaaaa", Actor: "ci", SHA256: hashOf(1), Created: now}
	tests := map[string]any{
		"not json":      "{",
		"unknown field": map[string]any{"tokens": []any{}, "extra": 1},
		"bad id":        storeFile{Tokens: []Token{{ID: "tok_1", Actor: "ci", SHA256: hashOf(1), Created: now}}},
		"bad hash":      storeFile{Tokens: []Token{{ID: good.ID, Actor: "ci", SHA256: "ab", Created: now}}},
		"upper hash":    storeFile{Tokens: []Token{{ID: good.ID, Actor: "ci", SHA256: strings.ToUpper(hashOf(10)), Created: now}}},
		"bad actor":     storeFile{Tokens: []Token{{ID: good.ID, Actor: "a b", SHA256: hashOf(1), Created: now}}},
		"no created":    storeFile{Tokens: []Token{{ID: good.ID, Actor: "ci", SHA256: hashOf(1)}}},
		"duplicate id":  storeFile{Tokens: []Token{good, {ID: good.ID, Actor: "ci", SHA256: hashOf(2), Created: now}}},
		"shared hash":   storeFile{Tokens: []Token{good, {ID: "tok_bbbbbbbbbbbbbbbb", Actor: "ci", SHA256: hashOf(1), Created: now}}},
	}
	for name, content := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			data, ok := content.(string)
			if !ok {
				b, _ := json.Marshal(content)
				data = string(b)
			}
			os.WriteFile(filepath.Join(dir, StoreFile), []byte(data), 0o600)
			if _, err := Open(dir); err == nil {
				t.Fatal("Open accepted a bad store")
			}
		})
	}
}

func readLog(t *testing.T, dir string) []Event {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}
