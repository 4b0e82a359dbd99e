package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/window"
)

// The header fields the middleware writes.
const (
	headerPolicy          = "RateLimit-Policy"
	headerLimit           = "RateLimit"
	headerRetryAfter      = "Retry-After"
	headerLegacyLimit     = "X-RateLimit-Limit"
	headerLegacyRemain    = "X-RateLimit-Remaining"
	headerLegacyReset     = "X-RateLimit-Reset"
	maxPolicyNameLength   = 64
	millisecondsPerSecond = 1000
)

// The fields' names in canonical form, set without canonicalizing each
// time (header names are case-insensitive on the wire).
var (
	canonicalPolicy     = http.CanonicalHeaderKey(headerPolicy)
	canonicalLimit      = http.CanonicalHeaderKey(headerLimit)
	canonicalRetryAfter = http.CanonicalHeaderKey(headerRetryAfter)
)

// checkPolicyName reports whether name can be a policy name: 1 to 64
// bytes, each printable ASCII (0x20 to 0x7E), so that it is a String of
// RFC 9651 once '"' and '\' are escaped.
func checkPolicyName(name string) error {
	if name == "" || len(name) > maxPolicyNameLength {
		return fmt.Errorf("policy name must be 1 to %d bytes, got %d", maxPolicyNameLength, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("policy name must be printable ASCII, got byte %#x at %d", c, i)
		}
	}
	return nil
}

// ceilSeconds returns ms rounded up to whole seconds; 0 for ms <= 0.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + millisecondsPerSecond - 1) / millisecondsPerSecond
}

// policyField returns the RateLimit-Policy field value of one quota policy
// item: name, its quota q (the limit) and, when windowMs > 0, its window w
// in seconds, rounded up (the draft has no sub-second precision; rounding
// up advertises a rate no higher than the real one).
//
//	"api";q=100;w=60
func policyField(name string, limit, windowMs int64) string {
	return item(name, ";q=", limit, ";w=", ceilSeconds(windowMs), windowMs > 0)
}

// limitField returns the RateLimit field value of one service limit item:
// name, the available quota r and, when t >= 0, the effective window t in
// seconds.
//
//	"api";r=42;t=17
func limitField(name string, remaining, t int64) string {
	return item(name, ";r=", max(remaining, 0), ";t=", t, t >= 0)
}

// item returns a List of one Item: name as a String with the Integer
// parameter p1 (";k=") of v1 and, when with2, p2 of v2. strconv quotes
// printable ASCII (checkPolicyName) as RFC 9651 does: '"' and '\' escaped,
// every other byte as it is.
func item(name, p1 string, v1 int64, p2 string, v2 int64, with2 bool) string {
	var buf [2*maxPolicyNameLength + 64]byte // on the stack: the only allocation is the result
	b := strconv.AppendInt(append(strconv.AppendQuote(buf[:0], name), p1...), v1, 10)
	if with2 {
		b = strconv.AppendInt(append(b, p2...), v2, 10)
	}
	return string(b)
}

// retryAfter returns the Retry-After of a denial in seconds, rounded up
// from the reply's RetryAfter (milliseconds), and whether there is one: a
// denial that no wait can fix (RetryNever) has none.
func retryAfter(resp bus.CheckResponse) (int64, bool) {
	if resp.Success || resp.RetryAfter <= 0 {
		return 0, false
	}
	return max(ceilSeconds(resp.RetryAfter), 1), true
}

// effectiveWindow returns the RateLimit field's t for resp at now, or -1 for
// none: for a denial, its Retry-After (the draft: Retry-After SHOULD NOT
// name a time before the effective window ends); for an admission, the
// seconds until the reply's fixed window ends (its reset), rounded up and
// never below 0. A denial that can never pass has no t.
func effectiveWindow(resp bus.CheckResponse, now time.Time) int64 {
	if !resp.Success {
		if s, ok := retryAfter(resp); ok {
			return s
		}
		return -1
	}
	return ceilSeconds(resp.Reset - now.UnixMilli())
}

// fields is what the middleware writes for one reply.
type fields struct {
	name     string // the policy's name
	windowMs int64  // the rule's window, advertised as w unless an override applied
	period   int64  // the rule's calendar period (its code), 0 for none: w is then the reply's period
	legacy   bool   // also X-RateLimit-*
}

// periodMs returns the length in milliseconds of the period of calendar
// code ending at reset, the period a reply with that reset was decided
// in; when reset ends no period of code (the reply named no reset), the
// length of the period holding now.
func periodMs(code, reset int64, now time.Time) int64 {
	if reset > 0 {
		if seq := window.Sequence(reset-1, code); window.End(seq, code) == reset {
			return reset - window.Start(seq, code)
		}
	}
	seq := window.Sequence(now.UnixMilli(), code)
	return window.End(seq, code) - window.Start(seq, code)
}

// write sets the header fields of resp on h at now: RateLimit-Policy and
// RateLimit always, Retry-After on a denial that a wait can fix, and the
// legacy X-RateLimit-Limit, -Remaining and -Reset (Unix seconds, rounded up)
// when asked for. Under a calendar period, w is the length of the period
// the reply was decided in (periodMs). When an override applied, its limit
// is q and w is left out: the reply does not carry the override's window.
func (f fields) write(h http.Header, resp bus.CheckResponse, now time.Time) {
	w := f.windowMs
	if f.period != 0 {
		w = periodMs(f.period, resp.Reset, now)
	}
	if resp.Override != "" {
		w = 0
	}
	h[canonicalPolicy] = []string{policyField(f.name, resp.Limit, w)}
	h[canonicalLimit] = []string{limitField(f.name, resp.Remaining, effectiveWindow(resp, now))}
	if s, ok := retryAfter(resp); ok {
		h[canonicalRetryAfter] = []string{strconv.FormatInt(s, 10)}
	}
	if f.legacy {
		h.Set(headerLegacyLimit, strconv.FormatInt(resp.Limit, 10))
		h.Set(headerLegacyRemain, strconv.FormatInt(max(resp.Remaining, 0), 10))
		h.Set(headerLegacyReset, strconv.FormatInt(ceilSeconds(resp.Reset), 10))
	}
}
