// Package adminwire holds the wire shapes of the policy endpoints of the
// ratelimit-admin service (README, "Overrides and shadow mode"): subjects, request and response
// bodies, in JSON or msgpack, with strict decoders.
//
// A request decoder refuses, with an error that says what to fix, anything
// but one object (map) of the endpoint's fields: unknown, duplicate and
// missing fields, values of the wrong type (integers only: fractions,
// exponents and floats are refused; null is a wrong type), out-of-range
// values (by package policy's rules), trailing bytes, and bodies over
// MaxBodySize. What it returns is valid: the caller may apply it as is.
// Decoders never panic (fuzzed).
//
// Identifiers are bytes: msgpack carries them as str or bin, and JSON as
// strings, which must then be valid UTF-8 (a JSON body that is not is
// refused whole, since JSON cannot carry other bytes faithfully; use
// msgpack for such identifiers).
package adminwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tinylib/msgp/msgp"

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

// ErrMalformed is wrapped by every decoding error: the body breaks the
// wire's rules. A request that fails so is answered 400 with the error's
// text, and nothing is changed.
var ErrMalformed = errors.New("malformed")

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
// an error wrapping ErrMalformed when it is not a policy endpoint's
// subject with a valid workspace.
func ParseSubject(prefix, subject string) (string, Op, error) {
	rest, ok := strings.CutPrefix(subject, prefix+".admin.")
	ws, op, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return "", "", fmt.Errorf("%w: subject %q is not %s.admin.<workspace>.<operation>", ErrMalformed, subject, prefix)
	}
	if !window.ValidToken(ws) {
		return "", "", fmt.Errorf("%w: %w", ErrMalformed, window.TokenError("workspace", ws))
	}
	switch Op(op) {
	case OpSet, OpGet, OpDelete, OpList, OpReset:
		return ws, Op(op), nil
	}
	return "", "", fmt.Errorf("%w: unknown operation %q (override.set, override.get, override.delete, override.list, reset)", ErrMalformed, op)
}

// SetRequest is the body of override.set.
type SetRequest struct {
	Namespace  string
	Identifier string // the pattern: an identifier, or bytes where each '*' matches any run (policy.ValidatePattern)
	Limit      int64
	Duration   int64 // milliseconds
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

// GetRequest is the body of override.get: the override of one pattern,
// exactly as it was set.
type GetRequest struct {
	Namespace  string
	Identifier string // the pattern
}

// Key returns the override's key in workspace.
func (r GetRequest) Key(workspace string) policy.Key {
	return policy.Key{Workspace: workspace, Namespace: r.Namespace, Pattern: r.Identifier}
}

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
	Duration   int64  // milliseconds; 0 (absent): every duration
}

// field kinds.
const (
	kindToken  = iota // a workspace-style token
	kindBytes         // any bytes (identifier, pattern)
	kindCursor        // a string of at most MaxCursorLen bytes (msgpack: str only)
	kindInt
	kindBool
)

// field is one key of an object: its name, kind, whether it is required,
// and where its value goes.
type field struct {
	name     string
	kind     int
	required bool
	str      *string
	num      *int64
	flag     *bool
	seen     bool
}

// DecodeSet decodes and validates an override.set body.
func DecodeSet(body []byte, enc Encoding) (SetRequest, error) {
	var r SetRequest
	fs := []field{
		{name: "namespace", kind: kindToken, required: true, str: &r.Namespace},
		{name: "identifier", kind: kindBytes, required: true, str: &r.Identifier},
		{name: "limit", kind: kindInt, required: true, num: &r.Limit},
		{name: "duration", kind: kindInt, required: true, num: &r.Duration},
		{name: "shadow", kind: kindBool, flag: &r.Shadow},
	}
	if err := decodeObject(body, enc, fs, false); err != nil {
		return SetRequest{}, err
	}
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
	fs := []field{
		{name: "namespace", kind: kindToken, required: true, str: &r.Namespace},
		{name: "identifier", kind: kindBytes, required: true, str: &r.Identifier},
	}
	if err := decodeObject(body, enc, fs, false); err != nil {
		return DeleteRequest{}, err
	}
	if err := policy.ValidatePattern(r.Identifier); err != nil {
		return DeleteRequest{}, badRequest("identifier", err)
	}
	return r, nil
}

// DecodeGet decodes and validates an override.get body.
func DecodeGet(body []byte, enc Encoding) (GetRequest, error) {
	var r GetRequest
	fs := []field{
		{name: "namespace", kind: kindToken, required: true, str: &r.Namespace},
		{name: "identifier", kind: kindBytes, required: true, str: &r.Identifier},
	}
	if err := decodeObject(body, enc, fs, false); err != nil {
		return GetRequest{}, err
	}
	if err := policy.ValidatePattern(r.Identifier); err != nil {
		return GetRequest{}, badRequest("identifier", err)
	}
	return r, nil
}

// DecodeList decodes and validates an override.list body; an empty body
// (or only white space) is a request for the first page of every
// namespace. A cursor must be one EncodeCursor wrote, and, when the
// request names a namespace, one of that namespace's listing; a limit must
// be 1 to MaxListLimit.
func DecodeList(body []byte, enc Encoding) (ListRequest, error) {
	var r ListRequest
	var limit int64
	fs := []field{
		{name: "namespace", kind: kindToken, str: &r.Namespace},
		{name: "cursor", kind: kindCursor, str: &r.Cursor},
		{name: "limit", kind: kindInt, num: &limit},
	}
	if err := decodeObject(body, enc, fs, true); err != nil {
		return ListRequest{}, err
	}
	if fs[1].seen {
		p, err := DecodeCursor(r.Cursor)
		if err != nil {
			return ListRequest{}, err
		}
		if r.Namespace != "" && p.Namespace != r.Namespace {
			return ListRequest{}, fmt.Errorf("%w: cursor continues a listing of namespace %q, not of %q: send the namespace the listing began with",
				ErrMalformed, p.Namespace, r.Namespace)
		}
	}
	if fs[2].seen && (limit < 1 || limit > MaxListLimit) {
		return ListRequest{}, fmt.Errorf("%w: limit %d out of range 1..%d (leave it out for %d)", ErrMalformed, limit, MaxListLimit, DefaultListLimit)
	}
	r.Limit = int(limit)
	return r, nil
}

// DecodeReset decodes and validates a reset body.
func DecodeReset(body []byte, enc Encoding) (ResetRequest, error) {
	var r ResetRequest
	fs := []field{
		{name: "namespace", kind: kindToken, required: true, str: &r.Namespace},
		{name: "identifier", kind: kindBytes, required: true, str: &r.Identifier},
		{name: "duration", kind: kindInt, num: &r.Duration},
	}
	if err := decodeObject(body, enc, fs, false); err != nil {
		return ResetRequest{}, err
	}
	if n := len(r.Identifier); n == 0 || n > window.MaxIdentifierLen {
		return ResetRequest{}, fmt.Errorf("%w: identifier of %d bytes is not 1 to %d bytes", ErrMalformed, n, window.MaxIdentifierLen)
	}
	if fs[2].seen && (r.Duration < window.MinDuration || r.Duration > window.MaxDuration) {
		return ResetRequest{}, fmt.Errorf("%w: duration %d out of range %d..%d (leave it out to reset every duration)",
			ErrMalformed, r.Duration, int64(window.MinDuration), int64(window.MaxDuration))
	}
	return r, nil
}

func badRequest(what string, err error) error {
	msg := strings.TrimPrefix(err.Error(), policy.ErrInvalid.Error()+": ")
	if what != "" && !strings.Contains(msg, what) {
		msg = what + ": " + msg
	}
	return fmt.Errorf("%w: %s", ErrMalformed, msg)
}

// decodeObject decodes body, one object of the fields fs, into them and
// checks that every required one was there. With emptyOK an empty body is
// an object with no field.
func decodeObject(body []byte, enc Encoding, fs []field, emptyOK bool) error {
	if len(body) > MaxBodySize {
		return fmt.Errorf("%w: body of %d bytes is larger than %d", ErrMalformed, len(body), MaxBodySize)
	}
	if emptyOK && len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	var err error
	switch enc {
	case JSON:
		err = decodeJSON(body, fs)
	case Msgpack:
		err = decodeMsgpack(body, fs)
	default:
		err = fmt.Errorf("%w: unknown encoding %d", ErrMalformed, enc)
	}
	if err != nil {
		return err
	}
	for i := range fs {
		if fs[i].required && !fs[i].seen {
			return fmt.Errorf("%w: missing field %q", ErrMalformed, fs[i].name)
		}
	}
	return nil
}

// lookup returns the field named key, or an error for an unknown or
// duplicate one.
func lookup(fs []field, key []byte) (*field, error) {
	for i := range fs {
		if fs[i].name == string(key) {
			if fs[i].seen {
				return nil, fmt.Errorf("%w: duplicate field %q", ErrMalformed, key)
			}
			fs[i].seen = true
			return &fs[i], nil
		}
	}
	return nil, fmt.Errorf("%w: unknown field %q", ErrMalformed, quoteKey(key))
}

// quoteKey shortens a key for an error message.
func quoteKey(k []byte) string {
	if len(k) > 64 {
		return string(k[:64]) + "…"
	}
	return string(k)
}

// setString stores s in f after checking it against f's kind.
func setString(f *field, s []byte) error {
	switch f.kind {
	case kindToken:
		if !window.ValidToken(s) {
			return fmt.Errorf("%w: %s %q is not %s", ErrMalformed, f.name, quoteKey(s), window.TokenRule)
		}
	case kindCursor:
		if len(s) > MaxCursorLen {
			return fmt.Errorf("%w: %s of %d bytes is longer than %d: pass a reply's next as it is", ErrMalformed, f.name, len(s), MaxCursorLen)
		}
	default:
		if len(s) > window.MaxIdentifierLen {
			return fmt.Errorf("%w: %s of %d bytes is longer than %d", ErrMalformed, f.name, len(s), window.MaxIdentifierLen)
		}
	}
	*f.str = string(s)
	return nil
}

func typeError(f *field) error {
	switch f.kind {
	case kindInt:
		return fmt.Errorf("%w: %s must be an integer", ErrMalformed, f.name)
	case kindBool:
		return fmt.Errorf("%w: %s must be true or false", ErrMalformed, f.name)
	}
	return fmt.Errorf("%w: %s must be a string", ErrMalformed, f.name)
}

// decodeJSON decodes one JSON object of scalar fields.
func decodeJSON(body []byte, fs []field) error {
	if !utf8.Valid(body) {
		return fmt.Errorf("%w: JSON body is not valid UTF-8 (send identifiers of other bytes in msgpack)", ErrMalformed)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return jsonError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("%w: body must be a JSON object", ErrMalformed)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return jsonError(err)
		}
		key, _ := tok.(string) // object keys are always strings
		f, err := lookup(fs, []byte(key))
		if err != nil {
			return err
		}
		tok, err = dec.Token()
		if err != nil {
			return jsonError(err)
		}
		switch v := tok.(type) {
		case string:
			if f.kind != kindToken && f.kind != kindBytes && f.kind != kindCursor {
				return typeError(f)
			}
			if err := setString(f, []byte(v)); err != nil {
				return err
			}
		case json.Number:
			if f.kind != kindInt {
				return typeError(f)
			}
			if strings.ContainsAny(string(v), ".eE") {
				return typeError(f)
			}
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return fmt.Errorf("%w: %s %s is out of range", ErrMalformed, f.name, v)
			}
			*f.num = n
		case bool:
			if f.kind != kindBool {
				return typeError(f)
			}
			*f.flag = v
		default: // null, or an object or array
			return typeError(f)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: trailing bytes after the JSON object", ErrMalformed)
	}
	return nil
}

func jsonError(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: malformed JSON: unexpected end of body", ErrMalformed)
	}
	return fmt.Errorf("%w: malformed JSON: %v", ErrMalformed, err)
}

// decodeMsgpack decodes one msgpack map of scalar fields.
func decodeMsgpack(b []byte, fs []field) error {
	if msgp.NextType(b) != msgp.MapType {
		return fmt.Errorf("%w: body must be a msgpack map", ErrMalformed)
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return msgpackError(err)
	}
	if int(n) > len(fs) {
		// More keys than fields: one is unknown or a duplicate; find which.
		n = min(n, uint32(len(fs)+1))
	}
	for i := uint32(0); i < n; i++ {
		var key []byte
		if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return msgpackError(err)
		}
		f, err := lookup(fs, key)
		if err != nil {
			return err
		}
		switch t := msgp.NextType(b); {
		case t == msgp.StrType && (f.kind == kindToken || f.kind == kindBytes || f.kind == kindCursor):
			var s []byte
			if s, b, err = msgp.ReadStringZC(b); err != nil {
				return msgpackError(err)
			}
			if err := setString(f, s); err != nil {
				return err
			}
		case t == msgp.BinType && f.kind == kindBytes:
			var s []byte
			if s, b, err = msgp.ReadBytesZC(b); err != nil {
				return msgpackError(err)
			}
			if err := setString(f, s); err != nil {
				return err
			}
		case (t == msgp.IntType || t == msgp.UintType) && f.kind == kindInt:
			if *f.num, b, err = msgp.ReadInt64Bytes(b); err != nil {
				var ie msgp.UintOverflow
				if errors.As(err, &ie) {
					return fmt.Errorf("%w: %s %d is out of range", ErrMalformed, f.name, ie.Value)
				}
				return msgpackError(err)
			}
		case t == msgp.BoolType && f.kind == kindBool:
			if *f.flag, b, err = msgp.ReadBoolBytes(b); err != nil {
				return msgpackError(err)
			}
		default:
			return typeError(f)
		}
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes after the msgpack map", ErrMalformed, len(b))
	}
	return nil
}

func msgpackError(err error) error {
	return fmt.Errorf("%w: malformed msgpack: %v", ErrMalformed, err)
}
