package procfs

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// statTail is what follows the ppid in a stat line (pgid 9), up to and past field 22 (start
// time 777).
const statTail = " 9 1 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 777 1000 100"

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    Stat
		wantErr bool
	}{
		{name: "plain", stat: "12 (bash) S 5" + statTail, want: Stat{State: 'S', PPID: 5, PGID: 9, StartTime: 777}},
		{name: "comm with spaces and parens", stat: "12 (a) b (c)) R 6" + statTail, want: Stat{State: 'R', PPID: 6, PGID: 9, StartTime: 777}},
		{name: "comm that looks like fields", stat: "12 (x) S 1 2 3) Z 7" + statTail, want: Stat{State: 'Z', PPID: 7, PGID: 9, StartTime: 777}},
		{name: "the kernel's own", stat: "2 (kthreadd) S 0" + statTail, want: Stat{State: 'S', PPID: 0, PGID: 9, StartTime: 777}},
		{name: "no comm", stat: "12 bash S 5" + statTail, wantErr: true},
		{name: "a ) without (", stat: "12 bash) S 5" + statTail, wantErr: true},
		{name: "truncated", stat: "12 (bash) S 5 1 1", wantErr: true},
		{name: "state of two letters", stat: "12 (bash) SS 5" + statTail, wantErr: true},
		{name: "negative ppid", stat: "12 (bash) S -5" + statTail, wantErr: true},
		{name: "non-numeric start", stat: "12 (bash) S 5 1 1 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 x", wantErr: true},
		{name: "empty", stat: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseStat([]byte(tt.stat))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseStat = %+v, %v; want %+v, error: %v", got, err, tt.want, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrBadStat) {
				t.Errorf("error %v does not wrap ErrBadStat", err)
			}
		})
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("12 (bash) S 5" + statTail))
	f.Add([]byte("12 (a) b (c)) R 6" + statTail))
	f.Add([]byte("1 ()) S 0"))
	f.Add([]byte("7 (x)"))
	if self, err := os.ReadFile("/proc/self/stat"); err == nil {
		f.Add(self)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseStat(data)
		if err != nil {
			if got != (Stat{}) {
				t.Fatalf("error %v with non-zero result %+v", err, got)
			}
			return
		}
		// Whatever comm holds, the fields come from after the last ')'.
		end := strings.LastIndexByte(string(data), ')')
		fields := strings.Fields(string(data[end+1:]))
		if len(fields[0]) != 1 || fields[0][0] != got.State {
			t.Fatalf("state %q does not come from field 3 %q", got.State, fields[0])
		}
		if n, err := strconv.Atoi(fields[1]); err != nil || n != got.PPID || n < 0 {
			t.Fatalf("ppid %d does not come from field 4 %q", got.PPID, fields[1])
		}
		if n, err := strconv.Atoi(fields[2]); err != nil || n != got.PGID || n < 0 {
			t.Fatalf("pgid %d does not come from field 5 %q", got.PGID, fields[2])
		}
		if n, _ := strconv.ParseUint(fields[19], 10, 64); n != got.StartTime {
			t.Fatalf("start %d does not come from field 22 %q", got.StartTime, fields[19])
		}
	})
}

// TestReadStat reads real processes: this one, and one that is gone.
func TestReadStat(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil || st.PPID != os.Getppid() || st.PGID != syscall.Getpgrp() || st.StartTime == 0 {
		t.Errorf("ReadStat(self) = %+v, %v; want ppid %d, pgid %d and a start time", st, err, os.Getppid(), syscall.Getpgrp())
	}
	if !Running(os.Getpid(), st.StartTime) || Running(os.Getpid(), st.StartTime+1) {
		t.Errorf("Running(self) does not tell this process from another start")
	}
	child := exec.Command("true")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := StartTime(child.Process.Pid); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("StartTime(reaped child) = %v; want fs.ErrNotExist", err)
	}
	if _, err := ReadStat(0); err == nil {
		t.Errorf("ReadStat(0) read something")
	}
}

// TestStartedAt: this process started after boot and before now.
func TestStartedAt(t *testing.T) {
	ticks, err := StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	got := StartedAt(ticks)
	if got.IsZero() || got.After(time.Now()) || time.Since(got) > time.Hour {
		t.Fatalf("StartedAt(%d) = %v; want a moment ago", ticks, got)
	}
	if !StartedAt(0).IsZero() {
		t.Error("StartedAt(0) is not zero")
	}
}
