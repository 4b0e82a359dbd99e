package region_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/region"
)

// The Go model of the Redis scripts (internal/regiontest's Memory) keeps the
// contract the Redis origin keeps (TestRedisOrigin).
func TestMemoryOrigin(t *testing.T) {
	var now atomicClock
	now.set(time.Now().UnixMilli())
	m := regiontest.NewMemory(now.get)
	o := region.UnderTest{Origin: m, Pass: func(ms int64) { now.add(ms) }, Forget: m.ForgetAfter.Milliseconds(), Reporters: m.Reporters,
		Local: m.Local, ExpireAt: m.ExpireAt, Now: func() int64 { return now.get().UnixMilli() }}
	region.ExerciseSync(t, o)
	region.ExerciseImport(t, o)
	region.ExerciseLocal(t, o, o) // its clock passes at once: forgetting costs no wait
}

// atomicClock is a manual clock for Memory.
type atomicClock struct{ ms atomic.Int64 }

func (c *atomicClock) set(ms int64)   { c.ms.Store(ms) }
func (c *atomicClock) add(ms int64)   { c.ms.Add(ms) }
func (c *atomicClock) get() time.Time { return time.UnixMilli(c.ms.Load()) }
