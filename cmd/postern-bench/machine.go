package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// describeMachine is one line naming what the figures depend on: CPU, cores, memory, kernel,
// the filesystem the benchmarks' temp dirs (spools, marker stores, journals) live on — fsync
// cost is most of a marker's — and the Go and OpenSSH versions. Parts it cannot read say so.
func describeMachine(ctx context.Context) string {
	parts := []string{
		cpuModel(),
		fmt.Sprintf("%d cores", runtime.NumCPU()),
		memTotal(),
		"Linux " + firstLine("/proc/sys/kernel/osrelease"),
		"temp dir " + os.TempDir() + " on " + fsType(os.TempDir()),
		commandOutput(ctx, "go", "env", "GOVERSION"),
		commandOutput(ctx, "ssh", "-V"),
	}
	return strings.Join(parts, ", ")
}

// procField is the value of the first "name : value" line of a /proc file.
func procField(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func cpuModel() string {
	if m := procField("/proc/cpuinfo", "model name"); m != "" {
		return m
	}
	return "CPU model unknown"
}

func memTotal() string {
	f := strings.Fields(procField("/proc/meminfo", "MemTotal")) // "24578112 kB"
	if len(f) == 2 && f[1] == "kB" {
		if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
			return fmt.Sprintf("%.1f GiB RAM", kb/(1<<20))
		}
	}
	return "memory unknown"
}

func firstLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(data), "\n")
	return strings.TrimSpace(line)
}

// fsMagic names the filesystems a benchmark machine is likely to have (statfs(2) f_type).
var fsMagic = map[int64]string{
	unix.EXT4_SUPER_MAGIC:      "ext4",
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.OVERLAYFS_SUPER_MAGIC: "overlayfs",
	unix.F2FS_SUPER_MAGIC:      "f2fs",
}

func fsType(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "unknown filesystem"
	}
	if name, ok := fsMagic[int64(st.Type)]; ok {
		return name
	}
	return fmt.Sprintf("filesystem 0x%x", st.Type)
}

// commandOutput is the first line a version command prints (ssh -V prints to stderr).
func commandOutput(ctx context.Context, name string, args ...string) string {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	line, _, _ := strings.Cut(string(bytes.TrimSpace(out)), "\n")
	if err != nil || line == "" {
		return name + " version unknown"
	}
	return line
}
