package markers_test

import (
	"testing"
	"time"

	"github.com/postern-dev/postern/markers"
)

func TestQuerySelects(t *testing.T) {
	at := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	rec := &markers.Record{Actor: "token:ci", CreatedAt: at}
	tests := []struct {
		name string
		q    markers.Query
		want bool
	}{
		{"no filter", markers.Query{}, true},
		{"its actor", markers.Query{Actor: "token:ci"}, true},
		{"another actor", markers.Query{Actor: "local:root"}, false},
		{"since is inclusive", markers.Query{Since: at}, true},
		{"since after", markers.Query{Since: at.Add(time.Second)}, false},
		{"until is exclusive", markers.Query{Until: at}, false},
		{"until after", markers.Query{Until: at.Add(time.Second)}, true},
	}
	for _, tt := range tests {
		if got := tt.q.Selects(rec); got != tt.want {
			t.Errorf("%s: got = %v; want %v", tt.name, got, tt.want)
		}
	}
}

func TestPageSize(t *testing.T) {
	for _, tt := range []struct{ limit, want int }{{0, 100}, {-1, 100}, {7, 7}, {5000, markers.MaxPage}} {
		if got := (markers.Query{Limit: tt.limit}).PageSize(); got != tt.want {
			t.Errorf("Query{Limit: %d}.PageSize() got = %d; want %d", tt.limit, got, tt.want)
		}
		if got := (markers.RunQuery{Limit: tt.limit}).PageSize(); got != tt.want {
			t.Errorf("RunQuery{Limit: %d}.PageSize() got = %d; want %d", tt.limit, got, tt.want)
		}
	}
}
