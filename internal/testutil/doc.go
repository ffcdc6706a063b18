// Package testutil holds the test helpers shared by Postern's packages: stores in temp dirs,
// SSH keys and clients, helper processes. Every helper takes testing.TB and cleans up after
// itself with t.Cleanup.
package testutil
