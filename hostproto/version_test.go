package hostproto

import (
	"encoding/json"
	"errors"
	"testing"
)

// TestAgree: two peers speak the lower of their versions, within this release's window.
func TestAgree(t *testing.T) {
	tests := []struct {
		name    string
		theirs  int
		want    int
		wantErr error
	}{
		{name: "the previous release", theirs: 1, want: 1},
		{name: "this release", theirs: Version, want: Version},
		{name: "a newer release", theirs: Version + 3, want: Version},
		{name: "no version", theirs: 0, wantErr: ErrVersion},
		{name: "negative", theirs: -1, wantErr: ErrVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Agree(tt.theirs)
			if got != tt.want || !errors.Is(err, tt.wantErr) {
				t.Errorf("Agree(%d) = %d, %v; want %d, %v", tt.theirs, got, err, tt.want, tt.wantErr)
			}
		})
	}
	if MinVersion > Version || MinVersion < 1 {
		t.Errorf("window %d..%d is empty", MinVersion, Version)
	}
}

// TestAnswerHello: the server answers any hello with its own version and build, and says when
// it cannot speak with the client.
func TestAnswerHello(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    int
		wantErr error
	}{
		{name: "this release", payload: `{"version":2,"build":"postern-x 1.0"}`, want: 2},
		{name: "a newer release", payload: `{"version":9}`, want: Version},
		{name: "not JSON", payload: `hello`, wantErr: ErrVersion},
		{name: "no version", payload: `{}`, wantErr: ErrVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reply, err := AnswerHello([]byte(tt.payload), "hostagent build")
			if got != tt.want || !errors.Is(err, tt.wantErr) {
				t.Errorf("AnswerHello = %d, %v; want %d, %v", got, err, tt.want, tt.wantErr)
			}
			var h Hello
			if json.Unmarshal(reply, &h) != nil || h.Version != Version || h.Build != "hostagent build" {
				t.Errorf("reply %s; want this release's hello", reply)
			}
		})
	}
}
