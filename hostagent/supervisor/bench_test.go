package supervisor

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
)

// BenchmarkStartWait measures one execution of `true` through the long-lived supervisor and
// through a per-command supervisor (the previous release's way) against running the same shell
// command directly, so the supervisor's overhead is known.
func BenchmarkStartWait(b *testing.B) {
	b.Run("supervisor", func(b *testing.B) {
		sup := testSupervisor(b)
		root := b.TempDir()
		ctx := context.Background()
		i := 0
		for b.Loop() {
			i++
			h, err := sup.Start(ctx, filepath.Join(root, fmt.Sprint(i)), testSpec("true"))
			if err != nil {
				b.Fatalf("Start = %v", err)
			}
			st, err := h.Wait(ctx)
			if err != nil || st.ExitCode != 0 {
				b.Fatalf("Wait = %+v, %v", st, err)
			}
		}
	})
	b.Run("per-command supervisor", func(b *testing.B) {
		exe := testExe(b)
		root := b.TempDir()
		ctx := context.Background()
		i := 0
		for b.Loop() {
			i++
			h, err := startPerCommand(ctx, exe, filepath.Join(root, fmt.Sprint(i)), testSpec("true"))
			if err != nil {
				b.Fatalf("Start = %v", err)
			}
			st, err := h.Wait(ctx)
			if err != nil || st.ExitCode != 0 {
				b.Fatalf("Wait = %+v, %v", st, err)
			}
		}
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("/bin/sh", "-c", "true").Run(); err != nil {
				b.Fatalf("run: %v", err)
			}
		}
	})
}
