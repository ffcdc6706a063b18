package transport

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// errBadStat reports a /proc/<pid>/stat that does not parse.
var errBadStat = errors.New("malformed /proc stat")

// procStat is what the scope rule needs from /proc/<pid>/stat.
type procStat struct {
	PPID       int
	StartTicks uint64 // field 22: start time after boot, in clock ticks
}

// parseProcStat parses /proc/<pid>/stat. The comm field (2) is in parentheses and may itself
// contain spaces and parentheses, so the fixed fields start after the LAST ')'.
func parseProcStat(data []byte) (procStat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 || bytes.IndexByte(data[:end], '(') < 0 {
		return procStat{}, fmt.Errorf("%w: no (comm)", errBadStat)
	}
	// fields[0] is field 3 (state), so field N is fields[N-3].
	fields := bytes.Fields(data[end+1:])
	const ppidField, startField = 4, 22
	if len(fields) < startField-2 {
		return procStat{}, fmt.Errorf("%w: %d fields after comm", errBadStat, len(fields))
	}
	ppid, err := strconv.Atoi(string(fields[ppidField-3]))
	if err != nil || ppid < 0 {
		return procStat{}, fmt.Errorf("%w: ppid %q", errBadStat, fields[ppidField-3])
	}
	start, err := strconv.ParseUint(string(fields[startField-3]), 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("%w: starttime %q", errBadStat, fields[startField-3])
	}
	return procStat{PPID: ppid, StartTicks: start}, nil
}

// agentProcess is the local agent behind a unix-socket peer.
type agentProcess struct {
	PID   int
	Exe   string
	Scope string // "run:<pid>-<start ticks>"
}

// procFS resolves unix-socket peers to agent processes. root is "/proc" except in tests.
type procFS struct {
	root string
}

// self returns this process's pid (the /proc/self link) and executable, compared by device
// and inode: /proc/<pid>/exe is the running image even if the file at os.Executable's path
// was replaced by an upgrade.
func (p procFS) self() (int, os.FileInfo, error) {
	link, err := os.Readlink(filepath.Join(p.root, "self"))
	if err != nil {
		return 0, nil, fmt.Errorf("transport: own pid: %w", err)
	}
	pid, err := strconv.Atoi(link)
	if err != nil {
		return 0, nil, fmt.Errorf("transport: own pid: /proc/self -> %q", link)
	}
	fi, err := os.Stat(filepath.Join(p.root, link, "exe"))
	if err != nil {
		return 0, nil, fmt.Errorf("transport: own executable: %w", err)
	}
	return pid, fi, nil
}

// resolveAgent applies the local scope rule to a peer pid: the agent is the peer, unless the
// peer is another process running our own executable (the `postern mcp` stdio bridge), in
// which case the agent is the bridge's parent. It fails closed when /proc cannot say which
// case holds.
func (p procFS) resolveAgent(peerPID int) (agentProcess, error) {
	selfPID, selfExe, err := p.self()
	if err != nil {
		return agentProcess{}, err
	}
	peerExe, err := os.Stat(filepath.Join(p.root, strconv.Itoa(peerPID), "exe"))
	if err != nil {
		return agentProcess{}, fmt.Errorf("transport: peer %d executable: %w", peerPID, err)
	}
	agentPID := peerPID
	// A process connecting to its own socket is not a bridge: the bridge is a separate process.
	if peerPID != selfPID && os.SameFile(selfExe, peerExe) {
		st, err := p.stat(peerPID)
		if err != nil {
			return agentProcess{}, err
		}
		agentPID = st.PPID
	}
	st, err := p.stat(agentPID)
	if err != nil {
		return agentProcess{}, err
	}
	exe, err := os.Readlink(filepath.Join(p.root, strconv.Itoa(agentPID), "exe"))
	if err != nil {
		return agentProcess{}, fmt.Errorf("transport: agent %d executable: %w", agentPID, err)
	}
	return agentProcess{
		PID:   agentPID,
		Exe:   exe,
		Scope: fmt.Sprintf("run:%d-%d", agentPID, st.StartTicks),
	}, nil
}

func (p procFS) stat(pid int) (procStat, error) {
	data, err := os.ReadFile(filepath.Join(p.root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, fmt.Errorf("transport: process %d: %w", pid, err)
	}
	st, err := parseProcStat(data)
	if err != nil {
		return procStat{}, fmt.Errorf("transport: process %d: %w", pid, err)
	}
	return st, nil
}
