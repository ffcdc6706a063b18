package policy

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/postern-dev/postern/hostproto"
)

// Tools the ladder knows the targets of.
const (
	ToolSSHExec     = "ssh_exec"
	ToolHTTPRequest = "http_request"
)

// Built-in action classes (docs/design.md, "Action classes"), strictest first.
const (
	ClassIrreversible     = "irreversible"
	ClassConditionalWrite = "conditional_write"
	ClassIdempotentWrite  = "idempotent_write"
	ClassRemoteCommand    = "remote_command"
	ClassReadOnly         = "read_only"
)

// Strictness ranks: higher is stricter. Operator-defined classes rank between
// remote_command and idempotent_write: stricter than a plain remote command, looser than
// the write classes whose recovery the bastion knows.
const (
	rankReadOnly = iota
	rankRemoteCommand
	rankCustom
	rankIdempotentWrite
	rankConditionalWrite
	rankIrreversible
)

var builtinRanks = map[string]int{
	ClassReadOnly:         rankReadOnly,
	ClassRemoteCommand:    rankRemoteCommand,
	ClassIdempotentWrite:  rankIdempotentWrite,
	ClassConditionalWrite: rankConditionalWrite,
	ClassIrreversible:     rankIrreversible,
}

// Rule decisions.
const (
	DecisionDeny    = "deny"
	DecisionApprove = "approve"
	// DecisionAllow names programs (or endpoints) an actor with Default "deny" may use.
	DecisionAllow = "allow"
)

// Actor defaults (Actor.Default).
const (
	DefaultAllow = "allow" // a call no rule denies is authorized (the default)
	DefaultDeny  = "deny"  // only what allow rules name runs: every program of a command, each endpoint
)

// Actor is a caller the operator configured: remote by token hash, or local by process
// (uid and/or exe). Exactly one of the two identities is set.
type Actor struct {
	Name        string `toml:"name"`
	TokenSHA256 string `toml:"token_sha256"` // remote actors: hex SHA-256 of a static bearer token
	// Remote declares a remote actor without a static token: its tokens are those
	// `postern token NAME` issues (with an id, an expiry, revocable).
	Remote    bool     `toml:"remote"`
	UID       *int     `toml:"uid"`       // local actors: match the peer uid ...
	Exe       string   `toml:"exe"`       // ... and/or the agent process's executable path (exact)
	Hosts     []string `toml:"hosts"`     // globs over host names and "group:<glob>"; empty = all hosts
	Tools     []string `toml:"tools"`     // tool names; empty = all tools
	Endpoints []string `toml:"endpoints"` // http endpoint names (globs); empty = all
	// Default is what the actor may do that no rule names: "allow" (or "") — anything no
	// deny rule forbids —, or "deny" — only what an applicable allow rule names: every
	// program every command would run (each layer, wrappers included; an unknowable program
	// is denied) and each endpoint and method.
	Default string `toml:"default"`
	// Limits, enforced by the bastion; 0 = unlimited. The run_ forms apply to each agent run
	// (intent scope) of the actor on its own, so one run cannot use up another's share.
	MaxConcurrent    int `toml:"max_concurrent"`     // executions in flight at once
	DailyQuota       int `toml:"daily_quota"`        // executions that dispatched (or may still) per UTC day
	RunMaxConcurrent int `toml:"run_max_concurrent"` // max_concurrent for each agent run
	RunDailyQuota    int `toml:"run_daily_quota"`    // daily_quota for each agent run
}

// Limited reports whether the bastion must count the actor's executions.
func (a Actor) Limited() bool {
	return a.MaxConcurrent > 0 || a.DailyQuota > 0 || a.RunMaxConcurrent > 0 || a.RunDailyQuota > 0
}

// Local reports whether the actor is matched by process rather than by token.
func (a Actor) Local() bool { return a.TokenSHA256 == "" && !a.Remote }

// Rule maps (actors?, hosts/groups, command patterns | written files | endpoint + methods)
// to a class, a deny, an approval requirement, or an allowance (for actors with Default
// "deny").
type Rule struct {
	Name      string   `toml:"name"`      // for explanations; default "rules[i]"
	Class     string   `toml:"class"`     // action class when it matches ("" = keep what other rules or the default say)
	Decision  string   `toml:"decision"`  // "" | "deny" | "approve" | "allow"
	Actors    []string `toml:"actors"`    // actor names; empty = all
	Hosts     []string `toml:"hosts"`     // host-name globs or "group:<glob>"; empty = all
	Commands  []string `toml:"commands"`  // argv patterns (see MatchArgv); empty = all commands
	Writes    []string `toml:"writes"`    // globs over the files redirections write (> f, >> f); see Script.Writes
	Endpoints []string `toml:"endpoints"` // http endpoint names (globs); empty = all
	Methods   []string `toml:"methods"`   // http methods (case-insensitive); empty = all
	// Accounts make the rule an account grant: its actors may run ssh_exec commands as
	// these accounts (exact names) on its hosts, besides the host's enrolled account. Only
	// with decision "allow", actors and hosts; it decides nothing else.
	Accounts []string `toml:"accounts"`
}

// Request is one tool call the bastion asks the policy about.
type Request struct {
	// Actor is the configured actor's Name (Actor.Name as returned by Policy.Actor or
	// Policy.LocalActor) — never the transport's "token:x"/"local:y" form. "" = unresolved.
	Actor string
	// Tool is the MCP tool: "ssh_exec", "http_request", ...
	Tool string
	// ssh_exec: the target host, its inventory groups, and the command string.
	Host    string
	Groups  []string
	Command string
	// Account is the account the command is to run as when it is not the host's enrolled
	// one ("" = the enrolled account, which needs no grant).
	Account string
	// http_request: the endpoint name, the method, the path and the endpoint's configured
	// class ("" = idempotent_write, the bastion's default).
	Endpoint      string
	Method        string
	Path          string
	EndpointClass string
}

// Outcome is where the ladder ends.
type Outcome string

const (
	Authorized       Outcome = "authorized"
	AwaitingApproval Outcome = "awaiting_approval"
	Rejected         Outcome = "rejected"
)

// Rejection codes (Decision.Code).
const (
	CodeActorUnknown  = "actor_unknown"  // no configured actor by that name
	CodeTargetUnknown = "target_unknown" // the request names no host (ssh_exec) or endpoint (http_request)
	// CodeNotAllowed: the actor may not use this tool, host or endpoint; or, under Default
	// "deny", no allow rule names a program of the command (or the endpoint and method).
	CodeNotAllowed = "not_allowed"
	CodeDenied     = "denied"     // a deny rule matched a command, a written file (or endpoint) of the request
	CodeUnparsable = "unparsable" // a program of the command is only known when it runs, and a deny rule or the actor's default deny could apply
)

// Decision is the ladder's answer with its explanation.
type Decision struct {
	Outcome Outcome
	Class   string   // the action class that applies ("" when rejected before rules were looked at)
	Rule    string   // the rule (or actor limit) that decided, e.g. `rules[2] "no-prod-drops"`
	Steps   []string // the ladder as walked, one line per step
	Code    string   // rejections only
	// Reason says in plain words why the outcome is what it is: `denied by rule "no-rm": rm
	// -rf /x (run by sudo) matches "rm **"`, "the program is only known when the command
	// runs ($CMD) …". Set for every outcome.
	Reason string
	// Repair says what the caller can do about it ("name the program literally", "wait for
	// a person's approval"); "" when authorized.
	Repair string
	// Word is the word that decided, as written: the program no allow rule names, the
	// word that makes a program unknowable ($CMD, eval), the file a writes rule matched;
	// "" when none did.
	Word string
	// Layers (ssh_exec) are the commands the command line would run: each simple command
	// and, through the wrappers the policy knows, what it runs. Partial when a program is
	// unknowable.
	Layers []Layer
	// Layer is the index into Layers of the layer that decided — matched the deny or
	// approve rule, is not allowed, is unknowable, or set the class — or -1 when no single
	// layer did.
	Layer int
	// Writes and Reads (ssh_exec) are the files the command's redirections write and read.
	Writes []File
	Reads  []File
}

// ErrInvalid is wrapped by every validation problem New reports.
var ErrInvalid = errors.New("invalid policy")

// Policy is a validated, immutable set of actors and rules; safe for concurrent use.
type Policy struct {
	actors []Actor
	byName map[string]int
	rules  []compiledRule
	ranks  map[string]int // class name → strictness (higher = stricter)
}

type compiledRule struct {
	Rule
	label string // `rules[2] "no-prod-drops"`
}

func (r compiledRule) forCommands() bool  { return len(r.Commands) > 0 }
func (r compiledRule) forWrites() bool    { return len(r.Writes) > 0 }
func (r compiledRule) forEndpoints() bool { return len(r.Endpoints) > 0 || len(r.Methods) > 0 }
func (r compiledRule) forAccounts() bool  { return len(r.Accounts) > 0 }

var (
	namePattern   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)
	methodPattern = regexp.MustCompile(`^[A-Za-z]{1,16}$`)
)

// New validates actors and rules and compiles them. knownClasses are the class names
// rules may use besides the built-in ones (the bastion's [[classes]]). Every problem is
// reported at once (errors.Join), each wrapping ErrInvalid. The slices are copied.
func New(actors []Actor, rules []Rule, knownClasses []string) (*Policy, error) {
	p := &Policy{byName: map[string]int{}, ranks: map[string]int{}}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
	}
	for name, rank := range builtinRanks {
		p.ranks[name] = rank
	}
	for _, c := range knownClasses {
		if !namePattern.MatchString(c) {
			bad("class %q: want 1-64 of [A-Za-z0-9_.-]", c)
		}
		if _, builtin := builtinRanks[c]; !builtin {
			p.ranks[c] = rankCustom
		}
	}

	for i, a := range actors {
		at := fmt.Sprintf("actors[%d] (%s)", i, a.Name)
		if !namePattern.MatchString(a.Name) {
			bad("actors[%d]: name %q: want 1-64 of [A-Za-z0-9_.-]", i, a.Name)
		} else if _, dup := p.byName[a.Name]; dup {
			bad("%s: duplicate name", at)
		} else {
			p.byName[a.Name] = i
		}
		local := a.UID != nil || a.Exe != ""
		switch {
		case (a.TokenSHA256 != "" || a.Remote) && local:
			bad("%s: token_sha256 or remote (remote) and uid/exe (local) are exclusive", at)
		case a.TokenSHA256 == "" && !a.Remote && !local:
			bad("%s: set token_sha256 or remote = true (remote actor) or uid and/or exe (local actor)", at)
		case a.TokenSHA256 != "":
			if b, err := hex.DecodeString(a.TokenSHA256); err != nil || len(b) != 32 {
				bad("%s: token_sha256 must be 64 hex characters (the token itself never goes in the config)", at)
			}
		}
		if a.UID != nil && *a.UID < 0 {
			bad("%s: uid %d is negative", at, *a.UID)
		}
		if a.Exe != "" && (!path.IsAbs(a.Exe) || path.Clean(a.Exe) != a.Exe) {
			bad("%s: exe %q must be a clean absolute path (it is compared exactly)", at, a.Exe)
		}
		for _, h := range a.Hosts {
			if err := validateGlob("host", h); err != nil {
				bad("%s: %v", at, err)
			}
		}
		for _, t := range a.Tools {
			if !namePattern.MatchString(t) {
				bad("%s: tool %q: not a tool name", at, t)
			}
		}
		for _, e := range a.Endpoints {
			if err := validateGlob("endpoint", e); err != nil {
				bad("%s: %v", at, err)
			}
		}
		switch a.Default {
		case "", DefaultAllow, DefaultDeny:
		default:
			bad("%s: default %q: want \"allow\" or \"deny\"", at, a.Default)
		}
		if a.MaxConcurrent < 0 || a.DailyQuota < 0 || a.RunMaxConcurrent < 0 || a.RunDailyQuota < 0 {
			bad("%s: max_concurrent, daily_quota, run_max_concurrent and run_daily_quota must not be negative (0 = unlimited)", at)
		}
		a.Hosts, a.Tools, a.Endpoints = slices.Clone(a.Hosts), slices.Clone(a.Tools), slices.Clone(a.Endpoints)
		if a.UID != nil {
			uid := *a.UID
			a.UID = &uid
		}
		p.actors = append(p.actors, a)
	}

	ruleNames := map[string]bool{}
	for i, r := range rules {
		label := fmt.Sprintf("rules[%d]", i)
		if r.Name != "" {
			label += fmt.Sprintf(" %q", r.Name)
			if !namePattern.MatchString(r.Name) {
				bad("%s: name: want 1-64 of [A-Za-z0-9_.-]", label)
			} else if ruleNames[r.Name] {
				bad("%s: duplicate name", label)
			}
			ruleNames[r.Name] = true
		}
		if _, ok := p.ranks[r.Class]; r.Class != "" && !ok {
			bad("%s: unknown class %q", label, r.Class)
		}
		switch r.Decision {
		case "", DecisionApprove:
		case DecisionAllow:
			if len(r.Writes) > 0 {
				bad("%s: an allow rule names programs or endpoints; writes are never default-denied (deny or approve them instead)", label)
			}
		case DecisionDeny:
			if r.Class != "" {
				bad("%s: a deny rule's class would never apply; drop class or decision", label)
			}
		default:
			bad("%s: decision %q: want \"deny\", \"approve\", \"allow\" or none", label, r.Decision)
		}
		if r.Class == "" && r.Decision == "" {
			bad("%s: sets neither class nor decision, so it does nothing", label)
		}
		for _, a := range r.Actors {
			if _, ok := p.byName[a]; !ok {
				bad("%s: unknown actor %q", label, a)
			}
		}
		for _, h := range r.Hosts {
			if err := validateGlob("host", h); err != nil {
				bad("%s: %v", label, err)
			}
		}
		for _, c := range r.Commands {
			if err := validatePattern(c); err != nil {
				bad("%s: %v", label, err)
			}
		}
		for _, w := range r.Writes {
			if err := validateWritePattern(w); err != nil {
				bad("%s: %v", label, err)
			}
		}
		for _, e := range r.Endpoints {
			if err := validateGlob("endpoint", e); err != nil {
				bad("%s: %v", label, err)
			}
		}
		methods := make([]string, 0, len(r.Methods))
		for _, m := range r.Methods {
			if !methodPattern.MatchString(m) {
				bad("%s: method %q: not an HTTP method", label, m)
			}
			methods = append(methods, strings.ToUpper(m))
		}
		cr := compiledRule{Rule: r, label: label}
		cr.Actors, cr.Hosts, cr.Commands, cr.Endpoints = slices.Clone(r.Actors), slices.Clone(r.Hosts), slices.Clone(r.Commands), slices.Clone(r.Endpoints)
		cr.Writes, cr.Methods, cr.Accounts = slices.Clone(r.Writes), methods, slices.Clone(r.Accounts)
		for _, acc := range r.Accounts {
			if !hostproto.ValidAccountName(acc) {
				bad("%s: account %q: want a user name of 1-64 of [A-Za-z0-9_.-] (not starting with '-'), as in a hostagent's allowed_accounts", label, acc)
			}
		}
		switch {
		case cr.forAccounts() && (r.Decision != DecisionAllow || r.Class != "" || cr.forCommands() || cr.forWrites() || cr.forEndpoints()):
			bad("%s: a rule with accounts grants them and does nothing else: set decision = \"allow\", actors and hosts only (put class, commands, writes, endpoints and methods in another rule)", label)
		case (cr.forCommands() || cr.forWrites()) && cr.forEndpoints():
			bad("%s: commands or writes (ssh_exec) and endpoints/methods (http_request) are exclusive", label)
		case cr.forCommands() && cr.forWrites():
			bad("%s: commands and writes are exclusive: a writes rule matches the files any command writes", label)
		}
		p.rules = append(p.rules, cr)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// Actor returns the actor configured under name.
func (p *Policy) Actor(name string) (Actor, bool) {
	i, ok := p.byName[name]
	if !ok {
		return Actor{}, false
	}
	return p.actors[i], true
}

// LocalActor returns the first local actor (in config order) whose conditions hold for
// the peer: its uid if set, and its exe if set (exact path).
func (p *Policy) LocalActor(uid int, exe string) (Actor, bool) {
	for _, a := range p.actors {
		if !a.Local() || (a.UID != nil && *a.UID != uid) || (a.Exe != "" && a.Exe != exe) {
			continue
		}
		return a, true
	}
	return Actor{}, false
}
