package markers_test

import (
	"strings"
	"testing"
	"time"

	"github.com/postern-dev/postern/markers"
)

const validID = "ex_01J3Z5V8Q4K7M2N9P0R6S8T1VW"

func TestValidExecutionID(t *testing.T) {
	tests := []struct {
		id   string
		want bool
	}{
		{validID, true},
		{"ex_7ZZZZZZZZZZZZZZZZZZZZZZZZZ", true},
		{"ex_8ZZZZZZZZZZZZZZZZZZZZZZZZZ", false},
		{"ex_01j3z5v8q4k7m2n9p0r6s8t1vw", false},
		{"EX_01J3Z5V8Q4K7M2N9P0R6S8T1VW", false},
		{"ex_01J3Z5V8Q4K7M2N9P0R6S8T1VWX", false},
		{"ex_01J3Z5V8Q4K7M2N9P0R6S8T1VI", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := markers.ValidExecutionID(tt.id); got != tt.want {
			t.Errorf("ValidExecutionID(%q) = %v; want %v", tt.id, got, tt.want)
		}
	}
}

func FuzzValidExecutionID(f *testing.F) {
	f.Add(validID)
	f.Add("ex_01j3z5v8q4k7m2n9p0r6s8t1vw")
	f.Fuzz(func(t *testing.T, id string) {
		if !markers.ValidExecutionID(id) {
			return
		}
		if len(id) != 29 || strings.ToUpper(id[3:]) != id[3:] || !strings.HasPrefix(id, "ex_") {
			t.Errorf("accepted non-canonical id %q", id)
		}
	})
}

func TestNewExecutionIDIsValidAndSorted(t *testing.T) {
	prev := ""
	for i := 0; i < 1000; i++ {
		id, err := markers.NewExecutionID(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !markers.ValidExecutionID(id) {
			t.Fatalf("NewExecutionID() = %q is not valid", id)
		}
		if id <= prev {
			t.Fatalf("%q does not sort after %q", id, prev)
		}
		prev = id
	}
}

// An execution id tells when it was made, to the millisecond; anything else tells nothing.
func TestExecutionIDTime(t *testing.T) {
	at := time.Date(2026, 12, 2, 11, 0, 0, 123_000_000, time.UTC)
	id, err := markers.NewExecutionID(at)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := markers.ExecutionIDTime(id); !ok || !got.Equal(at) {
		t.Errorf("ExecutionIDTime(%s) = %v, %v; want %v", id, got, ok, at)
	}
	for _, bad := range []string{"", "ex_", "ex_not-a-ulid", "01JTLS00000000000000000001"} {
		if _, ok := markers.ExecutionIDTime(bad); ok {
			t.Errorf("ExecutionIDTime(%q) ok", bad)
		}
	}
}
