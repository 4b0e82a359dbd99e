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
type coarseClock struct {
	ms atomic.Int64
}

func startCoarseClock(stop <-chan struct{}, done func()) *coarseClock {
	c := &coarseClock{}
	c.ms.Store(time.Now().UnixMilli())
	go func() {
		defer done()
		t := time.NewTicker(coarseResolution)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				c.ms.Store(now.UnixMilli())
			}
		}
	}()
	return c
}
