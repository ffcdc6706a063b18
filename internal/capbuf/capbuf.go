// Package capbuf is a buffer that keeps the first bytes written to it, up to a bound, and
// drops the rest: for reading what a remote command prints without trusting its size.
package capbuf

import "bytes"

// DefaultMax is the bound of a Buffer whose Max is zero.
const DefaultMax = 64 << 10

// Buffer keeps the first Max bytes written (DefaultMax when zero) in B and drops the rest;
// every Write reports the whole of p written, so a copy into it never stops early.
type Buffer struct {
	B   *bytes.Buffer
	Max int
}

func (l *Buffer) Write(p []byte) (int, error) {
	limit := l.Max
	if limit == 0 {
		limit = DefaultMax
	}
	if room := limit - l.B.Len(); room > 0 {
		l.B.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
