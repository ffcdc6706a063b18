package plugins_test

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/postern-dev/postern/plugins"
)

// betrayals are the encodings of secret (sent as cred) that must never survive redaction.
func betrayals(cred plugins.Credential) []string {
	s := cred.Secret
	forms := []string{s, base64.StdEncoding.EncodeToString([]byte(s)), url.QueryEscape(s)}
	if j, _ := json.Marshal(s); len(j) > 2 {
		forms = append(forms, string(j[1:len(j)-1]))
	}
	if cred.Kind == plugins.CredentialBasic {
		pair := cred.Username + ":" + s
		forms = append(forms, base64.StdEncoding.EncodeToString([]byte(pair)), base64.RawStdEncoding.EncodeToString([]byte(pair)))
	}
	return forms
}

func TestRedactorForms(t *testing.T) {
	bearer := plugins.Credential{Ref: "api", Kind: plugins.CredentialBearer, Secret: "tok-3f9a<&>\"q/+"}
	basic := plugins.Credential{Ref: "db", Kind: plugins.CredentialBasic, Username: "bot", Secret: "pa55:w0rd"}
	header := plugins.Credential{Kind: plugins.CredentialHeader, Header: "X-Api-Key", Secret: "key-77"}
	basicB64 := base64.StdEncoding.EncodeToString([]byte("bot:pa55:w0rd"))
	jsonOf := func(v string) string { b, _ := json.Marshal(map[string]string{"authorization": v}); return string(b) }
	tests := []struct {
		name string
		cred plugins.Credential
		in   string
		want string
	}{
		{name: "raw", cred: bearer, in: "got tok-3f9a<&>\"q/+ back", want: "got [REDACTED:api] back"},
		{name: "bearer header value is one marker", cred: bearer, in: "Authorization: Bearer tok-3f9a<&>\"q/+\n", want: "Authorization: [REDACTED:api]\n"},
		{name: "json escaped (HTML-safe)", cred: bearer, in: jsonOf("Bearer tok-3f9a<&>\"q/+"), want: `{"authorization":"[REDACTED:api]"}`},
		{name: "url escaped", cred: bearer, in: "next=" + url.QueryEscape("tok-3f9a<&>\"q/+"), want: "next=[REDACTED:api]"},
		{name: "base64 of the secret", cred: bearer, in: "b=" + base64.StdEncoding.EncodeToString([]byte("tok-3f9a<&>\"q/+")), want: "b=[REDACTED:api]"},
		{name: "whole basic value", cred: basic, in: "Authorization: Basic " + basicB64, want: "Authorization: [REDACTED:db]"},
		{name: "basic base64 alone", cred: basic, in: "[" + basicB64 + "]", want: "[[REDACTED:db]]"},
		{name: "basic unpadded", cred: basic, in: "u=" + strings.TrimRight(basicB64, "=") + ";", want: "u=[REDACTED:db];"},
		{name: "basic decoded pair", cred: basic, in: "user bot:pa55:w0rd", want: "user [REDACTED:db]"},
		{name: "basic password alone", cred: basic, in: "pw=pa55:w0rd", want: "pw=[REDACTED:db]"},
		{name: "no ref", cred: header, in: "key-77 key-77", want: "[REDACTED:credential] [REDACTED:credential]"},
		{name: "nothing to redact", cred: header, in: "key-7 ke y-77", want: "key-7 ke y-77"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.cred.Redactor()
			if got := r.String(tt.in); got != tt.want {
				t.Errorf("String(%q) = %q; want %q", tt.in, got, tt.want)
			}
			if got := string(r.Bytes([]byte(tt.in))); got != tt.want {
				t.Errorf("Bytes(%q) = %q; want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestRedactorNil(t *testing.T) {
	var none *plugins.Credential
	r := none.Redactor()
	if r.String("x") != "x" || string(r.Bytes([]byte("x"))) != "x" || r.Lookahead() != 0 || string(r.TrimPartial([]byte("x"))) != "x" {
		t.Fatal("a nil Redactor must change nothing")
	}
	if (&plugins.Credential{Kind: plugins.CredentialBearer}).Redactor() != nil {
		t.Fatal("a credential without a secret has no Redactor")
	}
}

func TestRedactorTrimPartial(t *testing.T) {
	r := (&plugins.Credential{Ref: "api", Kind: plugins.CredentialBearer, Secret: "s3cr3t"}).Redactor()
	tests := []struct{ in, want string }{
		{"body s3cr", "body "},
		{"body Bearer s3", "body "},
		{"body Bear", "body "},
		{"body s", "body "},
		{"body s3cr3t", "body s3cr3t"}, // whole forms are Bytes' job; TrimPartial only cuts a start
		{"body x", "body x"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := string(r.TrimPartial([]byte(tt.in))); got != tt.want {
			t.Errorf("TrimPartial(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestRedactorResponse(t *testing.T) {
	cred := plugins.Credential{Ref: "api", Kind: plugins.CredentialBearer, Secret: "s3cr3t-value"}
	r := cred.Redactor()
	in := plugins.HTTPResponse{
		Status: 200,
		Header: map[string][]string{"Echo-Authorization": {"Bearer s3cr3t-value"}, "Content-Type": {"text/plain"}},
		Body:   []byte("a s3cr3t-value b s3cr3t-va"), BodyBytes: 40, BodyTruncated: true,
	}
	got := r.Response(in)
	if v := got.Header["Echo-Authorization"][0]; v != "[REDACTED:api]" {
		t.Errorf("header = %q; want the marker", v)
	}
	if string(got.Body) != "a [REDACTED:api] b " {
		t.Errorf("body = %q; want the whole secret replaced and the cut-off start dropped", got.Body)
	}
	if in.Header["Echo-Authorization"][0] != "Bearer s3cr3t-value" {
		t.Error("Response changed its argument's header map")
	}
}

// FuzzRedactor: whatever surrounds the secret, and wherever a body is cut, no encoding of the
// secret survives.
func FuzzRedactor(f *testing.F) {
	f.Add("s3cr3t", "bot", "pre ", " post", 7, uint8(0))
	f.Add("a", "u", "aaaa", "", 2, uint8(1))
	f.Add("ab<>\"", "x", "{\"k\":\"", "\"}", 3, uint8(2))
	f.Add("x:y", "u", "Basic ", "\n", 10, uint8(1))
	f.Fuzz(func(t *testing.T, secret, user, prefix, suffix string, cut int, kind uint8) {
		if secret == "" || strings.ContainsAny(secret+user, "\x00\r\n") || len(secret) > 256 || len(user) > 64 {
			return
		}
		cred := plugins.Credential{Ref: "fz", Secret: secret, Username: user}
		switch kind % 3 {
		case 0:
			cred.Kind = plugins.CredentialBearer
		case 1:
			cred.Kind = plugins.CredentialBasic
		default:
			cred.Kind, cred.Header = plugins.CredentialHeader, "X-K"
		}
		r := cred.Redactor()
		forms := betrayals(cred)
		for _, form := range forms {
			text := prefix + form + suffix
			out := r.String(text)
			if strings.Contains(out, secret) && !strings.Contains(r.Marker(), secret) && !strings.Contains(prefix+suffix, secret) {
				t.Fatalf("String(%q) = %q still holds the secret", text, out)
			}
			// A body cut anywhere inside a form keeps no start of it: when nothing before the
			// cut was redacted, what is left ends within the prefix.
			if c := min(cut, len(text)); cut > 0 && c > len(prefix) && c < len(prefix)+len(form) &&
				r.String(text[:c]) == text[:c] {
				if body := r.TrimPartial([]byte(text[:c])); len(body) > len(prefix) {
					t.Fatalf("cut %q at %d: %q keeps the start of %q", text, c, body, form)
				}
			}
		}
	})
}
