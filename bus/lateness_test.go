package bus

import (
	"testing"
	"time"
)

// The usual round trip follows replies, an eighth at a time, and a slow
// reply (a check waiting on Redis) moves it by at most an eighth of itself;
// a message is late after four usual round trips, never sooner than the
// floor.
func TestLatenessFollowsTheUsualRoundTrip(t *testing.T) {
	const us = time.Microsecond
	usual := usualRTT(0, 200*us)
	if usual != 200*us {
		t.Fatalf("first reply: usual %v, want 200µs", usual)
	}
	if got := lateAfter(usual); got != 800*us {
		t.Fatalf("late after %v with a usual 200µs, want 800µs", got)
	}
	slow := usualRTT(usual, 2*time.Second)
	if slow != 225*us {
		t.Fatalf("after a 2s reply: usual %v, want 225µs (counted as 400µs)", slow)
	}
	for range 100 {
		usual = usualRTT(usual, 40*us)
	}
	if usual < 40*us || usual > 41*us {
		t.Fatalf("after 100 replies of 40µs: usual %v, want ~40µs", usual)
	}
	if got := lateAfter(usual); got != minSpill {
		t.Fatalf("late after %v with a usual %v, want the floor %v", got, usual, minSpill)
	}
	for range 100 {
		usual = usualRTT(usual, 3*time.Millisecond)
	}
	if usual < 2900*us || usual > 3*time.Millisecond {
		t.Fatalf("after 100 replies of 3ms (a slower path): usual %v, want ~3ms", usual)
	}
}
