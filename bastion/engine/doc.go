// Package engine turns tool calls into executions and carries each across the dispatch
// boundary to its host or endpoint, journaling every lifecycle step before the next boundary
// is crossed, and answers retries and reads from the journal. The surfaces
// (bastion/mcpserver, bastion/operatorapi) call it through interfaces they declare; the
// decisions it carries out are pure functions of bastion/intent (matching) and
// bastion/verdict (what an answer means).
//
// Invariants: a failed journal write stops an execution where it is and nothing further is
// sent; at most one driver acts on an execution at a time (with replicas, the one that owns
// it); nothing is dispatched twice except an execution whose host has no marker for it and
// that is younger than the host's marker retention, under the same execution id (the host
// refuses duplicates); no host answer moves the journal along an edge its graph lacks;
// review required is a field of the record; actors see only their own executions; secrets
// never enter records, fingerprints or logs, and what a target sends back is redacted of its
// credential before it is journaled (plugins.Redactor).
package engine
