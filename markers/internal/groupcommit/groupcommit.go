// Package groupcommit lets concurrent journal writers share one durable commit without a
// committer goroutine; both journal backends (Pebble and etcd) commit through it.
//
// A writer that finds no commit in progress becomes the leader: it takes the queued requests
// (its own first) and commits them as one group. Writers that arrive meanwhile queue up; when
// the leader is done it hands leadership to the first of them, which commits what queued. A
// lone writer thus commits on its own goroutine with no hand-off (a wake-up costs as much as
// a fast fsync on an idle VM), and under load one commit serves many writers.
package groupcommit

import (
	"errors"
	"sync"
)

// errLead is the answer that makes a queued request's goroutine the next leader.
var errLead = errors.New("groupcommit: lead the next commit")

// Waiter is embedded in every request type a Queue carries: the leader answers the request
// through it.
type Waiter struct{ done chan error }

// Answer answers the request: nil once it is durable, else why it is not. A request is
// answered exactly once.
func (w *Waiter) Answer(err error) { w.done <- err }

func (w *Waiter) waiter() *Waiter { return w }

// Request is a pointer to a request type that embeds Waiter.
type Request interface{ waiter() *Waiter }

// Queue is one journal's group-commit queue. Its zero value is not usable; see New.
type Queue[R Request] struct {
	commit func(group []R)
	fit    func(group, pending []R) int

	mu      sync.Mutex // guards pending and leading
	pending []R
	leading bool
}

// New returns a queue whose leader calls commit with each group; commit answers every
// request of the group. fit says how many of the pending requests (a prefix) fit one commit
// with group, for a backend whose commits are bounded (etcd's transactions); nil takes them
// all.
func New[R Request](commit func(group []R), fit func(group, pending []R) int) *Queue[R] {
	return &Queue[R]{commit: commit, fit: fit}
}

// Commit queues req and returns its answer, leading commits meanwhile if its turn comes. The
// answer is waited for even if the caller's context ends: returning early would let a
// caller act as if a write that then lands had not happened.
func (q *Queue[R]) Commit(req R) error {
	w := req.waiter()
	w.done = make(chan error, 1)
	q.mu.Lock()
	q.pending = append(q.pending, req)
	if q.leading {
		q.mu.Unlock()
		if err := <-w.done; err != errLead {
			return err
		}
		q.mu.Lock()
	}
	q.leading = true
	group := q.takeLocked(1 + q.fits(q.pending[:1], q.pending[1:]))
	q.mu.Unlock()

	q.commit(group)

	q.mu.Lock()
	if len(q.pending) > 0 {
		q.pending[0].waiter().Answer(errLead)
	} else {
		q.leading = false
	}
	q.mu.Unlock()
	return <-w.done
}

// More takes the queued requests that fit one commit with group: a leader that must commit
// group again (etcd's head moved) carries what queued meanwhile.
func (q *Queue[R]) More(group []R) []R {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.takeLocked(q.fits(group, q.pending))
}

func (q *Queue[R]) fits(group, pending []R) int {
	if q.fit == nil {
		return len(pending)
	}
	return q.fit(group, pending)
}

// takeLocked removes the first n pending requests and returns them.
func (q *Queue[R]) takeLocked(n int) []R {
	taken := q.pending[:n:n]
	q.pending = append([]R(nil), q.pending[n:]...)
	return taken
}
