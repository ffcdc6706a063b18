package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/bastion/config"
)

// TestCACommands: postern ca makes, shows, rotates, activates and retires the CA in the
// state dir, and doctor reports each stage (no CA, signing, a pending key, a key to retire).
func TestCACommands(t *testing.T) {
	dir := t.TempDir()
	cfg := config.DefaultConfig(dir)
	cfg.SSHCA.Enabled = true
	ca := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if err := run(context.Background(), append(append([]string{"ca"}, args...), "--state-dir", dir), strings.NewReader(""), &out, &errb); err != nil {
			t.Fatalf("postern ca %v: %v\n%s", args, err, errb.String())
		}
		return out.String()
	}
	status := func(now time.Time) string {
		var b strings.Builder
		for _, c := range sshCAChecks(cfg, now) {
			b.WriteString(c.Status + ": " + c.Detail + "\n")
		}
		return b.String()
	}
	if got := status(time.Now()); !strings.HasPrefix(got, "problem: sshca: no SSH CA yet") {
		t.Fatalf("doctor without a CA:\n%s", got)
	}
	ca("init")
	if got := ca("keys"); strings.Count(got, "\n") != 1 || !strings.Contains(got, "postern-ssh-ca-1") {
		t.Fatalf("ca keys:\n%s", got)
	}
	if got := status(time.Now()); !strings.HasPrefix(got, "ok: generation 1") {
		t.Fatalf("doctor with a CA:\n%s", got)
	}
	ca("rotate", "--overlap", "1h")
	if got := status(time.Now()); !strings.Contains(got, "note: generation 2 signs from") {
		t.Fatalf("doctor during a rotation:\n%s", got)
	}
	if got := ca("status"); !strings.Contains(got, "signing") || !strings.Contains(got, "pending") {
		t.Fatalf("ca status during a rotation:\n%s", got)
	}
	ca("activate")
	if got := status(time.Now().Add(2 * time.Hour)); !strings.Contains(got, "ok: generation 2") || !strings.Contains(got, "generation 1 no longer signs") {
		t.Fatalf("doctor after the new key has signed a lifetime:\n%s", got)
	}
	ca("retire", "--force")
	if got := ca("keys"); strings.Count(got, "\n") != 1 || !strings.Contains(got, "postern-ssh-ca-2") {
		t.Fatalf("ca keys after retiring:\n%s", got)
	}
	cfg.SSHCA.Enabled = false
	if got := sshCAChecks(cfg, time.Now()); got != nil {
		t.Fatalf("doctor with [ssh_ca] off: %+v", got)
	}
}
