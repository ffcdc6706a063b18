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
//	f<actor>\0<scope>\0<fingerprint>\0<id>
//	k<actor>\0<idempotency key>\0<id>
//	o<operation key>\0<id>
//	s<state>\0<id>
//	t<created unix nanos:8><id>
//	m<name>                              store metadata (head, base, graph)
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
)

var (
	metaHead  = []byte("mhead")
	metaBase  = []byte("mbase")
	metaGraph = []byte("mgraph")
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

// indexKeys are the secondary index entries of r (the state entry included).
func indexKeys(r *Record) [][]byte {
	keys := [][]byte{stateKey(r.State, r.ID), timeKey(r.CreatedAt, r.ID)}
	if r.Fingerprint != "" {
		keys = append(keys, joinKey(pFinger, r.Actor, r.IntentScope, r.Fingerprint, r.ID))
	}
	if r.IdempotencyKey != "" {
		keys = append(keys, joinKey(pIdemKey, r.Actor, r.IdempotencyKey, r.ID))
	}
	if r.OperationKey != "" {
		keys = append(keys, joinKey(pOpKey, r.OperationKey, r.ID))
	}
	return keys
}

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
