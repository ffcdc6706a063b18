// Package bastion is the MCP server agents talk to. It turns every tool call into an
// execution with an identity and carries it across the SSH boundary to a hostagent, journaling
// each lifecycle step before the next boundary is crossed, and answers retries from the
// journal instead of sending again.
//
// Where things are:
//
//	identity.go   canonical action record (RFC 8785) and intent fingerprint (HMAC-SHA256)
//	exec.go       ssh_exec: argument bounds, intent scope, acceptance
//	match.go      the matching rule and recover_or_attach, one pure function for every channel
//	driver.go     one driver per execution: dispatch, outcome, reconciliation with the host
//	outcome.go    what a host's answer means for the journal (pure decisions, testdata/decisions)
//	view.go       what tools return; status, output and delivery
//	ops.go        cancel, list, hosts
//	tools.go      the MCP tools and their replay contracts; delivery tracking
//	delivery.go   when a result counts as delivered (the kernel's evidence that the client has it)
//	cancels.go    notifications/cancelled: matched to calls in flight, revokes recent deliveries
//	server.go     the endpoints: Streamable HTTP, the unix socket, the operator socket
//	operator.go   the operator API the `postern` CLI reads
//	pool.go       one SSH connection per host, strict host keys, keepalives, backoff
//	inventory.go  enrolled hosts and enrollment
//	agentless.go  hosts without the hostagent: ssh_exec over a stock sshd, bare or under the
//	              marker script (package agentless), and reading its marker
//	agentless_decide.go  what a stock sshd's answer means, by guarantee level (pure
//	              decisions, testdata/decisions/agentless)
//	classes.go    action classes: windows, retention, what each does with an unknown outcome
//	limits.go     an actor's max_concurrent and quotas, per actor and per run; approved work queues for a slot
//	config.go     the TOML configuration
//	metrics.go    Prometheus series
//
// Invariants: the journal has one owner (this process); a failed journal write stops an
// execution where it is and nothing further is sent; at most one driver acts on an execution
// at a time; nothing is dispatched twice except an execution whose host has no marker for it
// and that is younger than the host's marker retention, under the same execution id (the host
// refuses duplicates); no host answer moves the journal along an edge its graph lacks (one
// table, hostOutcomes); review required is a field of the record; actors see only their own
// executions; secrets never enter records, fingerprints or logs, and what a target sends back
// is redacted of its credential before it is journaled (plugins.Redactor).
package bastion
