package oauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// BenchmarkVerify is the cost a request pays for its OAuth token, the keys cached: a token
// seen before (remembered: hash, expiry, key still published, mapping) and one checked in
// full (parse, signature, claims). Compare transport's BenchmarkStaticToken, what a Postern
// token costs.
func BenchmarkVerify(b *testing.B) {
	f := newFakeIssuer(b, "")
	rsaK := rsaKey(b)
	ecK, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	f.addKey(b, "rs", rsaK)
	f.addKey(b, "ec", ecK)
	clk := &clock{now: time.Now()}
	v, err := New(Options{Issuer: f.issuer, Resource: testResource, Now: clk.Now,
		Rules: Rules{Actors: []Rule{{Actor: "ops", Groups: []string{"sre"}}}}})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		alg  jose.SignatureAlgorithm
		kid  string
		key  any
	}{{"RS256", jose.RS256, "rs", rsaK}, {"ES256", jose.ES256, "ec", ecK}} {
		tok := sign(b, tc.alg, tc.kid, tc.key, claimsAt(f, clk.Now(), nil))
		if _, _, err := v.Verify(b.Context(), tok); err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name+"/remembered", func(b *testing.B) {
			for b.Loop() {
				if _, _, err := v.Verify(b.Context(), tok); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/checked", func(b *testing.B) {
			for b.Loop() {
				if _, _, _, err := v.validate(b.Context(), tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
