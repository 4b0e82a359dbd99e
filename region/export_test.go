package region

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/window"
)

// UnderTest is an origin under the contract of origin_test.go, for the
// tests of package region_test (memory_test.go): the origin, a way to let
// its clock pass, and views of what it keeps (see originUnderTest).
type UnderTest struct {
	Origin interface {
		Origin
		Read(ctx context.Context, c window.Cell) (current, previous Totals, err error)
	}
	Pass      func(ms int64)
	Forget    int64
	Reporters func(window.Cell) int
	Local     func(c window.Cell, id string) (int64, bool)
	ExpireAt  func(window.Cell) int64
	Now       func() int64
}

func (u UnderTest) origin() originUnderTest {
	return originUnderTest{lookingOrigin: u.Origin, pass: u.Pass, forget: u.Forget, reporters: u.Reporters,
		local: u.Local, expireAt: u.ExpireAt, now: u.Now}
}

// ExerciseSync runs exerciseSync on u.
func ExerciseSync(t *testing.T, u UnderTest) { exerciseSync(t, u.origin()) }

// ExerciseImport runs exerciseImport on u.
func ExerciseImport(t *testing.T, u UnderTest) { exerciseImport(t, u.Origin) }

// ExerciseLocal runs exerciseLocal on o, with short as the origin that
// forgets reporters soon.
func ExerciseLocal(t *testing.T, o, short UnderTest) { exerciseLocal(t, o.origin(), short.origin()) }

// FirstTouches returns how many syncs r decided by a first touch.
func (r *Redis) FirstTouches() int64 { return r.touches.Load() }
