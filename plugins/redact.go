package plugins

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
)

// A target may send the credential back: an endpoint that echoes request headers puts it in
// its response, and an error message may quote it. A Redactor replaces every form in which
// the secret travels with a fixed marker, "[REDACTED:<credential ref>]", before a response or
// a message reaches the journal, a log or an agent.
//
// The forms: the secret itself; the header value it is sent as ("Bearer <secret>",
// "Basic <base64(user:secret)>"); for basic credentials "user:secret" and its base64 (padded
// and unpadded); the base64 of the secret; and each of those as a JSON string escapes it and
// as a URL escapes it. The longest form that matches at a position wins, so a whole header
// value becomes one marker.

// Redactor replaces a credential's secret in responses and messages. A nil *Redactor (no
// credential) changes nothing.
type Redactor struct {
	marker   string
	forms    []string // longest first
	replacer *strings.Replacer
}

// Redactor returns the redactor for c's secret; nil when c is nil or has no secret.
func (c *Credential) Redactor() *Redactor {
	if c == nil || c.Secret == "" {
		return nil
	}
	ref := c.Ref
	if ref == "" {
		ref = "credential"
	}
	base := []string{c.Secret, base64.StdEncoding.EncodeToString([]byte(c.Secret))}
	switch c.Kind {
	case CredentialBearer:
		base = append(base, "Bearer "+c.Secret)
	case CredentialBasic:
		pair := c.Username + ":" + c.Secret
		enc := base64.StdEncoding.EncodeToString([]byte(pair))
		base = append(base, pair, enc, base64.RawStdEncoding.EncodeToString([]byte(pair)), "Basic "+enc)
	}
	seen := map[string]bool{}
	var forms []string
	add := func(f string) {
		if f != "" && !seen[f] {
			seen[f] = true
			forms = append(forms, f)
		}
	}
	for _, v := range base {
		add(v)
		add(url.QueryEscape(v))
		add(url.PathEscape(v))
		add(jsonEscaped(v, true))
		add(jsonEscaped(v, false))
	}
	// Longest first: strings.Replacer tries the old strings in argument order at each position.
	slices.SortStableFunc(forms, func(a, b string) int { return len(b) - len(a) })
	r := &Redactor{marker: "[REDACTED:" + ref + "]", forms: forms}
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, r.marker)
	}
	r.replacer = strings.NewReplacer(pairs...)
	return r
}

// jsonEscaped is v as it appears inside a JSON string, with or without HTML escaping.
func jsonEscaped(v string, html bool) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(html)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	s := strings.TrimSuffix(buf.String(), "\n")
	return s[1 : len(s)-1]
}

// Marker is what replaces the secret ("" for a nil Redactor).
func (r *Redactor) Marker() string {
	if r == nil {
		return ""
	}
	return r.marker
}

// Lookahead is how many bytes past a cut a reader must see so that every form starting
// before the cut is whole: the longest form's length minus one.
func (r *Redactor) Lookahead() int {
	if r == nil {
		return 0
	}
	return len(r.forms[0]) - 1
}

// String returns s with every form of the secret replaced by the marker.
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	return r.replacer.Replace(s)
}

// Bytes returns b with every form of the secret replaced by the marker (b itself when nothing
// matched).
func (r *Redactor) Bytes(b []byte) []byte {
	if r == nil || len(b) == 0 {
		return b
	}
	out := r.replacer.Replace(string(b))
	if len(out) == len(b) && out == string(b) {
		return b
	}
	return []byte(out)
}

// TrimPartial drops the end of a cut-off text b if it could be the start of a form: a body
// truncated in the middle of the secret must not keep the secret's first characters. It
// removes the longest suffix of b that is a proper prefix of a form.
func (r *Redactor) TrimPartial(b []byte) []byte {
	if r == nil {
		return b
	}
	cut := len(b)
	for _, f := range r.forms {
		from := max(0, len(b)-(len(f)-1))
		for i := from; i < cut; i++ {
			if b[i] == f[0] && string(b[i:]) == f[:len(b)-i] {
				cut = i
				break
			}
		}
	}
	return b[:cut]
}

// Header returns a copy of h with the secret redacted from every value.
func (r *Redactor) Header(h map[string][]string) map[string][]string {
	if r == nil || h == nil {
		return h
	}
	out := make(map[string][]string, len(h))
	for name, values := range h {
		vs := make([]string, len(values))
		for i, v := range values {
			vs[i] = r.String(v)
		}
		out[name] = vs
	}
	return out
}

// Response returns resp with the secret redacted from its header values and body; a
// truncated body also loses a trailing start of the secret (TrimPartial).
func (r *Redactor) Response(resp HTTPResponse) HTTPResponse {
	if r == nil {
		return resp
	}
	resp.Header = r.Header(resp.Header)
	resp.Body = r.Bytes(resp.Body)
	if resp.BodyTruncated {
		resp.Body = r.TrimPartial(resp.Body)
	}
	return resp
}
