// Package notify announces approval requests to operators: each one is POSTed as JSON to a
// webhook, so an operator hears of it and decides through a channel the agent cannot reach
// (docs/policy.md, "Who approves").
//
// Announcing never holds up a call: requests are queued (bounded: when the queue is full a
// request is dropped, logged and counted — it still waits in `postern approvals list`) and
// sent by one goroutine the Notifier owns, with a few retries. A signing secret is read from
// its file at each send (a reference, never kept in the config) and never logged.
package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/postern-dev/postern/bastion/api"
	"github.com/postern-dev/postern/internal/ctxtime"
)

// Bounds on announcing.
const (
	queueLen     = 256
	attempts     = 3
	firstBackoff = time.Second
	sendTimeout  = 10 * time.Second
	// maxSecretBytes bounds the signing secret's file.
	maxSecretBytes = 4096
)

// SignatureHeader carries "sha256=" and the hex HMAC-SHA256 of the body under the secret.
const SignatureHeader = "Postern-Signature"

// Options configure a Notifier.
type Options struct {
	// URL is the webhook (http or https).
	URL string
	// SecretFile, when set, holds the secret each body is signed with.
	SecretFile string
	// Client sends the requests. Default: an http.Client with sendTimeout.
	Client *http.Client
	Logger *slog.Logger
	// Result, when set, is told how each request ended: "sent", "failed" or "dropped".
	Result func(result string)
}

// Notifier sends approval requests to a webhook.
type Notifier struct {
	opts   Options
	queue  chan *api.ApprovalRequest
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New starts a Notifier; Close stops it.
func New(opts Options) *Notifier {
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: sendTimeout}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Result == nil {
		opts.Result = func(string) {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Notifier{opts: opts, queue: make(chan *api.ApprovalRequest, queueLen), ctx: ctx, cancel: cancel}
	n.wg.Go(n.run)
	return n
}

// Announce queues req; it never blocks.
func (n *Notifier) Announce(req *api.ApprovalRequest) {
	select {
	case n.queue <- req:
	default:
		n.opts.Logger.Warn("approval request not announced: the webhook queue is full", "execution_id", req.ExecutionID)
		n.opts.Result("dropped")
	}
}

// Close stops sending (what is still queued is not sent) and waits for the sender.
func (n *Notifier) Close() {
	n.cancel()
	n.wg.Wait()
}

func (n *Notifier) run() {
	for {
		select {
		case <-n.ctx.Done():
			return
		case req := <-n.queue:
			n.deliver(req)
		}
	}
}

// deliver sends req, retrying a failed send with a growing pause.
func (n *Notifier) deliver(req *api.ApprovalRequest) {
	wait := firstBackoff
	var err error
	for i := 0; i < attempts; i++ {
		if i > 0 && !ctxtime.Sleep(n.ctx, wait) {
			return
		}
		if err = n.send(req); err == nil {
			n.opts.Result("sent")
			return
		}
		wait *= 2
	}
	n.opts.Logger.Warn("approval request not announced", "execution_id", req.ExecutionID, "err", err)
	n.opts.Result("failed")
}

// send POSTs req once; a status other than 2xx is an error.
func (n *Notifier) send(req *api.ApprovalRequest) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(n.ctx, sendTimeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, n.opts.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	if n.opts.SecretFile != "" {
		secret, err := readSecret(n.opts.SecretFile)
		if err != nil {
			return err
		}
		mac := hmac.New(sha256.New, secret)
		mac.Write(body)
		hr.Header.Set(SignatureHeader, "sha256="+hex.EncodeToString(mac.Sum(nil)))
	}
	resp, err := n.opts.Client.Do(hr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook answered %s", resp.Status)
	}
	return nil
}

// readSecret reads the signing secret (trailing newline dropped).
func readSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("webhook secret: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("webhook secret %s: %w", path, err)
	case len(b) > maxSecretBytes:
		return nil, fmt.Errorf("webhook secret %s: longer than %d bytes", path, maxSecretBytes)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return nil, fmt.Errorf("webhook secret %s is empty", path)
	}
	return []byte(s), nil
}
