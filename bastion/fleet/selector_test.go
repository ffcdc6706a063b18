package fleet

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParseSelector(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "", want: ""},
		{in: "role=db", want: "role=db"},
		{in: " env=prod , role=db ", want: "env=prod,role=db"},
		{in: "role=db,role=db", want: "role=db"},
		{in: "team/owner=payments", want: "team/owner=payments"},
		{in: "role", err: "want KEY=VALUE"},
		{in: "role=", err: "want KEY=VALUE"},
		{in: "=db", err: "want KEY=VALUE"},
		{in: "role=db,", err: "want KEY=VALUE"},
		{in: "role=db,role=web", err: "given twice"},
		{in: "bad key=x", err: "label"},
		{in: strings.Repeat("a", 5000) + "=b", err: "at most"},
	} {
		sel, err := ParseSelector(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: err %v; want %q", tc.in, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err == "" && sel.String() != tc.want:
			t.Errorf("%q = %q; want %q", tc.in, sel.String(), tc.want)
		}
	}
}

// TestPageHosts: pages cover the matching hosts once each, in name order, whatever the
// limit; the total counts every match; a host enrolled before the cursor does not shift
// the next page.
func TestPageHosts(t *testing.T) {
	var hosts []Host
	for i := range 25 {
		env := "prod"
		if i%5 == 0 {
			env = "staging"
		}
		hosts = append(hosts, Host{Name: fmt.Sprintf("h%02d", i), Labels: map[string]string{"env": env, "role": "db"}})
	}
	prod, _ := ParseSelector("role=db,env=prod")
	for _, limit := range []int{1, 3, 7, 20, 100} {
		var got []string
		cursor := ""
		for range 100 {
			page, next, total, err := PageHosts(hosts, prod, cursor, limit)
			if err != nil || total != 20 || len(page) > limit {
				t.Fatalf("limit %d: page of %d, total %d, %v", limit, len(page), total, err)
			}
			for _, h := range page {
				got = append(got, h.Name)
			}
			if next == "" {
				break
			}
			cursor = next
		}
		if len(got) != 20 || !slices.IsSorted(got) || slices.Contains(got, "h05") {
			t.Fatalf("limit %d: pages gave %v", limit, got)
		}
	}
	page, next, _, _ := PageHosts(hosts, nil, "", 10)
	if len(page) != 10 || next != "h09" {
		t.Fatalf("first page %d, next %q", len(page), next)
	}
	more := append([]Host{{Name: "a-new"}}, hosts...)
	page, _, total, _ := PageHosts(more, nil, next, 10)
	if page[0].Name != "h10" || total != 26 {
		t.Fatalf("after enrolling before the cursor, the next page starts at %s (total %d)", page[0].Name, total)
	}
	for _, bad := range []struct {
		cursor string
		limit  int
	}{{"", -1}, {"", MaxHostsPage + 1}, {"bad cursor", 10}} {
		if _, _, _, err := PageHosts(hosts, nil, bad.cursor, bad.limit); err == nil {
			t.Errorf("PageHosts(%q, %d) succeeded", bad.cursor, bad.limit)
		}
	}
}

func FuzzParseSelector(f *testing.F) {
	f.Add("role=db,env=prod")
	f.Add(" a = b ,a=b")
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		again, err := ParseSelector(sel.String())
		if err != nil || again.String() != sel.String() {
			t.Fatalf("%q → %q → %q, %v", s, sel.String(), again.String(), err)
		}
	})
}
