package hostagent

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/postern-dev/postern/markers"
)

// TestIdentityOwns mirrors docs/design.md ("The hostagent"): an execution belongs to the identity that created it —
// account + key fingerprint, or certificate key id + principal.
func TestIdentityOwns(t *testing.T) {
	plain := Identity{Account: "deploy", Fingerprint: "SHA256:aaa"}
	cert := Identity{Account: "deploy", Fingerprint: "SHA256:aaa", KeyID: "bastion-1"}
	tests := []struct {
		name     string
		creator  Identity
		asker    Identity
		wantOwns bool
	}{
		{"the same key", plain, plain, true},
		{"another key of the account", plain, Identity{Account: "deploy", Fingerprint: "SHA256:bbb"}, false},
		{"the same key as another account", plain, Identity{Account: "root", Fingerprint: "SHA256:aaa"}, false},
		{"the same certificate", cert, cert, true},
		{"a renewed certificate: new key, same key id", cert, Identity{Account: "deploy", Fingerprint: "SHA256:new", KeyID: "bastion-1"}, true},
		{"another key id", cert, Identity{Account: "deploy", Fingerprint: "SHA256:ccc", KeyID: "bastion-2"}, false},
		{"the same key id for another principal", cert, Identity{Account: "root", Fingerprint: "SHA256:aaa", KeyID: "bastion-1"}, false},
		{"a plain key's execution, asked by a certificate on that key", plain, cert, true},
		{"a certificate's execution, asked by its key without the certificate", cert, plain, false},
		{"another key id on the same key", cert, Identity{Account: "deploy", Fingerprint: "SHA256:aaa", KeyID: "bastion-2"}, false},
		{"a certificate without key id is its key", Identity{Account: "deploy", Fingerprint: "SHA256:aaa", KeyID: ""}, plain, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &markers.Record{ID: "ex_x", Account: tt.creator.Account, Actor: tt.creator.Actor()}
			if got := tt.asker.ownsRecord(rec); got != tt.wantOwns {
				t.Errorf("%+v owns the execution of %+v = %v; want %v", tt.asker, tt.creator, got, tt.wantOwns)
			}
		})
	}
}

// FuzzNewIdentity: a certificate's key id comes from whoever holds a certificate. An accepted
// one makes an actor the marker store takes (bounded, no NUL, no control characters) and the
// identity owns its own executions; a refused one says why.
func FuzzNewIdentity(f *testing.F) {
	for _, seed := range []string{"", "bastion-1", "ops@example.com", "émile", "a\x00b", "line\nbreak", "\x7f",
		strings.Repeat("k", maxCertKeyIDBytes), strings.Repeat("k", maxCertKeyIDBytes+1), "\xff\xfe"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, keyID string) {
		id, err := newIdentity("deploy", authIdentity{Fingerprint: "SHA256:aaa", CertKeyID: keyID})
		if err != nil {
			if !errors.Is(err, ErrBadKeyID) {
				t.Fatalf("newIdentity(%q) = %v; want ErrBadKeyID", keyID, err)
			}
			return
		}
		actor := id.Actor()
		if len(actor) > 512 || strings.ContainsRune(actor, 0) || !utf8.ValidString(actor) {
			t.Fatalf("actor %q of key id %q is not storable", actor, keyID)
		}
		if !id.ownsRecord(&markers.Record{Account: "deploy", Actor: actor}) {
			t.Fatalf("identity with key id %q does not own its own execution", keyID)
		}
	})
}
