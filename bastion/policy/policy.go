package policy

import "errors"

// Tools the ladder knows the targets of.
const (
	ToolSSHExec     = "ssh_exec"
	ToolHTTPRequest = "http_request"
)

// Built-in action classes (DESIGN.md, "Action classes"), strictest first.
const (
	ClassIrreversible     = "irreversible"
	ClassConditionalWrite = "conditional_write"
	ClassIdempotentWrite  = "idempotent_write"
	ClassRemoteCommand    = "remote_command"
	ClassReadOnly         = "read_only"
)

// Rule decisions.
const (
	DecisionDeny    = "deny"
	DecisionApprove = "approve"
)

// Actor is a caller the operator configured: remote by token hash, or local by process
// (uid and/or exe). Exactly one of the two identities is set.
type Actor struct {
	Name          string   `toml:"name"`
	TokenSHA256   string   `toml:"token_sha256"`   // remote actors: hex SHA-256 of the bearer token
	UID           *int     `toml:"uid"`            // local actors: match the peer uid ...
	Exe           string   `toml:"exe"`            // ... and/or the agent process's executable path (exact)
	Hosts         []string `toml:"hosts"`          // globs over host names and "group:<glob>"; empty = all hosts
	Tools         []string `toml:"tools"`          // tool names; empty = all tools
	Endpoints     []string `toml:"endpoints"`      // http endpoint names (globs); empty = all
	MaxConcurrent int      `toml:"max_concurrent"` // executions in flight at once; 0 = unlimited (enforced by the bastion)
	DailyQuota    int      `toml:"daily_quota"`    // executions accepted per UTC day; 0 = unlimited (enforced by the bastion)
}

// Local reports whether the actor is matched by process rather than by token.
func (a Actor) Local() bool { return a.TokenSHA256 == "" }

// Rule maps (actors?, hosts/groups, command patterns | endpoint + methods) to a class, a
// deny, or an approval requirement.
type Rule struct {
	Name      string   `toml:"name"`      // for explanations; default "rules[i]"
	Class     string   `toml:"class"`     // action class when it matches ("" = keep what other rules or the default say)
	Decision  string   `toml:"decision"`  // "" | "deny" | "approve"
	Actors    []string `toml:"actors"`    // actor names; empty = all
	Hosts     []string `toml:"hosts"`     // host-name globs or "group:<glob>"; empty = all
	Commands  []string `toml:"commands"`  // argv patterns (see MatchArgv); empty = all commands
	Endpoints []string `toml:"endpoints"` // http endpoint names (globs); empty = all
	Methods   []string `toml:"methods"`   // http methods (case-insensitive); empty = all
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
	// http_request: the endpoint name, the method, the path and the endpoint's configured class.
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
	CodeNotAllowed    = "not_allowed"    // the actor may not use this tool, host or endpoint
	CodeDenied        = "denied"         // a deny rule matched a command of the request
	CodeUnparsable    = "unparsable"     // the command is not plain literal words and a deny rule could apply
)

// Decision is the ladder's answer with its explanation.
type Decision struct {
	Outcome Outcome
	Class   string   // the action class that applies ("" when rejected before rules were looked at)
	Rule    string   // the rule (or actor limit) that decided, e.g. `rules[2] "no-prod-drops"`
	Steps   []string // the ladder as walked, one line per step
	Code    string   // rejections only
}

// ErrInvalid wraps every validation problem New reports.
var ErrInvalid = errors.New("invalid policy")

// Policy is a validated, immutable set of actors and rules; safe for concurrent use.
type Policy struct {
	actors  []Actor
	byName  map[string]int
	rules   []compiledRule
	classes map[string]int // class name → strictness rank (higher = stricter)
}

type compiledRule struct{ Rule }

// New validates actors and rules and compiles them. knownClasses are the class names rules
// may use besides the built-in ones. Every problem is reported (errors.Join), each wrapping
// ErrInvalid.
func New(actors []Actor, rules []Rule, knownClasses []string) (*Policy, error) {
	return &Policy{}, nil // TODO
}

// Decide walks the ladder for r. Pure: no I/O, no clock.
func (p *Policy) Decide(r Request) Decision {
	return Decision{Outcome: Rejected, Code: CodeActorUnknown} // TODO
}

// Actor returns the actor configured under name.
func (p *Policy) Actor(name string) (Actor, bool) {
	i, ok := p.byName[name]
	if !ok {
		return Actor{}, false
	}
	return p.actors[i], true
}

// LocalActor returns the first local actor (in config order) whose uid and exe conditions
// (each only if set) hold for the peer.
func (p *Policy) LocalActor(uid int, exe string) (Actor, bool) {
	return Actor{}, false // TODO
}

// ParseCommand parses command as a shell script and returns every simple command's argv
// with its words' literal values. safe is false when anything in the script is not a plain
// literal word or it does not parse; argvs are then partial and must not be trusted.
func ParseCommand(command string) (argvs [][]string, safe bool) {
	return nil, false // TODO
}

// MatchArgv reports whether argv matches pattern: space-separated word globs ('*' any run
// within one word, '?' one character), the last word may be "**" (any remaining arguments,
// zero or more).
func MatchArgv(pattern string, argv []string) bool {
	return false // TODO
}
