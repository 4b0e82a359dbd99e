package adminwire

import (
	"bytes"
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

// durationKeys returns the key and value a body writes for duration d:
// "duration" and its milliseconds, or "window" and a calendar period's
// name.
func durationKeys(d int64) (ms int64, period string) {
	if window.IsCalendar(d) {
		return 0, window.CalendarName(d)
	}
	return d, ""
}

// jsonDuration is the "duration" value of a JSON body for duration d: its
// milliseconds, or none (nil) for a calendar period, written as "window".
func jsonDuration(d int64) *int64 {
	if window.IsCalendar(d) {
		return nil
	}
	return &d
}

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
// their shortest form, identifiers as str (any bytes). JSON is written by
// encoding/json, which shows bytes that are not valid UTF-8 as U+FFFD: ask
// in msgpack to see such identifiers as they are.

// AppendOverride appends o in enc to dst.
func AppendOverride(dst []byte, enc Encoding, o Override) []byte {
	ms, period := durationKeys(o.Duration)
	if enc == JSON {
		return appendJSON(dst, struct {
			Namespace  string `json:"namespace"`
			Identifier string `json:"identifier"`
			Limit      int64  `json:"limit"`
			Duration   *int64 `json:"duration,omitempty"`
			Window     string `json:"window,omitempty"`
			Shadow     bool   `json:"shadow"`
		}{o.Namespace, o.Identifier, o.Limit, jsonDuration(o.Duration), period, o.Shadow})
	}
	dst = msgp.AppendMapHeader(dst, 5)
	dst = msgp.AppendString(dst, "namespace")
	dst = msgp.AppendString(dst, o.Namespace)
	dst = msgp.AppendString(dst, "identifier")
	dst = msgp.AppendString(dst, o.Identifier)
	dst = msgp.AppendString(dst, "limit")
	dst = msgp.AppendInt64(dst, o.Limit)
	dst = appendDuration(dst, ms, period)
	dst = msgp.AppendString(dst, "shadow")
	return msgp.AppendBool(dst, o.Shadow)
}

// appendDuration appends the msgpack key and value of a duration as
// durationKeys gives them.
func appendDuration(dst []byte, ms int64, period string) []byte {
	if period != "" {
		dst = msgp.AppendString(dst, "window")
		return msgp.AppendString(dst, period)
	}
	dst = msgp.AppendString(dst, "duration")
	return msgp.AppendInt64(dst, ms)
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
	if enc == JSON {
		return appendJSON(dst, d)
	}
	dst = msgp.AppendMapHeader(dst, 1)
	dst = msgp.AppendString(dst, "deleted")
	return msgp.AppendBool(dst, d.Deleted)
}

// AppendReset appends r in enc to dst.
func AppendReset(dst []byte, enc Encoding, r ResetResponse) []byte {
	ms, period := durationKeys(r.Duration)
	if enc == JSON {
		return appendJSON(dst, struct {
			Namespace  string `json:"namespace"`
			Identifier string `json:"identifier"`
			Duration   *int64 `json:"duration,omitempty"` // 0: every duration
			Window     string `json:"window,omitempty"`
			Reset      int64  `json:"reset"`
		}{r.Namespace, r.Identifier, jsonDuration(r.Duration), period, r.Reset})
	}
	dst = msgp.AppendMapHeader(dst, 4)
	dst = msgp.AppendString(dst, "namespace")
	dst = msgp.AppendString(dst, r.Namespace)
	dst = msgp.AppendString(dst, "identifier")
	dst = msgp.AppendString(dst, r.Identifier)
	dst = appendDuration(dst, ms, period)
	dst = msgp.AppendString(dst, "reset")
	return msgp.AppendInt64(dst, r.Reset)
}

func appendJSON(dst []byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only strings, integers, booleans and slices of them: Marshal
		// cannot fail on these types.
		panic(fmt.Sprintf("adminwire: marshal %T: %v", v, err))
	}
	return append(dst, b...)
}

// Append appends r in enc to dst: the body a client sends to override.set
// (shadow left out when false).
func (r SetRequest) Append(dst []byte, enc Encoding) []byte {
	ms, period := durationKeys(r.Duration)
	if enc == JSON {
		return appendJSON(dst, struct {
			Namespace  string `json:"namespace"`
			Identifier string `json:"identifier"`
			Limit      int64  `json:"limit"`
			Duration   *int64 `json:"duration,omitempty"`
			Window     string `json:"window,omitempty"`
			Shadow     bool   `json:"shadow,omitempty"`
		}{r.Namespace, r.Identifier, r.Limit, jsonDuration(r.Duration), period, r.Shadow})
	}
	n := uint32(4)
	if r.Shadow {
		n++
	}
	dst = msgp.AppendMapHeader(dst, n)
	dst = msgp.AppendString(dst, "namespace")
	dst = msgp.AppendString(dst, r.Namespace)
	dst = msgp.AppendString(dst, "identifier")
	dst = msgp.AppendString(dst, r.Identifier)
	dst = msgp.AppendString(dst, "limit")
	dst = msgp.AppendInt64(dst, r.Limit)
	dst = appendDuration(dst, ms, period)
	if r.Shadow {
		dst = msgp.AppendString(dst, "shadow")
		dst = msgp.AppendBool(dst, true)
	}
	return dst
}

// Append appends r in enc to dst: the body of override.delete.
func (r DeleteRequest) Append(dst []byte, enc Encoding) []byte {
	if enc == JSON {
		return appendJSON(dst, struct {
			Namespace  string `json:"namespace"`
			Identifier string `json:"identifier"`
		}{r.Namespace, r.Identifier})
	}
	dst = msgp.AppendMapHeader(dst, 2)
	dst = msgp.AppendString(dst, "namespace")
	dst = msgp.AppendString(dst, r.Namespace)
	dst = msgp.AppendString(dst, "identifier")
	return msgp.AppendString(dst, r.Identifier)
}

// Append appends r in enc to dst: the body of override.get.
func (r GetRequest) Append(dst []byte, enc Encoding) []byte {
	return DeleteRequest(r).Append(dst, enc)
}

// Append appends r in enc to dst: the body of override.list (namespace,
// cursor and limit each left out when empty or 0).
func (r ListRequest) Append(dst []byte, enc Encoding) []byte {
	if enc == JSON {
		return appendJSON(dst, struct {
			Namespace string `json:"namespace,omitempty"`
			Cursor    string `json:"cursor,omitempty"`
			Limit     int    `json:"limit,omitempty"`
		}{r.Namespace, r.Cursor, r.Limit})
	}
	n := uint32(0)
	for _, present := range []bool{r.Namespace != "", r.Cursor != "", r.Limit != 0} {
		if present {
			n++
		}
	}
	dst = msgp.AppendMapHeader(dst, n)
	if r.Namespace != "" {
		dst = msgp.AppendString(dst, "namespace")
		dst = msgp.AppendString(dst, r.Namespace)
	}
	if r.Cursor != "" {
		dst = msgp.AppendString(dst, "cursor")
		dst = msgp.AppendString(dst, r.Cursor)
	}
	if r.Limit != 0 {
		dst = msgp.AppendString(dst, "limit")
		dst = msgp.AppendInt64(dst, int64(r.Limit))
	}
	return dst
}

// Append appends r in enc to dst: the body of reset (duration left out when
// 0: every duration).
func (r ResetRequest) Append(dst []byte, enc Encoding) []byte {
	ms, period := durationKeys(r.Duration)
	if enc == JSON {
		return appendJSON(dst, struct {
			Namespace  string `json:"namespace"`
			Identifier string `json:"identifier"`
			Duration   int64  `json:"duration,omitempty"`
			Window     string `json:"window,omitempty"`
		}{r.Namespace, r.Identifier, ms, period})
	}
	n := uint32(2)
	if r.Duration != 0 {
		n++
	}
	dst = msgp.AppendMapHeader(dst, n)
	dst = msgp.AppendString(dst, "namespace")
	dst = msgp.AppendString(dst, r.Namespace)
	dst = msgp.AppendString(dst, "identifier")
	dst = msgp.AppendString(dst, r.Identifier)
	if r.Duration != 0 {
		dst = appendDuration(dst, ms, period)
	}
	return dst
}

// overrideFields are the fields of an Override, all required (duration
// or window: durationOf).
func overrideFields(o *Override, period *string) []wire.Field {
	return []wire.Field{
		tokenField("namespace", required, &o.Namespace),
		identifierField("identifier", &o.Identifier),
		intField("limit", required, &o.Limit),
		intField("duration", optional, &o.Duration),
		boolField("shadow", required, &o.Shadow),
		periodField(period),
	}
}

// DecodeOverride decodes the reply of override.set (for clients), with the
// strictness of the request decoders: every field present, none other.
func DecodeOverride(body []byte, enc Encoding) (Override, error) {
	var o Override
	var period string
	seen, err := decodeObject(body, enc, overrideFields(&o, &period), false)
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
	var elems [][]byte
	var next *string
	switch enc {
	case JSON:
		var raw struct {
			Overrides *[]json.RawMessage `json:"overrides"`
			Next      json.RawMessage    `json:"next"` // nil: absent
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&raw); err != nil {
			return ListResponse{}, badf("list response: %v", err)
		}
		if dec.More() {
			return ListResponse{}, badf("list response: trailing bytes")
		}
		if raw.Overrides == nil {
			return ListResponse{}, badf("list response: missing field \"overrides\"")
		}
		for _, r := range *raw.Overrides {
			elems = append(elems, r)
		}
		if raw.Next != nil {
			var s string
			if string(raw.Next) == "null" || json.Unmarshal(raw.Next, &s) != nil {
				return ListResponse{}, badf("list response: next must be a string")
			}
			next = &s
		}
	default:
		b := body
		n, b, err := msgp.ReadMapHeaderBytes(b)
		if err != nil || n < 1 || n > 2 {
			return ListResponse{}, badf("list response must be a map of \"overrides\" and, optionally, \"next\"")
		}
		for range n {
			var key []byte
			if key, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return ListResponse{}, badf("malformed msgpack: %v", err)
			}
			switch {
			case string(key) == "overrides" && elems == nil:
				var count uint32
				if count, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
					return ListResponse{}, badf("list response: overrides must be an array")
				}
				elems = make([][]byte, 0, min(count, MaxListLimit))
				for i := uint32(0); i < count; i++ {
					rest, err := msgp.Skip(b)
					if err != nil {
						return ListResponse{}, badf("malformed msgpack: %v", err)
					}
					elems = append(elems, b[:len(b)-len(rest)])
					b = rest
				}
			case string(key) == "next" && next == nil:
				var s string
				if s, b, err = msgp.ReadStringBytes(b); err != nil {
					return ListResponse{}, badf("list response: next must be a string")
				}
				next = &s
			default:
				return ListResponse{}, badf("list response: unexpected or duplicate field %q", cutKey(key))
			}
		}
		if elems == nil {
			return ListResponse{}, badf("list response: missing field \"overrides\"")
		}
		if len(b) != 0 {
			return ListResponse{}, badf("%d trailing bytes after the msgpack map", len(b))
		}
	}
	l := ListResponse{Overrides: make([]Override, 0, len(elems))}
	if next != nil {
		if len(*next) == 0 || len(*next) > MaxCursorLen {
			return ListResponse{}, badf("list response: next of %d bytes is not 1 to %d", len(*next), MaxCursorLen)
		}
		l.Next = *next
	}
	for i, e := range elems {
		o, err := DecodeOverride(e, enc)
		if err != nil {
			return ListResponse{}, badf("override %d: %v", i, err)
		}
		l.Overrides = append(l.Overrides, o)
	}
	return l, nil
}

// cutKey shortens a key for an error message, as wire.DecodeObject does.
func cutKey(k []byte) string {
	if len(k) > 64 {
		return string(k[:64]) + "…"
	}
	return string(k)
}

// MaxListBodySize bounds a list reply a client decodes: the most overrides
// a workspace holds, at their largest.
const MaxListBodySize = policy.MaxOverridesPerWorkspace * 4 << 10
