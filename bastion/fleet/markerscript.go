package fleet

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"

	gossh "golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/bastion/agentless"
	"github.com/postern-dev/postern/internal/capbuf"
)

// InstallMarkerScript installs the marker script (agentless.Script) as ~/.postern/run on
// host, over an SSH connection that checks host's pinned key, and returns the digest of the
// installed file, to be recorded with the host (Host.ScriptSHA256).
func InstallMarkerScript(ctx context.Context, host Host, signer gossh.Signer) (string, error) {
	pool, err := NewPool(PoolOptions{Signer: signer, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return "", err
	}
	defer pool.Close()
	conn, err := pool.Conn(ctx, host)
	if err != nil {
		return "", err
	}
	sess, err := conn.NewSession()
	if err != nil {
		return "", fmt.Errorf("bastion: install the marker script on %s: %w", host.Name, err)
	}
	defer sess.Close()
	var out, errb bytes.Buffer
	sess.Stdin = bytes.NewReader([]byte(agentless.Script))
	sess.Stdout, sess.Stderr = &capbuf.Buffer{B: &out}, &capbuf.Buffer{B: &errb}
	if err := sess.Run(agentless.InstallLine()); err != nil {
		return "", fmt.Errorf("bastion: install the marker script on %s: %w: %s", host.Name, err, bytes.TrimSpace(errb.Bytes()))
	}
	want := agentless.ScriptSHA256()
	if got := string(bytes.TrimSpace(out.Bytes())); got != want+"  -" {
		return "", fmt.Errorf("bastion: the marker script on %s has digest %q after install; want %s", host.Name, got, want)
	}
	return want, nil
}
