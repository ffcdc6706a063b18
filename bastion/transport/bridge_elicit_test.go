package transport

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
)

func TestLearnElicitation(t *testing.T) {
	for params, want := range map[string]bool{
		`{"capabilities":{}}`:                                   false,
		`{"capabilities":{"elicitation":{}}}`:                   true, // before modes: form
		`{"capabilities":{"elicitation":{"form":{}}}}`:          true,
		`{"capabilities":{"elicitation":{"url":{}}}}`:           false,
		`{"capabilities":{"elicitation":{"form":{},"url":{}}}}`: true,
		`not json`: false,
	} {
		b := &bridge{}
		b.learnElicitation(json.RawMessage(params))
		if b.elicitation != want {
			t.Errorf("learnElicitation(%s) = %v, want %v", params, b.elicitation, want)
		}
	}
}

func TestTakeOffer(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":3,"result":{"content":[],"_meta":{"dev.postern/approval-offer":{"execution_id":"ex_1","message":"m"},"other":1}}}`
	offer, out, ok := takeOffer([]byte(msg))
	if !ok || offer.ExecutionID != "ex_1" || offer.Message != "m" {
		t.Fatalf("takeOffer = %+v, %v", offer, ok)
	}
	var got struct {
		Result struct {
			Meta map[string]any `json:"_meta"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &got); err != nil || got.Result.Meta[MetaApprovalOffer] != nil || got.Result.Meta["other"] == nil {
		t.Fatalf("the relayed result %s still has the offer, or lost other _meta (%v)", out, err)
	}
	for _, plain := range []string{`{"jsonrpc":"2.0","id":3,"result":{"content":[]}}`, `{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"x"}}`, `[]`} {
		if _, _, ok := takeOffer([]byte(plain)); ok {
			t.Errorf("takeOffer(%s) found an offer", plain)
		}
	}
}

// TestBridgeKeepsTheApprovalMethodToItself: MethodApproval carries the decision of the
// client's user, which only the bridge's own elicitation obtains. A client that sends it
// itself (after its user declined, or without ever asking) is refused and the daemon never
// hears it: otherwise the agent could approve its own execution.
func TestBridgeKeepsTheApprovalMethodToItself(t *testing.T) {
	ts := newTestServer(t, nil)
	var mu sync.Mutex
	var heard []string
	inner := ts.handler
	ts.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(MethodApproval)) {
			mu.Lock()
			heard = append(heard, string(body))
			mu.Unlock()
		}
		inner.ServeHTTP(w, r)
	})
	sock := serveUnix(t, ts)
	b := startBridge(t, t.Context(), sock)
	r := newRawLines(t, b)
	r.send(`{"jsonrpc":"2.0","id":1,"method":"` + MethodApproval + `","params":{"execution_id":"ex_01JDQ0000000000000000000AB","decision":"approve"}}`)
	if msg := r.next(); msg["id"] != float64(1) || errorCode(msg) != codeMethodNotFound {
		t.Errorf("reply = %v; want error %d for id 1", msg, codeMethodNotFound)
	}
	r.send(`{"jsonrpc":"2.0","method":"` + MethodApproval + `","params":{"execution_id":"ex_01JDQ0000000000000000000AB","decision":"approve"}}`)
	r.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	if msg := r.next(); msg["id"] != float64(2) {
		t.Fatalf("answer = %v; want the result of call 2", msg)
	}
	b.stdin.Close()
	if err := <-b.errc; err != nil {
		t.Errorf("Bridge at EOF = %v; want nil", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(heard) != 0 {
		t.Errorf("the daemon heard %q from the client; want nothing", heard)
	}
}
