// Package harness runs Postern's real processes for end-to-end tests: the postern and
// postern-hostagent binaries built once per test process (Binary), a bastion (NewBastion)
// and hostagents (StartHostagent) to drive over MCP, SSH and the operator socket, and a stock
// OpenSSH sshd (StartSSHD). Every process is killed, and what it detached reaped, at cleanup.
package harness
