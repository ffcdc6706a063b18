package config

import "time"

// Action classes (docs/design.md, "Action classes"). Each has its own attach window — how
// long a retry of the same intent joins the prior execution —, its own retention, and its own
// answer to an unknown outcome (bastion/verdict).
const (
	ClassReadOnly         = "read_only"
	ClassIdempotentWrite  = "idempotent_write"
	ClassConditionalWrite = "conditional_write"
	ClassIrreversible     = "irreversible"
	ClassRemoteCommand    = "remote_command"
)

const day = 24 * time.Hour

var builtinClasses = []Class{
	{Name: ClassReadOnly, AttachWindow: 5 * time.Minute, Retention: 7 * day},
	{Name: ClassIdempotentWrite, AttachWindow: time.Hour, Retention: 30 * day},
	{Name: ClassConditionalWrite, AttachWindow: time.Hour, Retention: 30 * day},
	{Name: ClassIrreversible, AttachWindow: 7 * day, Retention: 90 * day},
	{Name: ClassRemoteCommand, AttachWindow: day, Retention: 30 * day},
}

// Classes are the action classes of a config: the built-in ones with the config's
// overrides, and the classes it adds.
type Classes struct {
	byName map[string]Class
}

// ResolveClasses resolves the config's classes.
func (cfg Config) ResolveClasses() *Classes {
	c := &Classes{byName: map[string]Class{}}
	for _, cl := range builtinClasses {
		c.byName[cl.Name] = cl
	}
	for _, cl := range cfg.Classes {
		base := c.byName[cl.Name]
		if cl.AttachWindow == 0 {
			cl.AttachWindow = base.AttachWindow
		}
		if cl.Retention == 0 {
			cl.Retention = base.Retention
		}
		if cl.OperatorApprovalOnly == nil {
			cl.OperatorApprovalOnly = base.OperatorApprovalOnly
		}
		if cl.AttachWindow == 0 {
			cl.AttachWindow = day
		}
		if cl.Retention == 0 {
			cl.Retention = 30 * day
		}
		c.byName[cl.Name] = cl
	}
	return c
}

// Get returns a class by name; unknown names (records from an older config) get the
// remote_command windows.
func (c *Classes) Get(name string) Class {
	if cl, ok := c.byName[name]; ok {
		return cl
	}
	cl := c.byName[ClassRemoteCommand]
	cl.Name = name
	return cl
}

// InBandApproval reports whether the agent's user may decide an approval of class name in
// the client (elicitation), besides operators: only where the config says so
// (operator_approval_only = false). The agent's uid can reach whatever relays that answer,
// so by default every class's approvals stay with operators.
func (c *Classes) InBandApproval(name string) bool {
	cl, ok := c.byName[name]
	return ok && cl.OperatorApprovalOnly != nil && !*cl.OperatorApprovalOnly
}

// Retention is the per-class retention the journal's GC applies.
func (c *Classes) Retention() map[string]time.Duration {
	m := make(map[string]time.Duration, len(c.byName))
	for name, cl := range c.byName {
		m[name] = cl.Retention
	}
	return m
}

// BuiltinClassNames are the names of the classes every config has.
func BuiltinClassNames() []string {
	names := make([]string, len(builtinClasses))
	for i, cl := range builtinClasses {
		names[i] = cl.Name
	}
	return names
}
