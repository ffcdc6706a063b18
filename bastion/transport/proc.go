package transport

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/postern-dev/postern/internal/procfs"
)

// BridgeParentHeader is the header in which the stdio bridge (`postern mcp`) names its
// parent, the agent process, as "<pid>-<start time ticks>". The daemon checks the claim
// against the connecting process's real parent; a claim that does not match is refused.
const BridgeParentHeader = "Postern-Bridge-Parent"

// errBadProcessRef reports a malformed BridgeParentHeader value.
var errBadProcessRef = fmt.Errorf("%s must be <pid>-<start time ticks>, decimal", BridgeParentHeader)

// maxProcessRefBytes bounds a BridgeParentHeader value (two 20-digit numbers and a dash).
const maxProcessRefBytes = 41

// processRef names one process for its lifetime: a pid and the process's start time after
// boot, in clock ticks (pids are reused; the pair is not).
type processRef struct {
	PID        int
	StartTicks uint64
}

func (r processRef) String() string { return fmt.Sprintf("%d-%d", r.PID, r.StartTicks) }

// parseProcessRef parses "<pid>-<start ticks>": decimal digits only, pid positive.
func parseProcessRef(s string) (processRef, error) {
	if len(s) > maxProcessRefBytes {
		return processRef{}, errBadProcessRef
	}
	pidText, startText, ok := strings.Cut(s, "-")
	if !ok || !decimal.MatchString(pidText) || !decimal.MatchString(startText) {
		return processRef{}, errBadProcessRef
	}
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 {
		return processRef{}, errBadProcessRef
	}
	start, err := strconv.ParseUint(startText, 10, 64)
	if err != nil {
		return processRef{}, errBadProcessRef
	}
	return processRef{PID: pid, StartTicks: start}, nil
}

// decimal is an unsigned decimal number, with no sign or space ParseUint would accept.
var decimal = regexp.MustCompile(`^[0-9]+$`)

// agentProcess is the local agent behind a unix-socket peer.
type agentProcess struct {
	PID        int
	Exe        string
	Cmdline    string // NUL-separated arguments
	StartTicks uint64
	Scope      string // "run:<pid>-<start ticks>"
}

// peerProcess is the kernel's account of a unix-socket peer, read when it connects: the
// process itself and its parent (the agent, when the peer is a stdio bridge).
type peerProcess struct {
	self agentProcess
	// parentRef and parent are the peer's real parent; parentErr says why it could not be
	// resolved (a bridge claim is then refused).
	parentRef processRef
	parent    agentProcess
	parentErr error
	// sameBinary: the peer runs this process's own executable file (a `postern mcp` of the
	// daemon's binary), as opposed to any program that names its parent.
	sameBinary bool
}

// procFS resolves unix-socket peers to agent processes. root is "/proc" except in tests.
type procFS struct {
	root string
}

// resolvePeer reads the peer process and its parent from /proc. It fails closed when the
// peer itself cannot be read; an unreadable parent only matters to a bridge's claim.
func (p procFS) resolvePeer(peerPID int) (peerProcess, error) {
	self, st, err := p.process(peerPID)
	if err != nil {
		return peerProcess{}, err
	}
	pp := peerProcess{self: self, sameBinary: p.sameExecutable(peerPID)}
	parent, parentStat, err := p.process(st.PPID)
	if err != nil {
		pp.parentErr = fmt.Errorf("the parent %d of process %d cannot be read: %w", st.PPID, peerPID, err)
		return pp, nil
	}
	pp.parent, pp.parentRef = parent, processRef{PID: st.PPID, StartTicks: parentStat.StartTime}
	return pp, nil
}

// agent applies the local scope rule: a peer that names its parent (claim, the
// BridgeParentHeader value; "" for none) is a stdio bridge and the agent is that parent, if
// the claim matches the kernel's; a peer that names none is the agent itself.
func (pp peerProcess) agent(claim string) (agentProcess, error) {
	if claim == "" {
		return pp.self, nil
	}
	ref, err := parseProcessRef(claim)
	if err != nil {
		return agentProcess{}, err
	}
	if pp.parentErr != nil {
		return agentProcess{}, fmt.Errorf("%s %s refused: %w", BridgeParentHeader, claim, pp.parentErr)
	}
	if ref != pp.parentRef {
		return agentProcess{}, fmt.Errorf("%s %s refused: the connecting process %d's parent is %s; a bridge names the agent that started it (was it re-parented after its agent exited?)",
			BridgeParentHeader, claim, pp.self.PID, pp.parentRef)
	}
	return pp.parent, nil
}

// sameExecutable reports whether pid runs the same executable file as this process (by
// device and inode, so a path that was replaced since does not count).
func (p procFS) sameExecutable(pid int) bool {
	peer, err := os.Stat(filepath.Join(p.root, strconv.Itoa(pid), "exe"))
	if err != nil {
		return false
	}
	self, err := os.Stat(filepath.Join(p.root, "self", "exe"))
	return err == nil && os.SameFile(peer, self)
}

// process reads pid's stat and executable.
func (p procFS) process(pid int) (agentProcess, procfs.Stat, error) {
	st, err := procfs.ReadStatAt(p.root, pid)
	if err != nil {
		return agentProcess{}, procfs.Stat{}, fmt.Errorf("transport: %w", err)
	}
	exe, err := os.Readlink(filepath.Join(p.root, strconv.Itoa(pid), "exe"))
	if err != nil {
		return agentProcess{}, procfs.Stat{}, fmt.Errorf("transport: process %d executable: %w", pid, err)
	}
	return agentProcess{PID: pid, Exe: exe, Cmdline: p.cmdline(pid), StartTicks: st.StartTime,
		Scope: "run:" + processRef{PID: pid, StartTicks: st.StartTime}.String()}, st, nil
}

// maxCmdlineBytes bounds the command line read for a peer: it is kept for operators (the
// agent runs journal), not trusted for anything.
const maxCmdlineBytes = 4096

// cmdline is pid's command line (NUL-separated arguments), at most maxCmdlineBytes of it;
// "" if unreadable (a process may hide it; the scope does not depend on it).
func (p procFS) cmdline(pid int) string {
	f, err := os.Open(filepath.Join(p.root, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return ""
	}
	defer f.Close()
	buf := make([]byte, maxCmdlineBytes)
	n, _ := io.ReadFull(f, buf)
	return string(bytes.TrimRight(buf[:n], "\x00"))
}

// BridgeParentClaim is the BridgeParentHeader value of this process: its parent and the
// parent's start time, from /proc.
func BridgeParentClaim() (string, error) {
	ppid := os.Getppid()
	st, err := procfs.ReadStat(ppid)
	if err != nil {
		return "", fmt.Errorf("transport: naming the bridge's parent: %w", err)
	}
	return processRef{PID: ppid, StartTicks: st.StartTime}.String(), nil
}
