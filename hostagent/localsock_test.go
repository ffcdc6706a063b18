package hostagent

import "testing"

// TestConnLimiter plays connect/disconnect sequences against small limits: 6 connections, 2
// kept for operators, 2 per other account.
func TestConnLimiter(t *testing.T) {
	limits := LocalLimits{MaxConns: 6, OperatorConns: 2, MaxConnsPerUID: 2}
	type step struct {
		uid      uint32
		operator bool
		release  bool // give one of uid's slots back instead of taking one
		wantOK   bool
	}
	const root, alice, bob, carol, dave = 0, 1001, 1002, 1003, 1004
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "an account gets its share and no more", steps: []step{
			{uid: alice, wantOK: true}, {uid: alice, wantOK: true}, {uid: alice, wantOK: false},
			{uid: bob, wantOK: true},
		}},
		{name: "a released slot can be taken again", steps: []step{
			{uid: alice, wantOK: true}, {uid: alice, wantOK: true},
			{uid: alice, release: true}, {uid: alice, wantOK: true}, {uid: alice, wantOK: false},
		}},
		{name: "other accounts cannot take the operators' slots", steps: []step{
			{uid: alice, wantOK: true}, {uid: alice, wantOK: true},
			{uid: bob, wantOK: true}, {uid: bob, wantOK: true},
			{uid: carol, wantOK: false}, // 4 others = 6 - 2 kept
			{uid: root, operator: true, wantOK: true}, {uid: root, operator: true, wantOK: true},
			{uid: root, operator: true, wantOK: false}, // all 6 taken
		}},
		{name: "operators may use every slot", steps: []step{
			{uid: root, operator: true, wantOK: true}, {uid: root, operator: true, wantOK: true},
			{uid: root, operator: true, wantOK: true}, {uid: root, operator: true, wantOK: true},
			{uid: root, operator: true, wantOK: true}, {uid: root, operator: true, wantOK: true},
			{uid: alice, wantOK: false}, {uid: root, operator: true, wantOK: false},
			{uid: root, operator: true, release: true}, {uid: alice, wantOK: true},
		}},
		{name: "operators' connections do not count against the others' share", steps: []step{
			{uid: root, operator: true, wantOK: true}, {uid: root, operator: true, wantOK: true},
			{uid: alice, wantOK: true}, {uid: alice, wantOK: true},
			{uid: bob, wantOK: true}, {uid: bob, wantOK: true},
			{uid: dave, wantOK: false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newConnLimiter(limits)
			for i, s := range tt.steps {
				if s.release {
					l.release(s.uid, s.operator)
					continue
				}
				err := l.acquire(s.uid, s.operator)
				if (err == nil) != s.wantOK {
					t.Fatalf("step %d: acquire(uid %d, operator %v) = %v; want ok %v", i, s.uid, s.operator, err, s.wantOK)
				}
			}
		})
	}
}
