// Package testutil holds the leaf test helpers shared by Postern's packages: stores in temp
// dirs, audit keys, SSH keys and clients, seeds, re-executed test binaries, waiting, free
// ports, an HTTP target and a TCP fault proxy. It imports nothing of Postern but markers, so
// the journal's own tests stay free of the bastion; the processes (bastion, hostagent, sshd)
// are in harness. Every helper takes testing.TB and cleans up after itself with t.Cleanup.
package testutil
