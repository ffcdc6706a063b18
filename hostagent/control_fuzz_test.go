package hostagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/postern-dev/postern/hostproto"
)

func FuzzDecodeControlRequest(f *testing.F) {
	const id = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW"
	for _, seed := range []string{
		`{"op":"status","ids":["` + id + `"]}`,
		`{"op":"list","state":"running","since":"2026-01-02T03:04:05+02:00","until":"2027-01-01T00:00:00Z","operation_key":"m:1","newest":true,"limit":5,"cursor":"ab"}`,
		`{"op":"attach","id":"` + id + `","stdout_offset":7,"stderr_offset":3}`,
		`{"op":"cancel","id":"` + id + `"}`,
		`{"op":"export"}`,
		`{"op":"checkpoint","id":"` + id + `","note":"schema applied ✓"}`,
		`{"op":"validated","id":"` + id + `"}`,
		`{"op":"reload"}`,
		`{"op":"list","Limit":1}`,
		`{"op":"status","ids":null}`,
		`null`, `[]`, `{}`, `{"op":"export"}{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := DecodeControlRequest(line)
		if err != nil {
			if !errors.Is(err, hostproto.ErrBadControlRequest) {
				t.Fatalf("error %v does not wrap hostproto.ErrBadControlRequest", err)
			}
			return
		}
		if len(req.Note) > hostproto.MaxCheckpointNote || len(req.IDs) > hostproto.MaxStatusIDs {
			t.Fatalf("accepted out-of-bounds request %+v", req)
		}
		// What the decoder accepts, the client encodes back to an equivalent request.
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("encode accepted request: %v", err)
		}
		again, err := DecodeControlRequest(enc)
		if err != nil {
			t.Fatalf("re-decode %s: %v", enc, err)
		}
		enc2, _ := json.Marshal(again)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip changed the request:\n%s\n%s", enc, enc2)
		}
	})
}
