package service

import (
	"sync/atomic"
	"time"
)

// coarseResolution is how often the default clock reads the system clock.
const coarseResolution = time.Millisecond

// coarseClock is the default clock: unix milliseconds refreshed every
// coarseResolution by one goroutine, so a check reads the time with one
// atomic load instead of a system clock read (docs/architecture.md says
// what that saves). A reading may
// lag the system clock by the refresh interval plus scheduling delay; a late
// reading only weighs the previous window more, erring towards denial.
// It is an allocation of its own, so the writes every coarseResolution
// never share a cache line with what checks read.
type coarseClock struct {
	ms atomic.Int64
}

// tick reads the system clock.
func (c *coarseClock) tick() { c.ms.Store(time.Now().UnixMilli()) }
