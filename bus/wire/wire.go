package wire

import "github.com/sluicehq/sluice/window"

// Encoding is a body encoding on the wire. A reply always uses the encoding
// of the request it answers.
type Encoding uint8

const (
	// Msgpack is the MessagePack encoding: each body is a msgpack map with the
	// same keys as the JSON form. It is the zero value and the default when a
	// request carries no Content-Type and does not look like JSON.
	Msgpack Encoding = iota
	// JSON is the JSON encoding (RFC 8259): each body is a JSON object.
	JSON
)

// String returns "json" for JSON and "msgpack" for every other value.
func (e Encoding) String() string {
	if e == JSON {
		return "json"
	}
	return "msgpack"
}

// ContentType returns the canonical Content-Type header value for e:
// "application/json" for JSON and "application/msgpack" for every other value.
func (e Encoding) ContentType() string {
	if e == JSON {
		return "application/json"
	}
	return "application/msgpack"
}

// Limits of the wire contract. Decoders reject anything outside them with a
// *BadRequestError. The bounds of a check are the window package's, so that
// what the wire admits is what a cell can hold.
const (
	// MaxIdentifierLen is the largest identifier, in bytes. Identifiers
	// are 1 to MaxIdentifierLen bytes of anything.
	MaxIdentifierLen = window.MaxIdentifierLen
	// MaxLimit is the largest accepted limit.
	MaxLimit = window.MaxLimit
	// MinDuration is the shortest accepted window, in milliseconds (1s).
	MinDuration = window.MinDuration
	// MaxDuration is the longest accepted window, in milliseconds (366 days, so that Envoy's YEAR unit fits).
	MaxDuration = window.MaxDuration
	// MaxCost is the largest accepted cost.
	MaxCost = window.MaxCost
	// MaxBatchChecks is the most checks one batch request may hold.
	MaxBatchChecks = 100
	// MaxCheckBody is the largest single check request body, in bytes.
	MaxCheckBody = 4 << 10
	// MaxBatchBody is the largest batch request body, in bytes.
	MaxBatchBody = 128 << 10
)

// CheckRequest is the body of a single rate limit check. A CheckRequest
// returned by a decoder without error satisfies every rule of the contract:
// 1 <= len(Identifier) <= MaxIdentifierLen, 0 <= Limit <= MaxLimit,
// MinDuration <= Duration <= MaxDuration or a calendar period's code (its
// "window" names the period: window.ParseCalendar), and 0 <= Cost <= MaxCost.
type CheckRequest struct {
	// Identifier names what is being limited (a user, an IP, a key...).
	// It may hold any bytes.
	Identifier string
	// Limit is how many units the window allows.
	Limit int64
	// Duration is the window length in milliseconds, or a calendar
	// period's code (window.Calendar), which the body writes as "window"
	// with no "duration".
	Duration int64
	// Cost is how many units this check consumes, 0 only looking; decoders
	// set it to 1 when the body does not carry it. Encoders always write it
	// as it is, so a zero Cost sends a look: Go callers use bus.CheckRequest,
	// whose zero Cost counts 1.
	Cost int64
	// Shadow asks for shadow mode (README, "Overrides and shadow mode"): the check is counted
	// exactly as if enforced, and where enforcement would deny it the
	// reply is a success with ShadowDenied set. Optional on the wire
	// ("shadow": a boolean, false when absent); encoders write it only
	// when set.
	Shadow bool
	// Fixed asks for a fixed window: the window's own count alone is
	// weighed, and the whole limit comes back when it ends (README, "Fixed
	// windows and usage known afterwards"). Optional on the wire
	// ("window": "sliding", the default, or "fixed"); encoders write it
	// only when set.
	Fixed bool
	// Charge is how Cost is charged (the same README section): all or
	// nothing (the default), drain, or debit. Optional on the wire
	// ("charge": "all", "drain" or "debit"); encoders write it only when it
	// is not ChargeAll. A batch's checks charge all.
	Charge window.Charge
}

// CheckResponse is the answer to a check.
type CheckResponse struct {
	// Success reports whether the check was allowed.
	Success bool
	// Limit echoes the limit of the check.
	Limit int64
	// Remaining is how many units are left in the window.
	Remaining int64
	// Reset is when the window resets, as unix milliseconds.
	Reset int64
	// RetryAfter is how long to wait before retrying, in milliseconds: 0
	// when Success, RetryNever (-1) when no wait helps (the cost is above the
	// limit), else positive.
	RetryAfter int64
	// ShadowDenied reports that enforcement would have denied the check
	// and shadow mode (the request's or its override's) answered success
	// instead: the key "shadow_denied", written only when true.
	ShadowDenied bool
	// Override is the pattern of the override that applied to the check
	// (its limit and duration replaced the request's; the pattern is the
	// override's identity in its namespace, as override.get takes it):
	// the key "override", written last and only when an override applied,
	// so a reply without one keeps the contract's bytes. Decoders accept a
	// msgpack str or bin, as for identifiers.
	Override string
}

// RetryNever is the RetryAfter of a denial that no wait can turn into an
// admission: the cost is above the limit. No other reply has a negative
// RetryAfter.
const RetryNever = window.RetryNever

// Never reports whether r is a denial that waiting cannot fix (RetryAfter
// is RetryNever): retrying the same request is pointless.
func (r CheckResponse) Never() bool { return !r.Success && r.RetryAfter == RetryNever }

// BatchCheck is one check of a batch: a CheckRequest plus the namespace it
// applies to. A decoded BatchCheck also satisfies ValidToken(Namespace).
type BatchCheck struct {
	// Namespace scopes the identifier; 1 to 64 characters of
	// [A-Za-z0-9_-].
	Namespace string
	CheckRequest
}

// BatchRequest is the body of a batch check. A decoded BatchRequest holds 1
// to MaxBatchChecks checks, each valid.
type BatchRequest struct {
	Checks []BatchCheck
}

// BatchResponse is the answer to a batch: Results[i] answers Checks[i].
type BatchResponse struct {
	// Success reports whether every check of the batch was allowed.
	Success bool
	Results []CheckResponse
}

// ValidToken reports whether s is 1 to 64 characters, each of
// [A-Za-z0-9_-]. It is the rule for namespaces (and workspaces).
func ValidToken(s string) bool { return window.ValidToken(s) }
