package hostagent_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/postern-dev/postern/hostproto"
)

// BenchmarkRunRoundTrips is one hostproto.Run of `true` with an environment, on a connection
// of protocol 2 (the environment, then the exec: a round trip each) and of protocol 3 (both
// in one round trip), alternating, so each is the other's same-run baseline. The server and
// client share the process: allocs/op counts both sides.
func BenchmarkRunRoundTrips(b *testing.B) {
	ts := startServer(b, nil)
	c := ts.client(b)
	ctx := context.Background()
	for _, protocol := range []int{2, 3, 2, 3} {
		b.Run(fmt.Sprintf("protocol=%d", protocol), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := hostproto.Run(ctx, c, hostproto.Exec{ExecutionID: validID, Command: "true", Env: map[string]string{"APP_MODE": "bench"}, Protocol: protocol})
				if err != nil || res.ExitStatus != 0 {
					b.Fatalf("Run = %+v, %v", res, err)
				}
			}
		})
	}
}
