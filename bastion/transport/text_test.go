package transport

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/postern-dev/postern/internal/ratelog"
)

func TestFindBadText(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		wantAt     int // -1: none
		wantWhat   string
		wantPath   string
	}{
		{name: "plain", body: `{"a":"héllo \u00e9 \ud83d\ude00 😀"}`, wantAt: -1},
		{name: "escaped backslash then u", body: `{"a":"\\ud800"}`, wantAt: -1},
		{name: "invalid byte in a value", body: "{\"params\":{\"arguments\":{\"command\":\"echo \xff\"}}}", wantAt: 40, wantWhat: "invalid UTF-8 (byte 0xff)", wantPath: "params.arguments.command"},
		{name: "encoded surrogate", body: "{\"a\":\"\xed\xa0\x80\"}", wantAt: 6, wantWhat: "invalid UTF-8 (byte 0xed)", wantPath: "a"},
		{name: "lone high surrogate", body: `{"params":{"arguments":{"env":{"LANG":"C\ud800"}}}}`, wantAt: 40, wantWhat: `an unpaired surrogate escape \ud800`, wantPath: "params.arguments.env.LANG"},
		{name: "high then not low", body: `{"a":["x","\uD800\u0041"]}`, wantAt: 11, wantWhat: `an unpaired surrogate escape \ud800`, wantPath: "a[1]"},
		{name: "lone low surrogate", body: `{"a":"\udc00"}`, wantAt: 6, wantWhat: `an unpaired surrogate escape \udc00`, wantPath: "a"},
		{name: "in a key", body: `{"params":{"ar\udfffg":1}}`, wantAt: 14, wantWhat: `an unpaired surrogate escape \udfff`, wantPath: "the name of params.ar\uFFFDg"},
		{name: "high at the end", body: `{"a":"\ud800`, wantAt: 6, wantWhat: `an unpaired surrogate escape \ud800`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := findBadText([]byte(tc.body))
			if tc.wantAt < 0 {
				if bad != nil {
					t.Fatalf("findBadText = %+v; want none", bad)
				}
				return
			}
			if bad == nil || bad.offset != tc.wantAt || bad.what != tc.wantWhat {
				t.Fatalf("findBadText = %+v; want %q at %d", bad, tc.wantWhat, tc.wantAt)
			}
			if tc.wantPath != "" {
				if got := jsonPathAt([]byte(tc.body), bad.offset); got != tc.wantPath {
					t.Errorf("jsonPathAt = %q; want %q", got, tc.wantPath)
				}
			}
		})
	}
}

// TestBadTextIsRefusedBeforeTheHandler: the handler never sees the body; the caller gets a
// JSON-RPC error for its id that says where and what.
func TestBadTextIsRefusedBeforeTheHandler(t *testing.T) {
	reached := false
	h := limitBody(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached = true }), bodyLimits{}, ratelog.New(nil, ratelog.Options{}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		body       string
		wantStatus int
		wantID     string
	}{
		{body: `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ssh_exec","arguments":{"command":"rm -rf /tmp/\ud800"}}}`, wantStatus: 200, wantID: "7"},
		{body: "{\"jsonrpc\":\"2.0\",\"id\":\"a\xff\",\"method\":\"x\"}", wantStatus: 400, wantID: "null"},
		{body: "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\",\"params\":{\"p\":\"\xc3\"}}", wantStatus: 400, wantID: "null"},
	} {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var reply struct {
			ID    json.RawMessage `json:"id"`
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &reply); err != nil || resp.StatusCode != tc.wantStatus || string(reply.ID) != tc.wantID ||
			reply.Error.Code != CodeInvalidParams || !strings.HasPrefix(reply.Error.Message, "invalid_argument: ") {
			t.Errorf("%q: %s %s; want %d, id %s, -32602 invalid_argument", tc.body, resp.Status, data, tc.wantStatus, tc.wantID)
		}
		t.Logf("%s", reply.Error.Message)
	}
	if reached {
		t.Error("the handler saw a body that is not valid text")
	}
}

// FuzzFindBadText: never panics; what it passes is UTF-8, and UTF-8 without \u escapes
// always passes; the path of what it finds is found without a panic.
func FuzzFindBadText(f *testing.F) {
	for _, s := range []string{`{"a":"\ud800"}`, "{\"a\":\"\xff\"}", `{"a":["\ud83d\ude00",{"b\udc00":1}]}`, `"\\u`, `{"a":"\u12`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		bad := findBadText(body)
		if bad == nil && !utf8.Valid(body) {
			t.Fatalf("%q passed, but it is not UTF-8", body)
		}
		if bad != nil && utf8.Valid(body) && !strings.Contains(string(body), `\u`) {
			t.Fatalf("%q refused (%+v), but it is UTF-8 without escapes", body, bad)
		}
		if bad != nil {
			jsonPathAt(body, bad.offset)
		}
	})
}
