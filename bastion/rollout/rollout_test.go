package rollout

import (
	"slices"
	"strings"
	"testing"

	"github.com/postern-dev/postern/markers"
)

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Limit
		wantErr string
	}{
		{"20", Limit{N: 20}, ""},
		{"0", Limit{N: 0}, ""},
		{"25%", Limit{N: 25, Percent: true}, ""},
		{"100%", Limit{N: 100, Percent: true}, ""},
		{"101%", Limit{}, "at most 100%"},
		{"-1", Limit{}, "want a count"},
		{"ten", Limit{}, "want a count"},
		{"", Limit{}, "want a count"},
	} {
		got, err := ParseLimit(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseLimit(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want || got.String() != tc.in {
			t.Errorf("ParseLimit(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestConcurrency(t *testing.T) {
	for _, tc := range []struct {
		limit Limit
		total int
		want  int
	}{
		{Limit{N: 20}, 100, 20},
		{Limit{N: 20}, 5, 5},
		{Limit{N: 0}, 5, 1},
		{Limit{N: 10, Percent: true}, 100, 10},
		{Limit{N: 10, Percent: true}, 5, 1}, // rounds down to 0: still one at a time
		{Limit{N: 100, Percent: true}, 40, 40},
	} {
		if got := Concurrency(tc.limit, tc.total); got != tc.want {
			t.Errorf("Concurrency(%v, %d) = %d; want %d", tc.limit, tc.total, got, tc.want)
		}
	}
	if got := (Limit{N: 10, Percent: true}).Of(25); got != 2 {
		t.Errorf("10%% of 25 = %d; want 2 (rounded down)", got)
	}
}

func TestSelect(t *testing.T) {
	hosts := []Host{
		{Name: "db-1", Groups: []string{"db"}, Labels: map[string]string{"role": "db", "env": "prod"}},
		{Name: "db-2", Groups: []string{"db"}, Labels: map[string]string{"role": "db", "env": "staging"}},
		{Name: "web-1", Groups: []string{"web"}, Labels: map[string]string{"role": "web", "env": "prod"}},
	}
	for _, tc := range []struct {
		targets []string
		want    []string
		wantErr string
	}{
		{[]string{"web-1"}, []string{"web-1"}, ""},
		{[]string{"group:db"}, []string{"db-1", "db-2"}, ""},
		{[]string{"role=db,env=prod"}, []string{"db-1"}, ""},
		{[]string{"env=prod", "group:db"}, []string{"db-1", "db-2", "web-1"}, ""},
		{[]string{"db-1", "db-1"}, []string{"db-1"}, ""},
		{nil, nil, "name at least one host"},
		{[]string{"db-9"}, nil, `"db-9" selects no enrolled host`},
		{[]string{"group:"}, nil, "name the group"},
		{[]string{"role=db,env"}, nil, "want labels as k=v"},
		{[]string{"role=db,role=web"}, nil, "given twice"},
		{[]string{"web-1", "role=cache"}, nil, `"role=cache" selects no enrolled host`},
	} {
		got, err := Select(tc.targets, hosts)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Select(%q) = %v, %v; want an error saying %q", tc.targets, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Select(%q) = %v, %v; want %v", tc.targets, got, err, tc.want)
		}
	}
}

func TestCanonical(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    []string
		wantErr string
	}{
		{[]string{"web-1", " group:db ", "web-1"}, []string{"group:db", "web-1"}, ""},
		{[]string{"role=db, env=prod"}, []string{"env=prod,role=db"}, ""},
		{[]string{"env=prod,role=db", "role=db,env=prod,role=db"}, []string{"env=prod,role=db"}, ""},
		{[]string{"role=db,role=web"}, nil, "given twice"},
		{[]string{""}, nil, "an empty target"},
	} {
		got, err := Canonical(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Canonical(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Canonical(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestAdd: how a host's execution counts for the brakes.
func TestAdd(t *testing.T) {
	for _, tc := range []struct {
		state           markers.State
		isError, review bool
		want            Progress
	}{
		{markers.Accepted, false, false, Progress{Started: 1, Running: 1}},
		{markers.Authorized, false, false, Progress{Started: 1, Running: 1}},
		{markers.Dispatched, false, false, Progress{Started: 1, Running: 1}},
		{markers.Running, false, false, Progress{Started: 1, Running: 1}},
		{markers.Unknown, false, false, Progress{Started: 1, Running: 1}}, // still asked: it may run
		{markers.Unknown, false, true, Progress{Started: 1, Failed: 1}},   // review required: cannot vouch
		{markers.Completed, false, false, Progress{Started: 1, Succeeded: 1}},
		{markers.Completed, true, false, Progress{Started: 1, Failed: 1}},
		{markers.Failed, true, false, Progress{Started: 1, Failed: 1}},
		{markers.Rejected, false, false, Progress{Started: 1, Failed: 1}},
		{markers.Cancelled, false, false, Progress{Started: 1, Failed: 1}},
		{markers.TimedOut, true, false, Progress{Started: 1, Failed: 1}},
	} {
		var p Progress
		p.Add(tc.state, tc.isError, tc.review)
		if p != tc.want {
			t.Errorf("Add(%s, is_error %v, review %v) = %+v; want %+v", tc.state, tc.isError, tc.review, p, tc.want)
		}
	}
}

// TestNext: the brakes. Up to the concurrency at once; once failures exceed max_errors no
// host starts any more and the run ends when the running ones did; a cancel brakes too.
func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name       string
		p          Progress
		conc, errs int
		want       Step
	}{
		{"start: the first wave", Progress{Total: 100}, 20, 5, Step{Start: 20}},
		{"a slot freed", Progress{Total: 100, Started: 20, Running: 19, Succeeded: 1}, 20, 5, Step{Start: 1}},
		{"full", Progress{Total: 100, Started: 20, Running: 20}, 20, 5, Step{}},
		{"the tail", Progress{Total: 100, Started: 98, Running: 10, Succeeded: 88}, 20, 5, Step{Start: 2}},
		{"all started, some running", Progress{Total: 3, Started: 3, Running: 1, Succeeded: 2}, 20, 5, Step{}},
		{"completed", Progress{Total: 3, Started: 3, Succeeded: 3}, 20, 5, Step{Done: true, Outcome: Completed}},
		{"failures within max_errors", Progress{Total: 10, Started: 5, Running: 0, Succeeded: 3, Failed: 2}, 5, 2, Step{Start: 5}},
		{"max_errors exceeded: braked, running finish", Progress{Total: 10, Started: 5, Running: 2, Succeeded: 0, Failed: 3}, 5, 2, Step{Braked: true}},
		{"max_errors exceeded: stopped", Progress{Total: 10, Started: 5, Failed: 3, Succeeded: 2}, 5, 2, Step{Braked: true, Done: true, Outcome: Stopped}},
		{"max_errors 0 stops at the first failure", Progress{Total: 10, Started: 1, Failed: 1}, 5, 0, Step{Braked: true, Done: true, Outcome: Stopped}},
		{"every host started, one failed", Progress{Total: 4, Started: 4, Succeeded: 3, Failed: 1}, 5, 0, Step{Braked: true, Done: true, Outcome: Failed}},
		{"cancelled while running", Progress{Total: 10, Started: 4, Running: 2, Succeeded: 2, Cancelled: true}, 5, 2, Step{Braked: true}},
		{"cancelled", Progress{Total: 10, Started: 4, Succeeded: 2, Failed: 2, Cancelled: true}, 5, 2, Step{Braked: true, Done: true, Outcome: Cancelled}},
		{"one host", Progress{Total: 1}, 1, 0, Step{Start: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.p, tc.conc, tc.errs); got != tc.want {
				t.Fatalf("Next(%+v, %d, %d) = %+v; want %+v", tc.p, tc.conc, tc.errs, got, tc.want)
			}
		})
	}
}
