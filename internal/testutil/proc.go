package testutil

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// roleEnv names the role a re-executed test binary plays (see Reexec and Role).
const roleEnv = "POSTERN_TEST_ROLE"

// Reexec returns a command that runs the current test binary again in role; the package's
// TestMain checks Role() and runs that role instead of the tests. Extra env is KEY=VALUE.
func Reexec(t testing.TB, role string, env ...string) *exec.Cmd {
	t.Helper()
	cmd, err := ReexecCommand(role, env...)
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

// ReexecCommand is Reexec for callers without a testing.TB (goroutines of a load test).
func ReexecCommand(role string, env ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), roleEnv+"="+role), env...)
	return cmd, nil
}

// Role is the role this process was re-executed in, or "" for a normal test run.
func Role() string { return os.Getenv(roleEnv) }

// Seed returns the seed for a randomized test: POSTERN_SEED if set (to replay a failure),
// else a fresh one. It logs the seed so every failure can be replayed.
func Seed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("POSTERN_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("POSTERN_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with POSTERN_SEED=%d)", seed, seed)
	return seed
}

// Rand returns a generator seeded with Seed(t).
func Rand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := Seed(t)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
