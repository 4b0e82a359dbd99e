package policy

import (
	"testing"

	"github.com/sluicehq/sluice/window"
)

func TestShadowModeTurnsOnlyDenialsIntoSuccesses(t *testing.T) {
	in := window.Input{Now: now0, Duration: 1000, Limit: 2, Cost: 1, Current: 2}
	denied := window.Decide(in)
	in.Current = 0
	admitted := window.Decide(in)
	if denied.Admitted || !admitted.Admitted || denied.RetryAfter <= 0 {
		t.Fatalf("decisions %+v %+v", denied, admitted)
	}
	for _, c := range []struct {
		d      window.Decision
		shadow bool
		want   Reply
	}{
		{admitted, false, Reply{Success: true}},
		{admitted, true, Reply{Success: true}},
		{denied, false, Reply{RetryAfter: denied.RetryAfter}},
		{denied, true, Reply{Success: true, ShadowDenied: true}},
	} {
		if got := ShadowReply(c.d, c.shadow); got != c.want {
			t.Errorf("ShadowReply(admitted %v, shadow %v) = %+v, want %+v", c.d.Admitted, c.shadow, got, c.want)
		}
	}
}
