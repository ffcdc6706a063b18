package transport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/postern-dev/postern/internal/ratelog"
)

// A request's body must be valid text before go-sdk decodes it: encoding/json replaces
// invalid UTF-8 and unpaired surrogate escapes (\ud800) with U+FFFD without an error, so a
// command or an env value holding one would be rewritten, journaled and run as something
// the caller did not send. Such a body is refused whole, for every method, tool and field,
// with a JSON-RPC error that names where the bad text is; nothing reaches the MCP handler.

// CodeInvalidParams is the JSON-RPC error code of a refused body (Invalid params); its
// message starts with "invalid_argument:", the code the tools use for arguments.
const CodeInvalidParams = -32602

// maxTextPathBytes bounds the field path named in the error.
const maxTextPathBytes = 256

// badText is the first invalid text in a JSON body: where (a byte offset) and what.
type badText struct {
	offset int
	what   string
}

// findBadText returns the first byte sequence of body that is not UTF-8, or the first
// \u escape of a surrogate that is not half of a pair, or nil. It scans JSON strings'
// escapes only; malformed JSON is left to the decoder.
func findBadText(body []byte) *badText {
	inString := false
	for i := 0; i < len(body); {
		c := body[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(body[i:])
			if r == utf8.RuneError && size <= 1 {
				return &badText{offset: i, what: fmt.Sprintf("invalid UTF-8 (byte 0x%02x)", c)}
			}
			i += size
			continue
		}
		switch {
		case !inString:
			inString = c == '"'
			i++
		case c == '"':
			inString = false
			i++
		case c != '\\':
			i++
		case i+1 < len(body) && body[i+1] == 'u':
			u, ok := hex4(body[i+2:])
			switch {
			case !ok:
				i += 2
			case u >= 0xd800 && u <= 0xdbff:
				if i+12 <= len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
					if lo, ok := hex4(body[i+8:]); ok && lo >= 0xdc00 && lo <= 0xdfff {
						i += 12
						continue
					}
				}
				return &badText{offset: i, what: fmt.Sprintf(`an unpaired surrogate escape \u%04x`, u)}
			case u >= 0xdc00 && u <= 0xdfff:
				return &badText{offset: i, what: fmt.Sprintf(`an unpaired surrogate escape \u%04x`, u)}
			default:
				i += 6
			}
		case i+1 < len(body) && body[i+1] < utf8.RuneSelf:
			i += 2 // \" \\ \/ \b \f \n \r \t (or malformed, for the decoder to refuse)
		default:
			i++ // the byte after the backslash is checked as any other
		}
	}
	return nil
}

// hex4 reads four hex digits.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(n), err == nil
}

// jsonPathAt names the member of body that holds offset ("params.arguments.env.LANG", or
// "the name of params.arguments.x" for a key), "" if body is not JSON that far.
func jsonPathAt(body []byte, offset int) string {
	type frame struct {
		object  bool
		wantKey bool
		key     string
		index   int
	}
	var stack []*frame
	path := func() string {
		var b strings.Builder
		for _, f := range stack {
			if f.object {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(strings.ToValidUTF8(f.key, "\uFFFD"))
			} else {
				fmt.Fprintf(&b, "[%d]", f.index)
			}
		}
		return b.String()
	}
	valueDone := func() {
		if len(stack) == 0 {
			return
		}
		if f := stack[len(stack)-1]; f.object {
			f.wantKey = true
		} else {
			f.index++
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		end := int(dec.InputOffset())
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				stack = append(stack, &frame{object: true, wantKey: true})
			case '[':
				stack = append(stack, &frame{})
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			f := stack[n-1]
			f.key, f.wantKey = fmt.Sprint(tok), false
			if offset < end {
				return "the name of " + path()
			}
			continue
		}
		if offset < end {
			return path()
		}
		valueDone()
	}
}

// refuseBadText answers a body holding invalid text with a JSON-RPC error for the request's
// id (200; a message without an id, 400) and reports true; false if the body is fine.
func refuseBadText(w http.ResponseWriter, r *http.Request, body []byte, refusals *ratelog.Logger) bool {
	bad := findBadText(body)
	if bad == nil {
		return false
	}
	where := jsonPathAt(body, bad.offset)
	if len(where) > maxTextPathBytes {
		where = strings.ToValidUTF8(where[:maxTextPathBytes], "") + "…"
	}
	if where == "" {
		where = "the request"
	}
	msg := fmt.Sprintf("invalid_argument: %s holds %s at byte %d; strings must be valid UTF-8 text (nothing was done)", where, bad.what, bad.offset)
	var envelope struct {
		ID json.RawMessage `json:"id"`
	}
	id := json.RawMessage("null")
	if json.Unmarshal(body, &envelope) == nil && len(envelope.ID) > 0 && findBadText(envelope.ID) == nil && utf8.Valid(envelope.ID) {
		id = envelope.ID
	}
	refusals.Log(slog.LevelInfo, ReasonInvalidText, "refused request", "remote", r.RemoteAddr, "detail", msg)
	reply, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": CodeInvalidParams, "message": msg},
	})
	w.Header().Set("Content-Type", "application/json")
	status := http.StatusOK
	if string(id) == "null" {
		status = http.StatusBadRequest
	}
	w.WriteHeader(status)
	w.Write(reply)
	return true
}
