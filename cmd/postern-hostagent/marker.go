package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/postern-dev/postern/hostproto"
	"github.com/postern-dev/postern/internal/cli"
)

// markerTimeout bounds how long a command waits for the agent to record its checkpoint.
const markerTimeout = 30 * time.Second

// MarkerCommand is run by a command the hostagent started, to report on its own marker:
// `marker checkpoint NOTE` and `marker validated`. The execution and the socket come from
// the environment the agent gave the command; the agent accepts the report only from that
// execution's process tree.
type MarkerCommand struct {
	Stdout, Stderr io.Writer
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
}

const markerUsage = `usage: postern-hostagent marker checkpoint NOTE
       postern-hostagent marker validated

Run from a command the hostagent started: records a checkpoint (or that the command
validated its work) on the command's own marker, using POSTERN_EXECUTION_ID and
POSTERN_MARKER_SOCKET from the environment.
`

func (c *MarkerCommand) Run(ctx context.Context, args []string) error {
	if len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(c.Stdout, markerUsage)
		return nil
	}
	var note string
	switch {
	case len(args) == 2 && args[0] == hostproto.OpCheckpoint:
		note = args[1]
	case len(args) == 1 && args[0] == hostproto.OpValidated:
	default:
		fmt.Fprint(c.Stderr, markerUsage)
		return cli.ErrUsage
	}
	getenv := c.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	id, sock := getenv(hostproto.EnvExecutionID), getenv(hostproto.EnvMarkerSocket)
	if id == "" || sock == "" {
		return fmt.Errorf("%s and %s are not set: run this from a command the hostagent started",
			hostproto.EnvExecutionID, hostproto.EnvMarkerSocket)
	}
	ctx, cancel := context.WithTimeout(ctx, markerTimeout)
	defer cancel()
	agent, err := hostproto.DialLocalControl(ctx, sock)
	if err != nil {
		return err
	}
	defer agent.Close()
	if args[0] == hostproto.OpCheckpoint {
		_, err = agent.Checkpoint(ctx, id, note)
	} else {
		_, err = agent.Validated(ctx, id)
	}
	switch {
	case errors.Is(err, hostproto.ErrNotRunning):
		return fmt.Errorf("execution %s is not running: %w", id, err)
	case errors.Is(err, hostproto.ErrForbidden):
		return fmt.Errorf("the agent refused: this process is not part of execution %s: %w", id, err)
	case err != nil:
		return fmt.Errorf("record %s on %s: %w", args[0], id, err)
	}
	return nil
}
