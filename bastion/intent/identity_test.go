package intent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"

	"github.com/postern-dev/postern/markers"
)

// TestRFC8785Vectors pins the canonicalizer to the RFC's reference vectors.
func TestRFC8785Vectors(t *testing.T) {
	ins, err := filepath.Glob(filepath.Join("testdata", "jcs", "*.in.json"))
	if err != nil || len(ins) == 0 {
		t.Fatalf("no vectors: %v", err)
	}
	for _, in := range ins {
		name := strings.TrimSuffix(filepath.Base(in), ".in.json")
		t.Run(name, func(t *testing.T) {
			input, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(strings.TrimSuffix(in, ".in.json") + ".out.json")
			if err != nil {
				t.Fatal(err)
			}
			got, err := jcs.Transform(input)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, bytes.TrimRight(want, "\n")) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

func testFingerprinter(t testing.TB) *Fingerprinter {
	t.Helper()
	f, err := LoadOrCreateFingerprintKey(filepath.Join(t.TempDir(), "fingerprint.key"))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func migration() ActionRecord {
	return ActionRecord{
		Actor: "token:deploy-bot", Tool: "ssh_exec", Channel: "ssh",
		Target:  SSHTarget("db-1", "ssh-ed25519", "SHA256:abc"),
		Account: "deploy", Command: []string{"sh", "-c", "migrate up 2026_07_22"}, Cwd: "/srv/app",
		Env: map[string]string{"RAILS_ENV": "production", "LANG": "C"}, IntentScope: "run:5f8097",
	}
}

func TestFingerprintIdentifiesTheIntent(t *testing.T) {
	f := testFingerprinter(t)
	base, err := f.Fingerprint(migration())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(base, FingerprintPrefix) || len(base) != len(FingerprintPrefix)+64 {
		t.Fatalf("fingerprint %q; want hmac-sha256:<64 hex>", base)
	}
	tests := []struct {
		name   string
		change func(*ActionRecord)
		same   bool
	}{
		{"env built in another order", func(a *ActionRecord) { a.Env = map[string]string{"LANG": "C", "RAILS_ENV": "production"} }, true},
		{"nil and empty arguments", func(a *ActionRecord) { a.Arguments = map[string]any{} }, true},
		{"another actor", func(a *ActionRecord) { a.Actor = "token:other" }, false},
		{"another run", func(a *ActionRecord) { a.IntentScope = "run:1" }, false},
		{"re-keyed host", func(a *ActionRecord) { a.Target = SSHTarget("db-1", "ssh-ed25519", "SHA256:new") }, false},
		{"another command", func(a *ActionRecord) { a.Command = []string{"sh", "-c", "migrate down"} }, false},
		{"argv split differently", func(a *ActionRecord) { a.Command = []string{"sh -c", "migrate up 2026_07_22"} }, false},
		{"another credential", func(a *ActionRecord) { a.CredentialRef = "vault:deploy" }, false},
		{"another cwd", func(a *ActionRecord) { a.Cwd = "/" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := migration()
			tt.change(&a)
			got, err := f.Fingerprint(a)
			if err != nil {
				t.Fatal(err)
			}
			if (got == base) != tt.same {
				t.Errorf("same fingerprint = %v; want %v", got == base, tt.same)
			}
		})
	}
	other := testFingerprinter(t)
	if fp, _ := other.Fingerprint(migration()); fp == base {
		t.Error("two installations produced the same fingerprint; the key must matter")
	}
}

func TestFingerprintKeyPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	a, err := LoadOrCreateFingerprintKey(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateFingerprintKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fa, _ := a.Fingerprint(migration())
	fb, _ := b.Fingerprint(migration())
	if fa != fb {
		t.Error("the reloaded key gives another fingerprint")
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v; want 0600", info.Mode().Perm())
	}
	os.WriteFile(path, []byte("short\n"), 0o600)
	if _, err := LoadOrCreateFingerprintKey(path); err == nil {
		t.Error("a malformed key was accepted")
	}
}

// FuzzCanonical: any record canonicalizes, and canonicalizing the result again is a no-op.
func FuzzCanonical(f *testing.F) {
	f.Add("token:a", "ssh_exec", "sh\x00-c", "/srv", "K", "v\u2028", "run:1")
	f.Fuzz(func(t *testing.T, actor, tool, cmd, cwd, k, v, scope string) {
		a := ActionRecord{Actor: actor, Tool: tool, Command: strings.Split(cmd, "\x00"), Cwd: cwd,
			Env: map[string]string{k: v}, Arguments: map[string]any{k: []any{v, 1.5, nil}}, IntentScope: scope}
		canon, err := a.Canonical()
		if err != nil {
			return // invalid UTF-8 cannot be canonical JSON
		}
		again, err := jcs.Transform(canon)
		if err != nil || !bytes.Equal(again, canon) {
			t.Fatalf("canonical form is not stable: %s -> %s (%v)", canon, again, err)
		}
	})
}

// TestSameRequestAcrossRunsAndActors: a keyed call is the same request as the execution that
// holds its key when only the run or the actor (of one principal) differs; any other field
// makes it another request.
func TestSameRequestAcrossRunsAndActors(t *testing.T) {
	f := testFingerprinter(t)
	made := migration()
	fp, err := f.Fingerprint(made)
	if err != nil {
		t.Fatal(err)
	}
	prior := &markers.Record{Actor: made.Actor, IntentScope: made.IntentScope, Fingerprint: fp}
	tests := []struct {
		name   string
		change func(*ActionRecord)
		same   bool
	}{
		{"the same call", func(*ActionRecord) {}, true},
		{"another run", func(a *ActionRecord) { a.IntentScope = "run:restarted" }, true},
		{"another actor of the principal", func(a *ActionRecord) { a.Actor = "local:alice" }, true},
		{"both", func(a *ActionRecord) { a.Actor, a.IntentScope = "local:alice", "run:77-1" }, true},
		{"another command", func(a *ActionRecord) { a.Command = []string{"sh", "-c", "migrate down"} }, false},
		{"another actor and command", func(a *ActionRecord) { a.Actor, a.Command = "local:alice", []string{"sh", "-c", "x"} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := migration()
			tt.change(&a)
			callFP, err := f.Fingerprint(a)
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.SameRequest(prior, a, callFP)
			if err != nil || got != tt.same {
				t.Errorf("SameRequest = %v, %v; want %v", got, err, tt.same)
			}
		})
	}
}
