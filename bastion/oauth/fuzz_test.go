package oauth

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// FuzzVerify feeds arbitrary bearer tokens to a verifier with a real key set: whatever the
// bytes, it returns an error of its kinds (never panics, never accepts a token it did not
// sign), and seeds from real tokens reach the claim checks.
func FuzzVerify(f *testing.F) {
	iss := newFakeIssuer(f, "")
	key := rsaKey(f)
	iss.addKey(f, "k1", key)
	clk := &clock{now: time.Now()}
	v, err := New(Options{Issuer: iss.issuer, Resource: testResource, Now: clk.Now,
		Rules: Rules{Actors: []Rule{{Actor: "ops", Groups: []string{"sre"}}}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sign(f, jose.RS256, "k1", key, claimsAt(iss, clk.Now(), nil)))
	f.Add(sign(f, jose.RS256, "k1", key, claimsAt(iss, clk.Now(), map[string]any{"groups": "sre", "scope": 7})))
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("..")
	f.Fuzz(func(t *testing.T, token string) {
		_, m, err := v.Verify(t.Context(), token)
		if err == nil {
			if m.Actor != "ops" {
				t.Fatalf("accepted with mapping %+v", m)
			}
			return
		}
		if !errors.Is(err, ErrInvalidToken) && !errors.Is(err, ErrNoActor) && !errors.Is(err, ErrUnavailable) {
			t.Fatalf("error of no kind: %v", err)
		}
	})
}

// FuzzClaims reads arbitrary JSON as the claims of a token: lists, strings and nested
// groups claims never panic, and what they yield has no empty entry.
func FuzzClaims(f *testing.F) {
	f.Add([]byte(`{"scope":"a b  c","groups":["x",""],"realm_access":{"roles":["r"]}}`))
	f.Add([]byte(`{"scp":["a"],"groups":"g"}`))
	f.Add([]byte(`{"realm_access":"x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var claims map[string]json.RawMessage
		if json.Unmarshal(data, &claims) != nil {
			return
		}
		for _, path := range [][]string{{"groups"}, {"realm_access", "roles"}} {
			for _, s := range listClaim(nested(claims, path), false) {
				if s == "" {
					t.Fatal("empty group")
				}
			}
		}
		for _, s := range listClaim(claims["scope"], true) {
			if s == "" {
				t.Fatal("empty scope")
			}
		}
		stringClaim(claims["client_id"])
	})
}
