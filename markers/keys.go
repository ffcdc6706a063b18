package markers

import (
	"encoding/binary"
	"time"
)

// Key layout. One byte of prefix per family; variable components are NUL-separated (they are
// validated NUL-free), fixed-width numbers are big-endian so byte order is numeric order.
//
//	r<id>                                record
//	e<seq:8>                             event (JSON line as exported)
//	c<seq:8>                             signed checkpoint covering events 1..seq
//	x<id>\0<seq:8>                       events of one execution
//	f<actor>\0<scope>\0<fingerprint>       → id of the newest such execution without a key
//	k<actor>\0<idempotency key>             → id of the newest execution with the key
//	o<operation key>                         → id
//	s<state>\0<id>
//	t<created unix nanos:8><id>
//	b<id>                                stored result of an execution (capped output, response)
//	g<actor>\0<scope>\0<fingerprint>\0<id>  journal: every execution of one intent (siblings)
//	u<actor>\0<scope>                      agent run (JSON Run), first contact
//	w<first seen unix nanos:8><actor>\0<scope> → run key
//	a<actor>\0<created unix nanos:8><id>              journal: executions by actor
//	v<actor>\0<scope>\0<created unix nanos:8><id>     journal: executions by agent run
//	z<expires unix nanos:8><pointer key>  → id: tombstones of removed executions, by expiry
//	m<name>                              store metadata (head, base, graph, index version)
//
// A pointer index entry (f, k) names an execution by its id, or — once retention removed
// that execution — holds its tombstone (JSON, starting with '{'; ids never do).
const (
	pRecord     = 'r'
	pEvent      = 'e'
	pCheckpoint = 'c'
	pExecEvents = 'x'
	pFinger     = 'f'
	pIdemKey    = 'k'
	pOpKey      = 'o'
	pState      = 's'
	pTime       = 't'
	pMeta       = 'm'
	pResult     = 'b'
	pSiblings   = 'g'
	pRun        = 'u'
	pRunTime    = 'w'
	pActor      = 'a'
	pRunExec    = 'v'
	pTombstone  = 'z'
)

var (
	metaHead  = []byte("mhead")
	metaBase  = []byte("mbase")
	metaGraph = []byte("mgraph")
	// metaIndex holds the version of the indexes an older store may lack (the actor and
	// run indexes): built once on open (index.go).
	metaIndex = []byte("mindex")
)

func joinKey(prefix byte, parts ...string) []byte {
	n := 1
	for _, p := range parts {
		n += len(p) + 1
	}
	k := make([]byte, 0, n)
	k = append(k, prefix)
	for i, p := range parts {
		if i > 0 {
			k = append(k, 0)
		}
		k = append(k, p...)
	}
	return k
}

func recordKey(id string) []byte { return joinKey(pRecord, id) }

func resultKey(id string) []byte { return joinKey(pResult, id) }

func seqKey(prefix byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefix}, seq)
}

func execEventKey(id string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(append(joinKey(pExecEvents, id), 0), seq)
}

func timeKey(t time.Time, id string) []byte {
	k := binary.BigEndian.AppendUint64([]byte{pTime}, uint64(t.UnixNano()))
	return append(k, id...)
}

func timePrefix(t time.Time) []byte {
	return binary.BigEndian.AppendUint64([]byte{pTime}, uint64(t.UnixNano()))
}

// actorPrefix and runPrefix start the actor's and the run's index keys; the creation time
// and the id follow.
func actorPrefix(actor string) []byte { return append(joinKey(pActor, actor), 0) }
func runPrefix(actor, scope string) []byte {
	return append(joinKey(pRunExec, actor, scope), 0)
}

func timedKey(prefix []byte, t time.Time, id string) []byte {
	k := binary.BigEndian.AppendUint64(append([]byte(nil), prefix...), uint64(t.UnixNano()))
	return append(k, id...)
}

// indexEntry is one secondary index key and its value.
type indexEntry struct{ key, value []byte }

// indexEntries are the secondary index entries of r. The state, time, actor and run indexes
// are sets (empty values, the id is in the key); the fingerprint, idempotency-key and operation-key
// indexes are point keys whose value is the newest execution's id, so their lookups are one
// Get that bloom filters answer without scanning.
func indexEntries(r *Record) []indexEntry {
	e := []indexEntry{{key: stateKey(r.State, r.ID)}, {key: timeKey(r.CreatedAt, r.ID)}}
	for _, k := range pointerKeys(r) {
		e = append(e, indexEntry{key: k, value: []byte(r.ID)})
	}
	if r.Graph == JournalGraph && r.Fingerprint != "" {
		e = append(e, indexEntry{key: joinKey(pSiblings, r.Actor, r.IntentScope, r.Fingerprint, r.ID)})
	}
	if r.Graph == JournalGraph && r.Actor != "" {
		e = append(e, indexEntry{key: timedKey(actorPrefix(r.Actor), r.CreatedAt, r.ID)},
			indexEntry{key: timedKey(runPrefix(r.Actor, r.IntentScope), r.CreatedAt, r.ID)})
	}
	return e
}

// An execution with an idempotency key is found by its key only: a keyed request is another
// request than an unkeyed one of the same fingerprint, so it must not take the fingerprint
// entry over from the unkeyed execution a retry has to find.
func pointerKeys(r *Record) [][]byte {
	var keys [][]byte
	if r.Fingerprint != "" && r.IdempotencyKey == "" {
		keys = append(keys, fingerprintKey(r.Actor, r.IntentScope, r.Fingerprint))
	}
	if r.IdempotencyKey != "" {
		keys = append(keys, idempotencyKey(KeySpace(r), r.IdempotencyKey))
	}
	if r.OperationKey != "" {
		keys = append(keys, operationKey(r.OperationKey))
	}
	return keys
}

// SharedKeySpace is the idempotency-key space of every execution that names its Principal:
// one space for all principals, so the lookup of a key finds the execution that holds it
// whoever holds it, and the bastion refuses a key another principal holds instead of
// running its request a second time. No actor is called "*" (actors are "token:…" or
// "local:…").
const SharedKeySpace = "*"

// KeySpace is the space r's idempotency key is indexed in (FindByIdempotencyKey's first
// argument finds it there): SharedKeySpace, or for a record made before principals its
// actor's own.
func KeySpace(r *Record) string {
	if r.Principal != "" {
		return SharedKeySpace
	}
	return r.Actor
}

func fingerprintKey(actor, scope, fp string) []byte { return joinKey(pFinger, actor, scope, fp) }
func idempotencyKey(actor, key string) []byte       { return joinKey(pIdemKey, actor, key) }
func operationKey(key string) []byte                { return joinKey(pOpKey, key) }

func stateKey(s State, id string) []byte { return joinKey(pState, string(s), id) }

// prefixEnd is the smallest key greater than every key that starts with p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
