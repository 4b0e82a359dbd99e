//go:build race

package test

// raceDetector reports whether the tests run under the race detector, whose
// instrumentation slows this process (the client side of a load) several
// times over.
const raceDetector = true
