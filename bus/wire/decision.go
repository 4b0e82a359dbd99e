package wire

// DecisionEvent is one decision on the decision stream (README, "Who is
// being limited"): a limiter publishes it as JSON on
// Subjects.Decisions(workspace, namespace) when it is started with
// --decision-events, for each denial and each sampled admission. Events
// are best effort: a limiter drops them (and counts the drops) rather
// than slow a check, so a consumer counts what it sees, not every check.
type DecisionEvent struct {
	Workspace  string `json:"workspace"`
	Namespace  string `json:"namespace"`
	Identifier string `json:"identifier"`
	// Outcome is "admitted", "denied" or "shadow_denied" (shadow mode
	// answered success where enforcement would have denied).
	Outcome string `json:"outcome"`
	// Cost is what the check asked for (0: a look).
	Cost int64 `json:"cost"`
	// Limit and Duration (ms) are those applied: an override's when one
	// matched (Override names its pattern). A calendar period's check
	// has Duration 0 and names the period in Window.
	Limit    int64  `json:"limit"`
	Duration int64  `json:"duration"`
	Window   string `json:"window,omitempty"`
	Override string `json:"override,omitempty"`
	// Remaining, Reset and RetryAfter are the reply's (CheckResponse).
	Remaining  int64 `json:"remaining"`
	Reset      int64 `json:"reset"`
	RetryAfter int64 `json:"retry_after"`
	// Region and Limiter name who decided; At is when (unix ms, the
	// limiter's clock).
	Region  string `json:"region,omitempty"`
	Limiter string `json:"limiter"`
	At      int64  `json:"at"`
}

// Outcomes of a DecisionEvent.
const (
	OutcomeAdmitted     = "admitted"
	OutcomeDenied       = "denied"
	OutcomeShadowDenied = "shadow_denied"
)

// DecisionStreamName is the JetStream stream that keeps the decision
// events when a limiter runs with --decision-events-jetstream.
const DecisionStreamName = "SLUICE_DECISIONS"
