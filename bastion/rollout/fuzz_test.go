package rollout

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParseLimit: any text either parses to a limit that writes back to a text parsing to
// itself, within bounds, or is refused.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"0", "20", "25%", "100%", "101%", "-1", " 5 ", "5%%", "", "%", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLimit(s)
		if err != nil {
			return
		}
		if l.N < 0 || (l.Percent && l.N > 100) {
			t.Fatalf("ParseLimit(%q) = %+v: out of bounds", s, l)
		}
		if again, err := ParseLimit(l.String()); err != nil || again != l {
			t.Fatalf("ParseLimit(%q) = %+v, written %q, parsed again %+v, %v", s, l, l.String(), again, err)
		}
		for _, total := range []int{0, 1, 7, 500} {
			if c := Concurrency(l, total); c < 1 || (total > 0 && c > total) {
				t.Fatalf("Concurrency(%+v, %d) = %d", l, total, c)
			}
		}
	})
}

// FuzzCanonical: canonical targets are a fixed point, and select the same hosts as the
// targets they came from.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{"web-1", "group:db", "role=db,env=prod", " env = prod , role=db", "a=b,a=c", "group:", "=x", "k="} {
		f.Add(s, "web-2")
	}
	hosts := []Host{
		{Name: "web-1", Groups: []string{"web"}, Labels: map[string]string{"role": "web", "env": "prod"}},
		{Name: "db-1", Groups: []string{"db"}, Labels: map[string]string{"role": "db", "env": "prod"}},
		{Name: "db-2", Groups: []string{"db"}, Labels: map[string]string{"role": "db", "env": "staging"}},
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		targets := []string{a, b}
		c, err := Canonical(targets)
		if err != nil {
			return
		}
		again, err := Canonical(c)
		if err != nil || !slices.Equal(again, c) {
			t.Fatalf("Canonical(%q) = %q, then %q, %v", targets, c, again, err)
		}
		want, errWant := Select(targets, hosts)
		got, errGot := Select(c, hosts)
		if (errWant == nil) != (errGot == nil) || !slices.Equal(want, got) {
			t.Fatalf("Select(%q) = %q, %v; of canonical %q: %q, %v", targets, want, errWant, c, got, errGot)
		}
		for _, s := range c {
			if strings.TrimSpace(s) != s {
				t.Fatalf("canonical target %q is not trimmed", s)
			}
		}
	})
}
