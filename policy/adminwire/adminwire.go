// Package adminwire holds the wire shapes of the policy endpoints of the
// ratelimit-admin service (README, "Overrides and shadow mode"): subjects, request and response
// bodies, in JSON or msgpack, with strict decoders: the wire's object
// decoder (wire.DecodeObject) over each body's field table, then package
// policy's rules.
//
// A request decoder refuses, with an error that says what to fix, anything
// but one object (map) of the endpoint's fields: unknown, duplicate and
// missing fields, values of the wrong type (integers only: fractions,
// exponents and floats are refused; null is a wrong type), out-of-range
// values (by package policy's rules), trailing bytes, and bodies over
// MaxBodySize. What it returns is valid: the caller may apply it as is.
// Decoders never panic (fuzzed).
//
// Every error of ParseSubject, DecodeCursor and the Decode functions is a
// *wire.BadRequestError (tell it with errors.As): the subject or body
// breaks the wire's rules, and its Msg says what to fix. A request that
// fails so is answered 400 with Msg, and nothing is changed.
//
// Identifiers are bytes: msgpack carries them as str or bin, and JSON as
// strings, which must then be valid UTF-8 (a JSON body that is not is
// refused whole, since JSON cannot carry other bytes faithfully; use
// msgpack for such identifiers).
package adminwire

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// Encoding is the encoding of a body, the wire's one (wire.Encoding): the
// caller tells JSON from msgpack by the rules of the README's "The
// request" (Content-Type, else the first non-space byte).
type Encoding = wire.Encoding

// The encodings, the wire's.
const (
	// JSON bodies are JSON objects.
	JSON = wire.JSON
	// Msgpack bodies are msgpack maps with the same keys.
	Msgpack = wire.Msgpack
)

// MaxBodySize is the largest request body decoded: far above any valid
// request (an identifier of 512 bytes escaped in JSON takes at most 3 KiB).
const MaxBodySize = 8 << 10

// Op names a policy endpoint: the subject's tokens after the workspace.
type Op string

// The policy endpoints.
const (
	OpSet    Op = "override.set"
	OpGet    Op = "override.get"
	OpDelete Op = "override.delete"
	OpList   Op = "override.list"
	OpReset  Op = "reset"
)

// Ops lists every policy endpoint, in the order the service registers
// them.
func Ops() []Op { return []Op{OpSet, OpGet, OpDelete, OpList, OpReset} }

// Subject returns the subject of op for workspace under prefix (default
// "ratelimit"): <prefix>.admin.<workspace>.<op>.
func Subject(prefix, workspace string, op Op) string {
	return prefix + ".admin." + workspace + "." + string(op)
}

// ParseSubject returns the workspace and op of a subject under prefix, or
// a *wire.BadRequestError when it is not a policy endpoint's subject with a
// valid workspace.
func ParseSubject(prefix, subject string) (string, Op, error) {
	rest, ok := strings.CutPrefix(subject, prefix+".admin.")
	ws, op, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return "", "", badf("subject %q is not %s.admin.<workspace>.<operation>", subject, prefix)
	}
	if !window.ValidToken(ws) {
		return "", "", badf("%v", window.TokenError("workspace", ws))
	}
	if slices.Contains(Ops(), Op(op)) {
		return ws, Op(op), nil
	}
	return "", "", badf("unknown operation %q (override.set, override.get, override.delete, override.list, reset)", op)
}

// SetRequest is the body of override.set.
type SetRequest struct {
	Namespace  string
	Identifier string // the pattern: an identifier, or bytes where each '*' matches any run (policy.ValidatePattern)
	Limit      int64
	Duration   int64 // milliseconds, or a calendar period (window.Calendar): the "window" key
	Shadow     bool  // optional, default false
}

// Key returns the override's key in workspace.
func (r SetRequest) Key(workspace string) policy.Key {
	return policy.Key{Workspace: workspace, Namespace: r.Namespace, Pattern: r.Identifier}
}

// Override returns what the override makes checks apply.
func (r SetRequest) Override() policy.Override {
	return policy.Override{Limit: r.Limit, Duration: r.Duration, Shadow: r.Shadow}
}

// DeleteRequest is the body of override.delete.
type DeleteRequest struct {
	Namespace  string
	Identifier string // the pattern
}

// Key returns the override's key in workspace.
func (r DeleteRequest) Key(workspace string) policy.Key {
	return policy.Key{Workspace: workspace, Namespace: r.Namespace, Pattern: r.Identifier}
}

// GetRequest is the body of override.get, the override of one pattern
// exactly as it was set: the key override.delete's body names.
type GetRequest = DeleteRequest

// Bounds of a page of override.list.
const (
	// MaxListLimit is the most overrides one reply of override.list
	// holds, and DefaultListLimit how many it holds when the request
	// says no limit. A reply may hold fewer: it also ends before it
	// would exceed the limiter's byte budget (ListWriter).
	MaxListLimit     = 1000
	DefaultListLimit = MaxListLimit
)

// ListRequest is the body of override.list; an empty body lists the first
// page of every namespace.
type ListRequest struct {
	Namespace string // "": every namespace
	// Cursor is "" for the first page, else the Next of the reply to the
	// previous page (opaque): the page starts strictly after the last
	// override that reply held.
	Cursor string
	// Limit is the most overrides the reply holds: 1 to MaxListLimit, or
	// 0 (absent on the wire) for DefaultListLimit.
	Limit int
}

// PageLimit returns the most overrides the reply holds: Limit, or
// DefaultListLimit when it is 0.
func (r ListRequest) PageLimit() int {
	if r.Limit == 0 {
		return DefaultListLimit
	}
	return r.Limit
}

// Start returns the position the page starts after: the one Cursor names,
// or the zero position (before every override) when Cursor is "". Call it
// on a request DecodeList returned, which has checked the cursor; a cursor
// DecodeList would refuse gives the zero position.
func (r ListRequest) Start() policy.Position {
	p, _ := DecodeCursor(r.Cursor)
	return p
}

// ResetRequest is the body of reset.
type ResetRequest struct {
	Namespace  string
	Identifier string // one identifier, never a pattern
	Duration   int64  // milliseconds, or a calendar period (the "window" key); 0 (absent): every duration
}

// DecodeSet decodes and validates an override.set body.
func DecodeSet(body []byte, enc Encoding) (SetRequest, error) {
	o, err := decodeOverride(body, enc, optional)
	if err != nil {
		return SetRequest{}, err
	}
	r := SetRequest(o)
	if err := policy.ValidatePattern(r.Identifier); err != nil {
		return SetRequest{}, badRequest("identifier", err)
	}
	if err := r.Override().Validate(); err != nil {
		return SetRequest{}, badRequest("", err)
	}
	return r, nil
}

// DecodeDelete decodes and validates an override.delete body.
func DecodeDelete(body []byte, enc Encoding) (DeleteRequest, error) {
	var r DeleteRequest
	fs := []wire.Field{
		tokenField("namespace", required, &r.Namespace),
		identifierField("identifier", &r.Identifier),
	}
	if _, err := decodeObject(body, enc, fs, false); err != nil {
		return DeleteRequest{}, err
	}
	if err := policy.ValidatePattern(r.Identifier); err != nil {
		return DeleteRequest{}, badRequest("identifier", err)
	}
	return r, nil
}

// DecodeGet decodes and validates an override.get body.
func DecodeGet(body []byte, enc Encoding) (GetRequest, error) { return DecodeDelete(body, enc) }

// DecodeList decodes and validates an override.list body; an empty body
// (or only white space) is a request for the first page of every
// namespace. A cursor must be one EncodeCursor wrote, and, when the
// request names a namespace, one of that namespace's listing; a limit must
// be 1 to MaxListLimit.
func DecodeList(body []byte, enc Encoding) (ListRequest, error) {
	var r ListRequest
	var limit int64
	fs := []wire.Field{
		tokenField("namespace", optional, &r.Namespace),
		{Name: "cursor", Kind: wire.FieldString, MaxLen: MaxCursorLen, LongHint: ": pass a reply's next as it is", Str: &r.Cursor},
		intField("limit", optional, &limit),
	}
	seen, err := decodeObject(body, enc, fs, true)
	if err != nil {
		return ListRequest{}, err
	}
	if seen.Has(1) {
		p, err := DecodeCursor(r.Cursor)
		if err != nil {
			return ListRequest{}, err
		}
		if r.Namespace != "" && p.Namespace != r.Namespace {
			return ListRequest{}, badf("cursor continues a listing of namespace %q, not of %q: send the namespace the listing began with",
				p.Namespace, r.Namespace)
		}
	}
	if seen.Has(2) && (limit < 1 || limit > MaxListLimit) {
		return ListRequest{}, badf("limit %d out of range 1..%d (leave it out for %d)", limit, MaxListLimit, DefaultListLimit)
	}
	r.Limit = int(limit)
	return r, nil
}

// DecodeReset decodes and validates a reset body.
func DecodeReset(body []byte, enc Encoding) (ResetRequest, error) {
	var r ResetRequest
	var period string
	fs := []wire.Field{
		tokenField("namespace", required, &r.Namespace),
		identifierField("identifier", &r.Identifier),
		intField("duration", optional, &r.Duration),
		periodField(&period),
	}
	seen, err := decodeObject(body, enc, fs, false)
	if err != nil {
		return ResetRequest{}, err
	}
	if n := len(r.Identifier); n == 0 || n > window.MaxIdentifierLen {
		return ResetRequest{}, badf("identifier of %d bytes is not 1 to %d bytes", n, window.MaxIdentifierLen)
	}
	if r.Duration, err = durationOf(seen.Has(2), r.Duration, seen.Has(3), period, false, " (leave it out to reset every duration)"); err != nil {
		return ResetRequest{}, err
	}
	return r, nil
}

// periodField is "window": a calendar period (window.ParseCalendar), which
// a body names in place of a duration.
func periodField(dst *string) wire.Field {
	return wire.Field{Name: "window", Kind: wire.FieldString, MaxLen: maxPeriodLen, Str: dst}
}

// maxPeriodLen is the longest "window" value: a unit, "@" and the longest
// IANA zone name, with room to spare.
const maxPeriodLen = 64

// durationOf returns the duration a body names: its "duration"
// (milliseconds) or its "window" (a calendar period's code), never both,
// and one of them when required (else 0 when neither); rangeHint ends the
// error for milliseconds out of range (the words clients have seen since
// before calendar periods).
func durationOf(hasDuration bool, duration int64, hasPeriod bool, period string, required bool, rangeHint string) (int64, error) {
	switch {
	case hasDuration && hasPeriod:
		return 0, badf("duration and window both given: a calendar window is the duration, send one of them")
	case hasPeriod:
		code, ok, err := window.ParseCalendar(period)
		if !ok {
			return 0, badf("window %q is not a calendar period: %s", period, window.CalendarRule)
		}
		if err != nil {
			return 0, badf("window: %v", err)
		}
		return code, nil
	case !hasDuration && required:
		return 0, badf("duration is required (or a calendar window)")
	case hasDuration && (duration < window.MinDuration || duration > window.MaxDuration):
		return 0, badf("duration %d out of range %d..%d%s",
			duration, int64(window.MinDuration), int64(window.MaxDuration), rangeHint)
	}
	return duration, nil
}

// badRequest is the *wire.BadRequestError of err, a refusal by package
// policy's rules, without policy's "invalid policy: " and naming what
// (unless empty) when err's message does not.
func badRequest(what string, err error) error {
	msg := strings.TrimPrefix(err.Error(), policy.ErrInvalid.Error()+": ")
	if what != "" && !strings.Contains(msg, what) {
		msg = what + ": " + msg
	}
	return badf("%s", msg)
}

// decodeObject decodes body, one object of the fields fs, into them (the
// wire's strict object decoder, wire.DecodeObject) and returns which fields
// it held. With emptyOK an empty body is an object with no field. Every
// error is a *wire.BadRequestError saying what to fix.
func decodeObject(body []byte, enc Encoding, fs []wire.Field, emptyOK bool) (wire.Present, error) {
	if len(body) > MaxBodySize {
		return 0, badf("body of %d bytes is larger than %d", len(body), MaxBodySize)
	}
	if emptyOK && len(bytes.TrimSpace(body)) == 0 {
		return 0, nil
	}
	seen, err := wire.DecodeObject(body, enc, fs)
	if err != nil && !errors.As(err, new(*wire.BadRequestError)) {
		// A field table over the wire's bound, which these fixed tables
		// never are: still a refusal of the body, worded as the wire's.
		return 0, badf("%v", err)
	}
	return seen, err
}

// badf is the *wire.BadRequestError whose Msg is format with args, as
// fmt.Sprintf writes it: what the client must fix.
func badf(format string, args ...any) error {
	return &wire.BadRequestError{Msg: fmt.Sprintf(format, args...)}
}

// The fields of the policy endpoints' bodies, by kind.

// Whether a field is required.
const (
	required = true
	optional = false
)

// tokenField is a namespace: a token.
func tokenField(name string, req bool, dst *string) wire.Field {
	return wire.Field{Name: name, Kind: wire.FieldToken, Required: req, Str: dst}
}

// identifierField is an identifier or a pattern: any bytes, at most an
// identifier's length.
func identifierField(name string, dst *string) wire.Field {
	return wire.Field{Name: name, Kind: wire.FieldBytes, Required: true, MaxLen: window.MaxIdentifierLen, Str: dst}
}

// intField is an integer, in range by the rules the decoder applies after.
func intField(name string, req bool, dst *int64) wire.Field {
	return wire.Field{Name: name, Kind: wire.FieldInt, Required: req, Int: dst}
}

// boolField is true or false.
func boolField(name string, req bool, dst *bool) wire.Field {
	return wire.Field{Name: name, Kind: wire.FieldBool, Required: req, Bool: dst}
}
