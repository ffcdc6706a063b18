package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// tsStdioClient is the official TypeScript SDK's stdio client (tsclient/bench.mjs) driving a
// `postern mcp` bridge it spawned, one ssh_exec per call — what an agent like Claude Code
// pays per command.
type tsStdioClient struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startTSStdio starts the TypeScript client on bridge (the postern binary and its mcp args)
// and waits until it is connected. It stops at the end of the benchmark.
func startTSStdio(tb testing.TB, bridge ...string) *tsStdioClient {
	tb.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		tb.Fatalf("node is not installed (.ci/run installs it): %v", err)
	}
	if _, err := os.Stat(filepath.Join(tsClientDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		tb.Fatalf("the TypeScript MCP SDK is not installed: run `npm ci --prefix integration/tsclient` (scripts/test does): %v", err)
	}
	cmd := exec.Command(node, append([]string{"bench.mjs"}, bridge...)...)
	cmd.Dir = tsClientDir
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &tsStdioClient{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	tb.Cleanup(func() {
		in.Close() // the client closes its bridge and exits
		if err := cmd.Wait(); err != nil {
			tb.Errorf("TypeScript stdio client: %v", err)
		}
	})
	if err := c.read(); err != nil {
		tb.Fatalf("TypeScript stdio client: %v", err)
	}
	return c
}

// call makes one ssh_exec with args and waits for its answer.
func (c *tsStdioClient) call(args map[string]any) error {
	line, err := json.Marshal(args)
	if err != nil {
		return err
	}
	if _, err := c.in.Write(append(line, '\n')); err != nil {
		return err
	}
	return c.read()
}

func (c *tsStdioClient) read() error {
	if !c.out.Scan() {
		return fmt.Errorf("the client exited: %v", c.out.Err())
	}
	var answer struct {
		Connected, OK bool
		Error         string
	}
	if err := json.Unmarshal(c.out.Bytes(), &answer); err != nil {
		return fmt.Errorf("client printed %q: %w", c.out.Text(), err)
	}
	if answer.Error != "" {
		return errors.New(answer.Error)
	}
	return nil
}
