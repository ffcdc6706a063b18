package main

import (
	"errors"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postern-dev/postern/bastion/config"
	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/cli"
	"github.com/postern-dev/postern/internal/testutil/harness"
	"github.com/postern-dev/postern/internal/testutil/sockdir"
)

// TestHostsLabel: what agents are told about a host is set at enrollment, changed with
// `hosts label` (labels set and removed, the description and OS replaced), kept when the
// host is enrolled again without it, and shown by `hosts list`.
func TestHostsLabel(t *testing.T) {
	agent := harness.StartHostagent(t)
	stateDir := filepath.Join(sockdir.New(t), "state")
	inventory := config.DefaultConfig(stateDir).InventoryPath()
	info := func() fleet.Host {
		t.Helper()
		inv, err := fleet.OpenInventory(inventory)
		if err != nil {
			t.Fatal(err)
		}
		h, err := inv.Host("db")
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	mustRun(t, "hosts", "enroll", "db", agent.Addr, "--yes", "--state-dir", stateDir,
		"--description", "primary PostgreSQL", "--label", "env=prod", "--label", "role=db", "--os", "Debian 12")
	if h := info(); h.Description != "primary PostgreSQL" || !maps.Equal(h.Labels, map[string]string{"env": "prod", "role": "db"}) || h.OS != "Debian 12" {
		t.Fatalf("enrolled %+v; want its description, labels and OS", h)
	}

	res := mustRun(t, "hosts", "label", "db", "env=staging", "role-", "team/owner=payments", "--os", "Debian 13", "--state-dir", stateDir)
	if want := `host db: "primary PostgreSQL", env=staging, team/owner=payments, os Debian 13`; !strings.Contains(res.stdout, want) {
		t.Errorf("hosts label printed %q; want %q", res.stdout, want)
	}
	want := map[string]string{"env": "staging", "team/owner": "payments"}
	if h := info(); !maps.Equal(h.Labels, want) || h.OS != "Debian 13" || h.Description != "primary PostgreSQL" {
		t.Fatalf("after hosts label: %+v", h)
	}
	mustRun(t, "hosts", "label", "db", "--description", "", "--state-dir", stateDir)
	if h := info(); h.Description != "" || !maps.Equal(h.Labels, want) {
		t.Fatalf("after removing the description: %+v", h)
	}

	mustRun(t, "hosts", "enroll", "db", agent.Addr, "--yes", "--state-dir", stateDir)
	if h := info(); !maps.Equal(h.Labels, want) || h.OS != "Debian 13" {
		t.Fatalf("enrolled again without them: %+v; want the labels and OS kept", h)
	}
	list := mustRun(t, "hosts", "list", "--state-dir", stateDir)
	if !strings.Contains(list.stdout, "LABELS") || !strings.Contains(list.stdout, "env=staging,team/owner=payments") || !strings.Contains(list.stdout, "Debian 13") {
		t.Errorf("hosts list does not show the labels and OS:\n%s", list.stdout)
	}

	for _, args := range [][]string{
		{"hosts", "label", "db"},
		{"hosts", "label"},
		{"hosts", "label", "db", "nonsense"},
		{"hosts", "label", "db", "env=two words"},
		{"hosts", "enroll", "db", agent.Addr, "--yes", "--label", "novalue"},
		{"hosts", "enroll", "db", agent.Addr, "--yes", "--description", "two\nlines"},
	} {
		if res := runCLI(t, "", append(args, "--state-dir", stateDir)...); !errors.Is(res.err, cli.ErrUsage) {
			t.Errorf("%q: err = %v; want a usage error", args, res.err)
		}
	}
	if res := runCLI(t, "", "hosts", "label", "web9", "env=x", "--state-dir", stateDir); !errors.Is(res.err, fleet.ErrUnknownHost) {
		t.Errorf("hosts label of an unknown host: %v; want unknown host", res.err)
	}
}
