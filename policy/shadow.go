package policy

import "github.com/sluicehq/sluice/window"

// Reply is what a check answers, beyond the decision's counts, once shadow
// mode is applied.
type Reply struct {
	// Success is the reply's success: admitted, or denied in shadow mode.
	Success bool
	// ShadowDenied reports that enforcement would have denied the check
	// and shadow mode answered success instead.
	ShadowDenied bool
	// RetryAfter is the reply's retry_after: the decision's for a denial,
	// 0 for every success (as the contract has it).
	RetryAfter int64
}

// ShadowReply returns the reply to decision d of a check in shadow mode
// (shadow: its override's or its request's) or enforced. Shadow mode never
// changes what is counted: the caller counts d exactly as if enforced (the
// cost when d.Admitted, nothing otherwise) and only the reply differs.
func ShadowReply(d window.Decision, shadow bool) Reply {
	switch {
	case d.Admitted:
		return Reply{Success: true}
	case shadow:
		return Reply{Success: true, ShadowDenied: true}
	}
	return Reply{RetryAfter: d.RetryAfter}
}
