package etcdjournal

import (
	"testing"
	"time"
)

func TestTurnSlots(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	cut := at(0) // turns at or before it are of replicas with nothing to write
	for _, c := range []struct {
		name    string
		turns   []turn
		own     turn
		headRev int64
		slots   int
		at      time.Time
	}{
		{name: "first write", own: turn{writer: "b"}},
		{name: "alone", turns: []turn{{rev: 5, writer: "b", at: at(1)}}, own: turn{rev: 5, writer: "b", at: at(1)}, at: at(1)},
		{name: "predecessor wrote last",
			turns: []turn{{rev: 5, writer: "c", at: at(1)}, {rev: 6, writer: "a", at: at(2)}},
			own:   turn{rev: 4, writer: "b", at: at(1)}, headRev: 4, at: at(2)},
		{name: "one between",
			turns: []turn{{rev: 4, writer: "a", at: at(1)}, {rev: 5, writer: "b", at: at(1)}, {rev: 6, writer: "c", at: at(2)}},
			own:   turn{rev: 5, writer: "b", at: at(1)}, headRev: 5, slots: 1, at: at(2)},
		{name: "wrote last: after both others",
			turns: []turn{{rev: 5, writer: "c", at: at(1)}, {rev: 6, writer: "a", at: at(2)}, {rev: 7, writer: "b", at: at(3)}},
			own:   turn{rev: 7, writer: "b", at: at(3)}, headRev: 7, slots: 2, at: at(3)},
		{name: "own commit the watch does not show yet",
			turns: []turn{{rev: 5, writer: "c", at: at(1)}, {rev: 6, writer: "a", at: at(2)}},
			own:   turn{rev: 7, writer: "b", at: at(3)}, headRev: 7, slots: 2, at: at(3)},
		{name: "a head the watch does not show yet",
			turns: []turn{{rev: 5, writer: "c", at: at(1)}, {rev: 6, writer: "a", at: at(2)}},
			own:   turn{rev: 4, writer: "b", at: at(1)}, headRev: 8, slots: 1},
		{name: "an idle replica is not waited for",
			turns: []turn{{rev: 5, writer: "a", at: at(-5)}, {rev: 6, writer: "c", at: at(2)}},
			own:   turn{rev: 7, writer: "b", at: at(3)}, headRev: 7, slots: 1, at: at(3)},
		{name: "all others idle",
			turns: []turn{{rev: 5, writer: "a", at: at(-5)}, {rev: 6, writer: "c", at: at(-2)}},
			own:   turn{rev: 7, writer: "b", at: at(3)}, headRev: 7, at: at(3)},
		{name: "last writer idle",
			turns: []turn{{rev: 5, writer: "a", at: at(1)}, {rev: 6, writer: "c", at: at(-2)}},
			own:   turn{rev: 4, writer: "b", at: at(-3)}, headRev: 6, at: at(-2)},
	} {
		t.Run(c.name, func(t *testing.T) {
			slots, got := turnSlots(c.turns, c.own, c.headRev, cut)
			if slots != c.slots || !got.Equal(c.at) {
				t.Fatalf("turnSlots = %d slots after %v; want %d after %v", slots, got, c.slots, c.at)
			}
		})
	}
}
