// Package markers owns Postern's durable execution records and their two state machines: every
// hostagent's markers are a markers.Store on Pebble, and the bastion's journal is a
// JournalStore — the same Store on Pebble for one bastion, or markers/etcdjournal for
// replicas — written record for record the same way (plan.go, layout.go).
//
// # Invariants
//
//   - Every write (create, transition, update) is one Pebble batch committed with a sync write;
//     a method returns only once its batch is durable. A failed commit fails closed: the error is
//     returned and the store refuses all further writes (ErrBroken), so no caller proceeds on a
//     record that may not exist. The one exception is asked for per write (UpdateWith, NoSync):
//     it returns before its fsync, and a crash can lose it only together with every later
//     write, so the store and the chain stay a consistent prefix.
//   - A record's state only moves along the edges of its Graph (JournalGraph or HostGraph); an illegal
//     edge is ErrIllegalTransition and changes nothing. Transitions are compare-and-set on the
//     current state.
//   - Create is create-if-absent on the execution id, race-free: writers of one id are
//     serialized by a per-id lock held until their batch is durable.
//   - Every write appends one event to a hash-chained log (prev_hash, this_hash) in the same
//     batch as the record and its secondary indexes, so the chain has no gaps after a crash.
//     Writers hand their batches to a group commit (internal/groupcommit): a writer that finds
//     no commit in progress leads one — it assigns sequence numbers and commits every queued
//     writer's batch together, on its own goroutine — so chain order is commit order and many
//     writers share one fsync.
//   - Checkpoints of (origin, size, head hash) are signed with an Ed25519 audit key in the
//     golang.org/x/mod/sumdb/note format; VerifyJSONL and VerifyDir check chain and signatures
//     offline.
//
// # Reading what may not be durable yet
//
// Pebble makes a synced write visible to readers before its fsync has returned (pebble issue
// #2163). A reader that saw such a record could act on a write that a crash then erases, e.g.
// answer "already started" for a command that never will. Every read that returns a record
// therefore takes that record's per-id lock first: the lock is held by the writer until its
// batch is durable, so a record returned by Get, the Find methods or List is always durable
// (save what a NoSync write changed, which its caller has declared harmless to lose).
//
// Decoded records are cached (bounded, most recently used) and the cache is kept under the
// same per-id lock, so a write does not decode the record it changes; callers always get
// their own copy.
package markers
