package bastion

import (
	"testing"
	"time"
)

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"df *", "df -h", true},
		{"df *", "df", false},
		{"df*", "df", true},
		{"*", "", true},
		{"", "", true},
		{"", "x", false},
		{"uptime", "uptime", true},
		{"uptime", "uptime ", false},
		{"systemctl status *", "systemctl status nginx", true},
		{"*status*", "systemctl status nginx", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXbY", false},
		{"a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false},
	}
	for _, tt := range tests {
		if got := globMatch(tt.pattern, tt.s); got != tt.want {
			t.Errorf("globMatch(%q, %q) = %v; want %v", tt.pattern, tt.s, got, tt.want)
		}
	}
}

func TestClassForCommand(t *testing.T) {
	c := newClasses(Config{
		Classes: []ClassConfig{{Name: ClassReadOnly, AttachWindow: time.Minute}},
		Rules: []RuleConfig{
			{Class: ClassIrreversible, Commands: []string{"*rotate-credentials*"}},
			{Class: ClassReadOnly, Commands: []string{"df *", "uptime"}},
			{Class: ClassIdempotentWrite, Hosts: []string{"db-*"}, Commands: []string{"systemctl restart *"}},
		},
	})
	tests := []struct {
		host, command, want string
	}{
		{"web-1", "df -h", ClassReadOnly},
		{"web-1", "uptime", ClassReadOnly},
		{"web-1", "migrate up", ClassRemoteCommand},
		{"db-1", "systemctl restart postgres", ClassIdempotentWrite},
		{"web-1", "systemctl restart postgres", ClassRemoteCommand},
		// Shell syntax never gets a looser class from a pattern.
		{"web-1", "df -h; rm -rf /", ClassRemoteCommand},
		{"web-1", "df -h && reboot", ClassRemoteCommand},
		{"web-1", "df $(reboot)", ClassRemoteCommand},
		{"web-1", "df `reboot`", ClassRemoteCommand},
		{"web-1", "df -h\nreboot", ClassRemoteCommand},
		{"web-1", "df -h | sh", ClassRemoteCommand},
		{"web-1", "df > /etc/passwd", ClassRemoteCommand},
		// ...but a stricter class still applies.
		{"web-1", "vault rotate-credentials; echo ok", ClassIrreversible},
	}
	for _, tt := range tests {
		if got := c.forCommand(tt.host, nil, tt.command).Name; got != tt.want {
			t.Errorf("forCommand(%q, %q) = %s; want %s", tt.host, tt.command, got, tt.want)
		}
	}
	if got := c.get(ClassReadOnly); got.AttachWindow != time.Minute || got.Retention != 7*day {
		t.Errorf("configured read_only = %+v; want window 1m and the built-in retention", got)
	}
	if got := c.get("from-an-old-config"); got.AttachWindow != day {
		t.Errorf("unknown class = %+v; want remote_command windows", got)
	}
}

func FuzzGlobMatch(f *testing.F) {
	f.Add("df *", "df -h")
	f.Add("*a*b*", "xxaxxbxx")
	f.Fuzz(func(t *testing.T, pattern, s string) {
		if len(pattern) > 64 || len(s) > 256 {
			return
		}
		got := globMatch(pattern, s)
		if pattern == s && !got {
			t.Fatalf("a literal pattern %q does not match itself", pattern)
		}
		if got && len(s) < countNonStar(pattern) {
			t.Fatalf("%q matched %q, shorter than its literal characters", pattern, s)
		}
	})
}

func countNonStar(p string) int {
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] != '*' {
			n++
		}
	}
	return n
}
