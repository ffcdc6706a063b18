package testutil

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Percentile returns the q-quantile (0 < q < 1) of durations-like samples, e.g. 0.5 for p50.
func Percentile[T ~int64](samples []T, q float64) T {
	s := slices.Clone(samples)
	slices.Sort(s)
	return s[min(int(float64(len(s))*q), len(s)-1)]
}

// ProcStatusKB reads a kB field of /proc/<pid>/status ("VmRSS", "VmHWM", "RssAnon"); pid 0
// means this process.
func ProcStatusKB(pid int, field string) (int, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/status"
	}
	status, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("%s has no %s", path, field)
}
