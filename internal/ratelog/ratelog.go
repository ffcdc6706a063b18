// Package ratelog bounds the log lines of events that anyone can cause at will — refused
// connections, failed logins — so that a flood of them cannot fill a disk: for each reason,
// at most Burst lines per Interval, then one summary line with the count of those not
// logged. Every event is counted, logged or not.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultBurst    = 10
	DefaultInterval = time.Minute
)

// Options configure a Logger.
type Options struct {
	// Where names the place the events happen ("mcp_socket", "ssh"); every line carries it
	// as the "where" attribute, and Count gets it.
	Where string
	// Burst is how many lines of one reason are logged per Interval. Default DefaultBurst.
	Burst int
	// Interval is the window Burst applies to. Default DefaultInterval.
	Interval time.Duration
	// Count, if set, is called once for every event, logged or not (a metrics counter). It
	// must not block.
	Count func(where, reason string)
}

// Logger logs events by reason within the bounds of its Options. Its methods are safe for
// concurrent use; the zero value is not usable, New makes one.
type Logger struct {
	log  *slog.Logger
	opts Options

	mu      sync.Mutex // guards reasons and closed
	reasons map[string]*window
	closed  bool
}

// window is one reason's current interval.
type window struct {
	start   time.Time // zero: no interval in progress
	gen     uint64    // counts intervals, so a late timer leaves a newer one alone
	logged  int
	dropped int
	total   uint64 // every event of the reason since New
	// level and msg of the latest event, for its summary
	level slog.Level
	msg   string
	// timer logs the summary when the interval ends; armed at its first dropped event.
	timer *time.Timer
}

// New returns a Logger that writes to logger (nil: discard).
func New(logger *slog.Logger, opts Options) *Logger {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.Burst <= 0 {
		opts.Burst = DefaultBurst
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	return &Logger{log: logger, opts: opts, reasons: map[string]*window{}}
}

// Log records one event of reason and logs msg with attrs, unless Burst lines of reason were
// logged in the current interval: then the event is only counted, and the interval's
// summary line says how many were not logged. reason is a short constant chosen by the
// caller (it becomes a metrics label), never a value an outsider sent; attrs may carry
// those, bounded.
func (l *Logger) Log(level slog.Level, reason, msg string, attrs ...any) {
	if l.opts.Count != nil {
		l.opts.Count(l.opts.Where, reason)
	}
	now := time.Now()
	l.mu.Lock()
	w := l.reasons[reason]
	if w == nil {
		w = &window{}
		l.reasons[reason] = w
	}
	w.total++
	w.level, w.msg = level, msg
	if l.closed {
		l.mu.Unlock()
		return
	}
	if w.start.IsZero() || now.Sub(w.start) >= l.opts.Interval {
		if w.dropped > 0 {
			// The timer has not run yet: the previous interval's summary goes first.
			w.timer.Stop()
			l.summaryLocked(reason, w)
		}
		w.start, w.logged = now, 0
		w.gen++
	}
	if w.logged >= l.opts.Burst {
		w.dropped++
		if w.dropped == 1 {
			gen := w.gen
			w.timer = time.AfterFunc(w.start.Add(l.opts.Interval).Sub(now), func() { l.endInterval(reason, w, gen) })
		}
		l.mu.Unlock()
		return
	}
	w.logged++
	l.mu.Unlock()
	l.log.Log(context.Background(), level, msg, append([]any{"where", l.opts.Where, "reason", reason}, attrs...)...)
}

// endInterval logs the summary of w's interval gen, if Log or Close has not already.
func (l *Logger) endInterval(reason string, w *window, gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.gen == gen && w.dropped > 0 && !l.closed {
		l.summaryLocked(reason, w)
		w.start = time.Time{}
	}
}

// summaryLocked logs how many events of w's interval were not logged, and forgets them.
func (l *Logger) summaryLocked(reason string, w *window) {
	l.log.Log(context.Background(), w.level, w.msg, "where", l.opts.Where, "reason", reason,
		"not_logged", w.dropped, "total", w.total, "interval", l.opts.Interval)
	w.dropped = 0
}

// Totals returns how many events of each reason were recorded since New.
func (l *Logger) Totals() map[string]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]uint64, len(l.reasons))
	for reason, w := range l.reasons {
		out[reason] = w.total
	}
	return out
}

// Close logs the summary of every interval in progress, so that a stopping daemon's log
// accounts for every event. Later events are counted but not logged.
func (l *Logger) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	for reason, w := range l.reasons {
		if w.dropped > 0 {
			w.timer.Stop()
			l.summaryLocked(reason, w)
		}
	}
}
