package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/postern-dev/postern/bastion/fleet"
	"github.com/postern-dev/postern/internal/cli"
)

// What agents are told about a host (hosts_list): a description, labels and the OS, set at
// enrollment (--description, --label, --os) and changed with `postern hosts label`. They
// decide nothing; policy matches host names and groups.

// label changes a host's description, labels and OS in the inventory, which the daemon
// re-reads on its next lookup: no daemon needed.
func (c *hostsCommand) label(ctx context.Context, args []string) error {
	fs, loc := c.flagSet("hosts label NAME [KEY=VALUE | KEY-]... [--description TEXT] [--os OS]")
	description := fs.String("description", "", "what the host is, in one line agents read (\"\" removes it)")
	osName := fs.String("os", "", "the host's operating system, e.g. \"Debian 12\" (\"\" removes it)")
	var positional []string
	for {
		if err := cli.ParseFlags(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if len(positional) == 0 {
		return prog.UsageErrorf(c.stderr, "name the host")
	}
	name, edits := positional[0], positional[1:]
	if len(edits) == 0 && !set["description"] && !set["os"] {
		return prog.UsageErrorf(c.stderr, "nothing to change: give KEY=VALUE to set a label, KEY- to remove one, --description or --os")
	}
	labels, remove, err := parseLabelEdits(edits)
	if err != nil {
		return prog.UsageErrorf(c.stderr, "%v", err)
	}
	cfg, err := loc.config()
	if err != nil {
		return err
	}
	if err := checkOwnState(cfg.StateDir); err != nil {
		return err
	}
	info, err := fleet.SetInfo(cfg.InventoryPath(), name, func(i *fleet.Info) {
		maps.Copy(i.Labels, labels)
		for _, k := range remove {
			delete(i.Labels, k)
		}
		if set["description"] {
			i.Description = *description
		}
		if set["os"] {
			i.OS = *osName
		}
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "host %s: %s\n", cli.Printable(name), cli.Printable(hostInfoText(info.Description, info.Labels, info.OS)))
	return nil
}

// parseLabelEdits reads KEY=VALUE (set) and KEY- (remove) arguments.
func parseLabelEdits(edits []string) (set map[string]string, remove []string, err error) {
	set = map[string]string{}
	for _, e := range edits {
		if k, v, ok := strings.Cut(e, "="); ok {
			set[k] = v
			continue
		}
		if k, ok := strings.CutSuffix(e, "-"); ok && k != "" {
			remove = append(remove, k)
			continue
		}
		return nil, nil, fmt.Errorf("%q: want KEY=VALUE to set a label or KEY- to remove one", e)
	}
	return set, remove, fleet.ValidateHostInfo("", set, "")
}

// parseLabels reads enroll's --label KEY=VALUE values.
func parseLabels(values []string) (map[string]string, error) {
	labels := map[string]string{}
	for _, v := range values {
		k, val, ok := strings.Cut(v, "=")
		if !ok {
			return nil, fmt.Errorf("--label %q: want KEY=VALUE", v)
		}
		labels[k] = val
	}
	if len(labels) == 0 {
		return nil, nil
	}
	return labels, nil
}

// hostInfoText is a host's description, labels and OS in one line, as `hosts label` confirms
// them.
func hostInfoText(description string, labels map[string]string, os string) string {
	var parts []string
	if description != "" {
		parts = append(parts, fmt.Sprintf("%q", description))
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	if os != "" {
		parts = append(parts, "os "+os)
	}
	if len(parts) == 0 {
		return "no description, labels or OS"
	}
	return strings.Join(parts, ", ")
}
