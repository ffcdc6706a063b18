package capbuf

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestBufferKeepsTheFirstBytes(t *testing.T) {
	tests := []struct {
		name string
		max  int
		in   string
		want string
	}{
		{"under the bound", 10, "hello", "hello"},
		{"at the bound", 5, "hello", "hello"},
		{"over the bound", 3, "hello", "hel"},
		{"default bound", 0, strings.Repeat("x", DefaultMax+7), strings.Repeat("x", DefaultMax)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			n, err := io.Copy(&Buffer{B: &b, Max: tt.max}, strings.NewReader(tt.in))
			if err != nil || n != int64(len(tt.in)) {
				t.Fatalf("copy = %d, %v; want %d, nil (the rest is dropped, not refused)", n, err, len(tt.in))
			}
			if got := b.String(); got != tt.want {
				t.Errorf("kept %d bytes; want %d", len(got), len(tt.want))
			}
		})
	}
}
