// Package integration holds Postern's end-to-end and fault-injection tests: real binaries
// built from cmd/, real processes and real sockets on 127.0.0.1.
package integration
