package groupcommit

import (
	"errors"
	"reflect"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
)

type request struct {
	Waiter
	n    int
	fail error
}

// recorder commits groups by answering each request with its fail, and remembers the groups;
// until release is closed the first commit blocks (so that writers queue behind it).
type recorder struct {
	release chan struct{}
	mu      sync.Mutex
	groups  [][]int
}

func (r *recorder) commit(group []*request) {
	if r.release != nil {
		<-r.release
	}
	r.mu.Lock()
	ns := []int{}
	for _, req := range group {
		ns = append(ns, req.n)
	}
	r.groups = append(r.groups, ns)
	r.mu.Unlock()
	for _, req := range group {
		req.Answer(req.fail)
	}
}

func TestLoneWriterCommitsAlone(t *testing.T) {
	var rec recorder
	q := New(rec.commit, nil)
	errBad := errors.New("bad")
	if err := q.Commit(&request{n: 1}); err != nil {
		t.Fatalf("got = %v; want nil", err)
	}
	if err := q.Commit(&request{n: 2, fail: errBad}); !errors.Is(err, errBad) {
		t.Fatalf("got = %v; want %v", err, errBad)
	}
	if got := len(rec.groups); got != 2 {
		t.Fatalf("got %d groups = %v; want 2 of one", got, rec.groups)
	}
}

// queueBehindLeader has writer 0 lead a commit that blocks, queues writers 1..n behind it,
// releases the leader and returns each writer's answer.
func queueBehindLeader(t *testing.T, n int, fit func(group, pending []*request) int) (*recorder, []error) {
	t.Helper()
	rec := &recorder{release: make(chan struct{})}
	q := New(rec.commit, fit)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	commit := func(i int) {
		wg.Go(func() {
			req := &request{n: i}
			if i%3 == 2 {
				req.fail = errors.New("refused")
			}
			errs[i] = q.Commit(req)
		})
	}
	commit(0)
	synctest.Wait() // the leader's commit is blocked
	for i := 1; i <= n; i++ {
		commit(i)
		synctest.Wait() // queued in order
	}
	close(rec.release)
	wg.Wait()
	return rec, errs
}

func TestQueuedWritersShareACommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec, errs := queueBehindLeader(t, 5, nil)
		want := [][]int{{0}, {1, 2, 3, 4, 5}}
		if !reflect.DeepEqual(rec.groups, want) {
			t.Errorf("groups = %v; want %v", rec.groups, want)
		}
		checkAnswers(t, errs)
	})
}

func TestFitBoundsEachCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pairs := func(group, pending []*request) int { return min(2-len(group), len(pending)) }
		rec, errs := queueBehindLeader(t, 5, pairs)
		want := [][]int{{0}, {1, 2}, {3, 4}, {5}}
		if !reflect.DeepEqual(rec.groups, want) {
			t.Errorf("groups = %v; want %v", rec.groups, want)
		}
		checkAnswers(t, errs)
	})
}

func TestMoreTakesWhatQueuedMeanwhile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var q *Queue[*request]
		var retried []int
		q = New(func(group []*request) {
			if group[0].n == 0 {
				<-release
				group = append(group, q.More(group)...)
				for _, r := range group {
					retried = append(retried, r.n)
				}
			}
			for _, r := range group {
				r.Answer(nil)
			}
		}, nil)
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() { q.Commit(&request{n: i}) })
			synctest.Wait()
		}
		close(release)
		wg.Wait()
		if want := []int{0, 1, 2}; !slices.Equal(retried, want) {
			t.Errorf("retried group = %v; want %v", retried, want)
		}
	})
}

func checkAnswers(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if wantErr := i%3 == 2; (err != nil) != wantErr {
			t.Errorf("writer %d: got = %v; want an error: %v", i, err, wantErr)
		}
	}
}
