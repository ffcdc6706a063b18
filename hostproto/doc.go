// Package hostproto is the host protocol: what the bastion and the hostagent say to each other
// over SSH, and the calling side of it. Both sides import it; it imports neither, nor the
// markers store: what travels is its own wire structs (Marker), never a storage type, so the
// store can change without changing the protocol.
//
// # What it holds
//
//   - Connecting: the protocol version, exchanged once per connection (HelloRequest, SayHello).
//   - Exec under a marker (exec.go): the session's environment (EnvRequest and the Env…
//     names), the MarkerRequest messages the hostagent sends around a command, the exit
//     statuses it reports for commands it did not run to an exit code (ExitRefused, …), and
//     Run, the client.
//   - Control (control.go): the postern-control subsystem and local socket, its framing,
//     requests and replies, and ControlClient.
//
// # Compatibility
//
// Each release speaks Version and still speaks every version down to MinVersion. The window
// is one release in both directions: a bastion of this release talks to a hostagent of the
// previous release, and a bastion of the previous release to a hostagent of this one
// (integration/skew_test.go runs both pairings). A peer of the previous release knows no
// hello: it answers HelloRequest with false, and a hostagent that is sent none takes its
// client for the previous release. Within the window nothing on the wire is renamed or
// removed: the JSON of Marker has the field names the previous release's markers had, and
// new fields are optional (omitempty) on both sides.
package hostproto
