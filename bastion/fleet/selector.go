package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Selector picks hosts by their labels: "role=db,env=prod" selects the hosts that carry
// every one of them. It is the label form of a fleet run's targets (bastion/rollout on the
// fleet-run branch parses the same syntax; the two are meant to become one).
type Selector map[string]string

// maxSelectorBytes bounds a selector as written.
const maxSelectorBytes = 4 << 10

// ParseSelector reads "k=v[,k=v…]" ("" selects every host). Each label is named and valued
// as ValidateHostInfo wants; one label given twice with two values is an error (it would
// select nothing).
func ParseSelector(s string) (Selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if len(s) > maxSelectorBytes {
		return nil, fmt.Errorf("labels: at most %d bytes", maxSelectorBytes)
	}
	sel := Selector{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("labels %q: want KEY=VALUE[,KEY=VALUE…], e.g. role=db,env=prod", s)
		}
		if old, dup := sel[k]; dup && old != v {
			return nil, fmt.Errorf("labels %q: %s given twice, with two values: no host carries both", s, k)
		}
		sel[k] = v
	}
	if len(sel) > maxLabels {
		return nil, fmt.Errorf("labels: at most %d", maxLabels)
	}
	if err := ValidateHostInfo("", sel, ""); err != nil {
		return nil, err
	}
	return sel, nil
}

// Matches reports whether labels carry every label of s.
func (s Selector) Matches(labels map[string]string) bool {
	for k, v := range s {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// String is s as ParseSelector reads it, labels sorted.
func (s Selector) String() string {
	parts := make([]string, 0, len(s))
	for _, k := range slices.Sorted(maps.Keys(s)) {
		parts = append(parts, k+"="+s[k])
	}
	return strings.Join(parts, ",")
}

// Bounds of a page of hosts.
const (
	DefaultHostsPage = 100
	MaxHostsPage     = 1000
)

// PageHosts is one page of hosts (sorted by name, as Inventory.Hosts returns them): those
// sel matches whose name sorts after cursor (the last name of the previous page; "" starts
// at the beginning), at most limit (0: DefaultHostsPage). next is the cursor of the
// following page, "" after the last; total is how many hosts sel matches in all. A cursor is
// a host name, so a page does not shift when hosts are enrolled or removed meanwhile.
func PageHosts(hosts []Host, sel Selector, cursor string, limit int) (page []Host, next string, total int, err error) {
	if limit < 0 || limit > MaxHostsPage {
		return nil, "", 0, fmt.Errorf("limit must be in 0..%d", MaxHostsPage)
	}
	if cursor != "" && !hostName.MatchString(cursor) {
		return nil, "", 0, fmt.Errorf("cursor %q: pass the next_cursor of the previous page", cursor)
	}
	if limit == 0 {
		limit = DefaultHostsPage
	}
	for _, h := range hosts {
		if !sel.Matches(h.Labels) {
			continue
		}
		total++
		if h.Name <= cursor {
			continue
		}
		if len(page) == limit {
			next = page[len(page)-1].Name
			continue
		}
		page = append(page, h)
	}
	return page, next, total, nil
}
