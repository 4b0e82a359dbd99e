package adminwire

import (
	"encoding/json"
	"fmt"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// Override is one override as the endpoints answer it: the reply of
// override.set and override.get (the override as stored) and an element of
// override.list.
//
// Duration is milliseconds, or a calendar period's code (window.Calendar),
// which the bodies write as "window" in place of "duration".
type Override struct {
	Namespace  string `json:"namespace"`
	Identifier string `json:"identifier"` // the pattern
	Limit      int64  `json:"limit"`
	Duration   int64  `json:"duration"`
	Shadow     bool   `json:"shadow"`
}

// MarshalJSON writes o as AppendOverride does: a calendar period as
// "window".
func (o Override) MarshalJSON() ([]byte, error) { return AppendOverride(nil, JSON, o), nil }

// MarshalJSON writes r as AppendReset does: a calendar period as "window".
func (r ResetResponse) MarshalJSON() ([]byte, error) { return AppendReset(nil, JSON, r), nil }

// FromEntry returns the override e holds.
func FromEntry(e policy.Entry) Override {
	return Override{Namespace: e.Namespace, Identifier: e.Pattern, Limit: e.Limit, Duration: e.Duration, Shadow: e.Shadow}
}

// ListResponse is the reply of override.list: {"overrides": [...]}, ordered
// by namespace and pattern, and "next", the cursor of the page that
// follows, written only when more overrides follow.
type ListResponse struct {
	Overrides []Override `json:"overrides"`
	Next      string     `json:"next,omitempty"`
}

// DeleteResponse is the reply of override.delete: {"deleted": true}.
type DeleteResponse struct {
	Deleted bool `json:"deleted"`
}

// ResetResponse is the reply of reset: what was reset and the reset's
// epoch (unix ms): checks of the identifier after it start from zero.
type ResetResponse struct {
	Namespace  string `json:"namespace"`
	Identifier string `json:"identifier"`
	Duration   int64  `json:"duration"` // 0: every duration
	Reset      int64  `json:"reset"`
}

// The encoders write msgpack maps with the JSON names as keys, integers in
// their shortest form, identifiers as str (any bytes), and in JSON the bytes
// encoding/json writes for the same keys and values, which show bytes that
// are not valid UTF-8 as U+FFFD: ask in msgpack to see such identifiers as
// they are.

// member is one key of a body and its value: a string, an int64, a bool
// or an encodedList.
// An omitted member is left out of the body.
type member struct {
	key  string
	val  any
	omit bool
}

// appendObject appends the object of ms, in order and without the omitted
// ones, in enc to dst.
func appendObject(dst []byte, enc Encoding, ms ...member) []byte {
	n := 0
	for _, m := range ms {
		if !m.omit {
			n++
		}
	}
	if enc == JSON {
		dst = append(dst, '{')
		for _, m := range ms {
			if m.omit {
				continue
			}
			if dst[len(dst)-1] != '{' {
				dst = append(dst, ',')
			}
			dst = append(appendJSON(dst, m.key), ':')
			dst = appendJSON(dst, m.val)
		}
		return append(dst, '}')
	}
	dst = msgp.AppendMapHeader(dst, uint32(n))
	for _, m := range ms {
		if m.omit {
			continue
		}
		var err error
		if dst, err = msgp.AppendIntf(msgp.AppendString(dst, m.key), m.val); err != nil {
			// Only strings, integers, booleans and lists: msgp writes every one.
			panic(fmt.Sprintf("adminwire: member %q: %v", m.key, err))
		}
	}
	return dst
}

// durationMembers are the members of a duration d: "duration", its
// milliseconds, or "window", its calendar period.
func durationMembers(d int64) (member, member) {
	cal := window.IsCalendar(d)
	return member{key: "duration", val: d, omit: cal}, member{key: "window", val: window.CalendarName(d), omit: !cal}
}

// AppendOverride appends o in enc to dst.
func AppendOverride(dst []byte, enc Encoding, o Override) []byte {
	dur, win := durationMembers(o.Duration)
	return appendObject(dst, enc, member{key: "namespace", val: o.Namespace}, member{key: "identifier", val: o.Identifier},
		member{key: "limit", val: o.Limit}, dur, win, member{key: "shadow", val: o.Shadow})
}

// AppendList appends l in enc to dst; a nil list is written as empty, and
// next only when it is not "". The bytes are those encoding/json writes
// for l in JSON.
func AppendList(dst []byte, enc Encoding, l ListResponse) []byte {
	w := NewListWriter(enc, 0)
	for _, o := range l.Overrides {
		w.Add(o)
	}
	return w.Append(dst, l.Next)
}

// AppendDelete appends d in enc to dst.
func AppendDelete(dst []byte, enc Encoding, d DeleteResponse) []byte {
	return appendObject(dst, enc, member{key: "deleted", val: d.Deleted})
}

// AppendReset appends r in enc to dst (a duration of 0, every duration, is
// written as such).
func AppendReset(dst []byte, enc Encoding, r ResetResponse) []byte {
	dur, win := durationMembers(r.Duration)
	return appendObject(dst, enc, member{key: "namespace", val: r.Namespace}, member{key: "identifier", val: r.Identifier},
		dur, win, member{key: "reset", val: r.Reset})
}

func appendJSON(dst []byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only strings, integers, booleans and lists: Marshal cannot fail on them.
		panic(fmt.Sprintf("adminwire: marshal %T: %v", v, err))
	}
	return append(dst, b...)
}

// Append appends r in enc to dst: the body a client sends to override.set
// (shadow left out when false).
func (r SetRequest) Append(dst []byte, enc Encoding) []byte {
	dur, win := durationMembers(r.Duration)
	return appendObject(dst, enc, member{key: "namespace", val: r.Namespace}, member{key: "identifier", val: r.Identifier},
		member{key: "limit", val: r.Limit}, dur, win, member{key: "shadow", val: true, omit: !r.Shadow})
}

// Append appends r in enc to dst: the body of override.delete.
func (r DeleteRequest) Append(dst []byte, enc Encoding) []byte {
	return appendObject(dst, enc, member{key: "namespace", val: r.Namespace}, member{key: "identifier", val: r.Identifier})
}

// Append appends r in enc to dst: the body of override.list (namespace,
// cursor and limit each left out when empty or 0).
func (r ListRequest) Append(dst []byte, enc Encoding) []byte {
	return appendObject(dst, enc, member{key: "namespace", val: r.Namespace, omit: r.Namespace == ""},
		member{key: "cursor", val: r.Cursor, omit: r.Cursor == ""}, member{key: "limit", val: int64(r.Limit), omit: r.Limit == 0})
}

// Append appends r in enc to dst: the body of reset (duration left out when
// 0: every duration).
func (r ResetRequest) Append(dst []byte, enc Encoding) []byte {
	dur, win := durationMembers(r.Duration)
	dur.omit = dur.omit || r.Duration == 0
	return appendObject(dst, enc, member{key: "namespace", val: r.Namespace}, member{key: "identifier", val: r.Identifier}, dur, win)
}

// DecodeOverride decodes the reply of override.set (for clients), with the
// strictness of the request decoders: every field present, none other.
func DecodeOverride(body []byte, enc Encoding) (Override, error) {
	return decodeOverride(body, enc, required)
}

// decodeOverride decodes an override's fields, shadow required or not,
// and a duration or a calendar window, one of them.
func decodeOverride(body []byte, enc Encoding, shadow bool) (Override, error) {
	var o Override
	var period string
	seen, err := decodeObject(body, enc, []wire.Field{
		tokenField("namespace", required, &o.Namespace),
		identifierField("identifier", &o.Identifier),
		intField("limit", required, &o.Limit),
		intField("duration", optional, &o.Duration),
		boolField("shadow", shadow, &o.Shadow),
		periodField(&period),
	}, false)
	if err != nil {
		return Override{}, err
	}
	if o.Duration, err = durationOf(seen.Has(3), o.Duration, seen.Has(5), period, true, ""); err != nil {
		return Override{}, err
	}
	return o, nil
}

// DecodeResetResponse decodes the reply of reset (for clients), with the
// strictness of the request decoders: every field present, none other.
func DecodeResetResponse(body []byte, enc Encoding) (ResetResponse, error) {
	var r ResetResponse
	var period string
	seen, err := decodeObject(body, enc, []wire.Field{
		tokenField("namespace", required, &r.Namespace),
		identifierField("identifier", &r.Identifier),
		intField("duration", optional, &r.Duration),
		intField("reset", required, &r.Reset),
		periodField(&period),
	}, false)
	if err != nil {
		return ResetResponse{}, err
	}
	if seen.Has(2) && r.Duration == 0 && !seen.Has(4) {
		return r, nil // every duration
	}
	if r.Duration, err = durationOf(seen.Has(2), r.Duration, seen.Has(4), period, true, ""); err != nil {
		return ResetResponse{}, err
	}
	return r, nil
}

// DecodeListResponse decodes the reply of override.list (for clients):
// the field "overrides", an array of overrides as DecodeOverride reads
// them, and optionally "next", a cursor of 1 to MaxCursorLen bytes (read as
// opaque); no other field.
func DecodeListResponse(body []byte, enc Encoding) (ListResponse, error) {
	if len(body) > MaxListBodySize {
		return ListResponse{}, badf("body of %d bytes is larger than %d", len(body), MaxListBodySize)
	}
	var (
		l     ListResponse
		elems [][]byte
	)
	seen, err := wire.DecodeObject(body, enc, []wire.Field{
		{Name: "overrides", Kind: wire.FieldList, Required: true, List: &elems},
		{Name: "next", Kind: wire.FieldString, MaxLen: MaxCursorLen, Str: &l.Next},
	})
	if err != nil {
		return ListResponse{}, badf("list response: %v", err)
	}
	if seen.Has(1) && l.Next == "" {
		return ListResponse{}, badf("list response: next of 0 bytes is not 1 to %d", MaxCursorLen)
	}
	l.Overrides = make([]Override, len(elems))
	for i, e := range elems {
		if l.Overrides[i], err = DecodeOverride(e, enc); err != nil {
			return ListResponse{}, badf("override %d: %v", i, err)
		}
	}
	return l, nil
}

// MaxListBodySize bounds a list reply a client decodes: the most overrides
// a workspace holds, at their largest.
const MaxListBodySize = policy.MaxOverridesPerWorkspace * 4 << 10
