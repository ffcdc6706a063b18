package bastion

import "time"

// Action classes (DESIGN.md, "Action classes"). Each has its own attach window — how long a
// retry of the same intent joins the prior execution — and its own retention.
const (
	ClassReadOnly         = "read_only"
	ClassIdempotentWrite  = "idempotent_write"
	ClassConditionalWrite = "conditional_write"
	ClassIrreversible     = "irreversible"
	ClassRemoteCommand    = "remote_command"
)

const day = 24 * time.Hour

var builtinClasses = []ClassConfig{
	{Name: ClassReadOnly, AttachWindow: 5 * time.Minute, Retention: 7 * day},
	{Name: ClassIdempotentWrite, AttachWindow: time.Hour, Retention: 30 * day},
	{Name: ClassConditionalWrite, AttachWindow: time.Hour, Retention: 30 * day},
	{Name: ClassIrreversible, AttachWindow: 7 * day, Retention: 90 * day},
	{Name: ClassRemoteCommand, AttachWindow: day, Retention: 30 * day},
}

// classes holds each action class's windows.
type classes struct {
	byName map[string]ClassConfig
}

func newClasses(cfg Config) *classes {
	c := &classes{byName: map[string]ClassConfig{}}
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

// get returns a class by name; unknown names (records from an older config) get the
// remote_command windows.
func (c *classes) get(name string) ClassConfig {
	if cl, ok := c.byName[name]; ok {
		return cl
	}
	cl := c.byName[ClassRemoteCommand]
	cl.Name = name
	return cl
}

// retention is the per-class retention the journal's GC applies.
func (c *classes) retention() map[string]time.Duration {
	m := make(map[string]time.Duration, len(c.byName))
	for name, cl := range c.byName {
		m[name] = cl.Retention
	}
	return m
}
