package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/postern-dev/postern/bastion/policy"
)

// What a reload (postern reload, SIGHUP) may change in a serving bastion: who may call
// (actors, principals, the [oauth] mapping: oauth.actors and oauth.scope_tools), what they
// may do (rules, classes), who decides (approval operators, the approval timeout) and the
// bounds of a call (waits, command and body sizes). They are read per call, so a new call
// sees the new values and an execution in flight keeps the decision journaled with it.
// Everything else — where the bastion listens and keeps its state, the journal, the plugin,
// the endpoints and their credentials, the sockets' limits, the webhook, the rest of [oauth]
// — is wired into what serves at start, and changing it needs a restart.
var reloadable = map[string]bool{
	"actors": true, "principals": true, "rules": true, "classes": true,
	"approval_timeout": true, "default_wait": true, "max_wait": true,
	"max_command_bytes": true, "max_request_body_bytes": true,
}

// RestartOnly names the settings that differ between c and next and that a reload cannot
// apply (TOML keys, in the order of Config; "approvals.webhook" for a nested one). Within
// [approvals] only the operators are reloadable.
func (c Config) RestartOnly(next Config) []string {
	var keys []string
	cv, nv := reflect.ValueOf(c), reflect.ValueOf(next)
	t := cv.Type()
	for i := range t.NumField() {
		key := tomlKey(t.Field(i))
		if reloadable[key] {
			continue
		}
		if key == "oauth" {
			keys = append(keys, c.OAuth.restartOnly(next.OAuth)...)
			continue
		}
		if key == "approvals" {
			a, b := c.Approvals, next.Approvals
			a.Operators, b.Operators = nil, nil
			if !reflect.DeepEqual(a, b) {
				keys = append(keys, changedKeys("approvals.", reflect.ValueOf(a), reflect.ValueOf(b))...)
			}
			continue
		}
		if !reflect.DeepEqual(cv.Field(i).Interface(), nv.Field(i).Interface()) {
			keys = append(keys, key)
		}
	}
	return keys
}

// Changes names the reloadable settings that differ between c and next, in words an
// operator reads in the reload's answer and log: actors and principals added, removed or
// changed by name, the number of rules, classes by name, other keys by name.
func (c Config) Changes(next Config) []string {
	var out []string
	named := func(what string, before, after map[string]string) {
		var added, removed, changed []string
		for n, v := range after {
			old, ok := before[n]
			switch {
			case !ok:
				added = append(added, n)
			case old != v:
				changed = append(changed, n)
			}
		}
		for n := range before {
			if _, ok := after[n]; !ok {
				removed = append(removed, n)
			}
		}
		for _, part := range []struct {
			verb  string
			names []string
		}{{"added", added}, {"removed", removed}, {"changed", changed}} {
			if len(part.names) > 0 {
				slices.Sort(part.names)
				out = append(out, fmt.Sprintf("%s %s: %s", what, part.verb, strings.Join(part.names, ", ")))
			}
		}
	}
	named("actors", byName(c.Actors, func(a policy.Actor) string { return a.Name }), byName(next.Actors, func(a policy.Actor) string { return a.Name }))
	named("principals", byName(c.Principals, func(p Principal) string { return p.Name }), byName(next.Principals, func(p Principal) string { return p.Name }))
	named("classes", byName(c.Classes, func(cl Class) string { return cl.Name }), byName(next.Classes, func(cl Class) string { return cl.Name }))
	if !reflect.DeepEqual(c.Rules, next.Rules) {
		out = append(out, fmt.Sprintf("rules: %d before, %d now", len(c.Rules), len(next.Rules)))
	}
	out = append(out, c.OAuth.changes(next.OAuth)...)
	if !slices.Equal(c.Approvals.Operators, next.Approvals.Operators) {
		out = append(out, fmt.Sprintf("approvals.operators: %s", strings.Join(next.Approvals.Operators, ", ")))
	}
	cv, nv := reflect.ValueOf(c), reflect.ValueOf(next)
	for i := range cv.NumField() {
		key := tomlKey(cv.Type().Field(i))
		switch key {
		case "approval_timeout", "default_wait", "max_wait", "max_command_bytes", "max_request_body_bytes":
			if a, b := cv.Field(i).Interface(), nv.Field(i).Interface(); a != b {
				out = append(out, fmt.Sprintf("%s: %v → %v", key, a, b))
			}
		}
	}
	return out
}

// Digest identifies a config file's contents in the reload log: the hex SHA-256 of its bytes.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// byName maps each element's name to its JSON rendering (pointers followed), to see which
// changed.
func byName[T any](list []T, name func(T) string) map[string]string {
	m := make(map[string]string, len(list))
	for _, v := range list {
		data, _ := json.Marshal(v) // config values: plain data, always encodable
		m[name(v)] = string(data)
	}
	return m
}

func tomlKey(f reflect.StructField) string {
	key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if key == "" {
		return strings.ToLower(f.Name)
	}
	return key
}

func changedKeys(prefix string, a, b reflect.Value) []string {
	var keys []string
	for i := range a.NumField() {
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			keys = append(keys, prefix+tomlKey(a.Type().Field(i)))
		}
	}
	return keys
}
