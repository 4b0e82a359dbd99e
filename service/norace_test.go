//go:build !race

package service

// raceEnabled reports whether the race detector is on: its
// instrumentation allocates, so allocation counts mean nothing under it.
const raceEnabled = false
