package etcdjournal

import (
	"encoding/json"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/postern-dev/postern/markers"
)

// Taking turns at the chain head. Every chain transaction compares the head's mod_revision,
// so a transaction sent before the previous one's commit was known loses the head: of the
// replicas that send within one transaction time of each other, one commits and the others'
// transactions are raft commits that wrote nothing, and their retries collide again. So the
// replicas writing the chain take turns in the order of their names: each puts the turn key
// with its name in its chain transactions, every replica watches it, and a replica sends
// its next transaction when the last turn was its predecessor's — or, if the replicas
// between that turn's writer and it have nothing to write, one slot (about one transaction
// time) after the last turn per replica in between. Its writers queue meanwhile, and its
// transaction carries them all (group commit). A replica that writes alone never waits.
// The turns are only a schedule: the head's compare still decides every transaction, so a
// schedule that is wrong (a watch that fell behind, a replica that stopped) costs lost
// heads or a slot's wait, never the chain.

// turnWindow is how many recent turns name the replicas that take turns.
const turnWindow = 16

// maxSlot bounds a slot whatever the measured transaction time.
const maxSlot = 50 * time.Millisecond

// turn is one chain transaction that committed: its revision, its replica and the head it
// left.
type turn struct {
	rev    int64
	writer string
	head   markers.ChainPos
	at     time.Time // when this replica learnt of it
}

// turnValue is the turn key's value.
type turnValue struct {
	Writer string           `json:"writer"`
	Head   markers.ChainPos `json:"head"`
}

func (j *Journal) turnKey() string { return j.prefix + "Cturn" }

// watchTurns records the turns of every replica until Close.
func (j *Journal) watchTurns() {
	j.watchKVs(j.ctx, j.turnKey(), func(kv *mvccpb.KeyValue) {
		var v turnValue
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			j.log.Warn("ignoring a malformed turn", "err", err)
			return
		}
		j.tmu.Lock()
		defer j.tmu.Unlock()
		if len(j.turns) == turnWindow {
			j.turns = append(j.turns[:0], j.turns[1:]...)
		}
		j.turns = append(j.turns, turn{rev: kv.ModRevision, writer: v.Writer, head: v.Head, at: time.Now()})
		close(j.turned)
		j.turned = make(chan struct{})
	})
}

// committedTurn notes this replica's commit at rev, after a transaction that took took.
// A slot is twice the transaction time (smoothed): a shorter one, on a busy machine, let the
// replicas cut in on turns still in flight. Called by the commit leader.
func (j *Journal) committedTurn(rev int64, took time.Duration) {
	j.ownRev, j.ownAt = rev, time.Now()
	if j.slot == 0 {
		j.slot = 2 * took
	}
	j.slot = min((3*j.slot+2*took)/4, maxSlot)
}

// awaitTurn waits until this replica's turn at the head (see above) if it lost the head
// within the last contendedFor, or until Close; then, for a group with writes, it takes the
// head from the last turn if that is newer than the one this replica knows (its transaction
// would lose to it otherwise; a periodic seal seals only what this replica knows, as
// before). Called by the commit leader before each chain transaction.
func (j *Journal) awaitTurn(group []*request) {
	if !slices.ContainsFunc(group, func(r *request) bool { return r.w != nil }) {
		return
	}
	if time.Since(j.lostAt) < contendedFor {
		j.waitTurn()
	}
	j.tmu.Lock()
	defer j.tmu.Unlock()
	if n := len(j.turns); n > 0 && j.turns[n-1].rev > j.headRev {
		t := j.turns[n-1]
		j.head, j.headRev = t.head, t.rev
		j.headSeq.Store(t.head.Seq)
	}
}

// contendedFor is how long after losing the head a replica takes turns: a replica that never
// loses it (one writing alone, or calls that follow each other) never waits.
const contendedFor = time.Second

func (j *Journal) waitTurn() {
	start := time.Now()
	for {
		j.tmu.Lock()
		now := time.Now()
		slots, at := turnSlots(j.turns, turn{rev: j.ownRev, writer: j.name, at: j.ownAt}, j.headRev, now.Add(-activeSlots*j.slot))
		turned := j.turned
		j.tmu.Unlock()
		if slots == 0 {
			return
		}
		if at.IsZero() {
			at = start // the watch does not show the head yet: wait a slot for it
		}
		wait := at.Add(time.Duration(slots) * j.slot).Sub(now)
		if wait <= 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-turned:
			t.Stop()
			continue
		case <-t.C:
		case <-j.ctx.Done():
			t.Stop()
		}
		return
	}
}

// activeSlots: a replica whose last turn is older than this many slots has nothing to write
// at the moment, and is not waited for.
const activeSlots = 4

// turnSlots is how many slots after the last turn (at) it is self's turn: 0 when it is.
// turns are the recent turns (ascending), own is self's last commit (which the turns may not
// show yet: the watch lags the commits) and headRev the head as self knows it; a head self
// did not write and the turns do not show yet is one slot after now (at is zero). The
// replicas that take turns are those with a turn after cut.
func turnSlots(turns []turn, own turn, headRev int64, cut time.Time) (slots int, at time.Time) {
	last := own
	if n := len(turns); n > 0 && turns[n-1].rev > own.rev {
		last = turns[n-1]
	}
	if headRev > last.rev {
		return 1, time.Time{}
	}
	order := []string{own.writer}
	for _, t := range turns {
		if t.at.After(cut) && !slices.Contains(order, t.writer) {
			order = append(order, t.writer)
		}
	}
	if len(order) == 1 {
		return 0, last.at
	}
	slices.Sort(order)
	from, to := slices.Index(order, last.writer), slices.Index(order, own.writer)
	if from < 0 { // the last writer stopped taking turns: count from its successor
		return 0, last.at
	}
	d := (to - from + len(order)) % len(order)
	if d == 0 {
		d = len(order) // self wrote last: after everyone else
	}
	return d - 1, last.at
}
