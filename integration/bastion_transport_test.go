package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/postern-dev/postern/bastion"
	"github.com/postern-dev/postern/internal/testutil/harness"
)

// TestProgressWhileWaiting: a client that sends a progress token hears about a long command
// while its call waits.
func TestProgressWhileWaiting(t *testing.T) {
	f := startFleet(t)
	ctx := testContext(t)
	var notes atomic.Int32
	cs := harness.ConnectMCP(t, f.bastion.URL, f.bastion.HTTPClient("agent", nil, nil), &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if req.Params.ProgressToken == "p-1" {
				notes.Add(1)
			}
		},
	})
	params := &mcp.CallToolParams{Name: "ssh_exec", Arguments: map[string]any{
		"host": "h1", "command": "for i in 1 2 3; do echo $i; sleep 1; done", "wait_s": 30}}
	params.SetProgressToken("p-1")
	res, err := cs.CallTool(ctx, params)
	if err != nil || res.IsError {
		t.Fatalf("call = %v, %v", res, err)
	}
	if notes.Load() == 0 {
		t.Fatal("no progress notification while the command ran for 3s")
	}
}

// TestHTTPSWhenConfigured: with tls_cert_file and tls_key_file the endpoint is HTTPS only.
func TestHTTPSWhenConfigured(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSignedCert(t, dir)
	f := newFleet(t, fleetOptions{settings: []string{
		"tls_cert_file = \"" + certFile + "\"", "tls_key_file = \"" + keyFile + "\""}})
	ctx := testContext(t)

	plain := &http.Client{Timeout: 5 * time.Second}
	if resp, err := plain.Get(f.bastion.URL); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("plain HTTP answered %s; want no service", resp.Status)
		}
	}
	rt := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	url := "https://" + f.bastion.Addr + bastion.MCPPath
	cs := harness.ConnectMCP(t, url, f.bastion.HTTPClient("agent", nil, rt), nil)
	x := mustCall(t, ctx, cs, "ssh_exec", map[string]any{"host": "h1", "command": "echo secure"})
	if x.State != "completed" || x.Stdout != "secure\n" {
		t.Fatalf("over HTTPS: %+v", x)
	}
}

// selfSignedCert writes a certificate for 127.0.0.1 and its key, and returns a pool that
// trusts it.
func selfSignedCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "postern-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}
