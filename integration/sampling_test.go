package integration

import (
	"testing"
	"time"
)

// benchSide is one way of doing the same thing, measured against the others.
type benchSide struct {
	name string
	call func() error
	took []time.Duration
}

// sampleInterleaved warms every side up, then times samples calls of each, alternating in
// blocks of block so the sides share the machine's noise. logs adds context to a failure.
func sampleInterleaved(b *testing.B, sides []*benchSide, samples, block int, logs func() string) {
	b.Helper()
	for range 10 {
		for _, side := range sides {
			if err := side.call(); err != nil {
				b.Fatalf("%s: %v\n%s", side.name, err, logs())
			}
		}
	}
	b.ResetTimer()
	for done := 0; done < samples; done += block {
		for _, side := range sides {
			for range block {
				t0 := time.Now()
				if err := side.call(); err != nil {
					b.Fatalf("%s: %v\n%s", side.name, err, logs())
				}
				side.took = append(side.took, time.Since(t0))
			}
		}
	}
	b.StopTimer()
}
