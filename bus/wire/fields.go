package wire

import (
	"github.com/sluicehq/sluice/window"
)

// The fields of a check object, described once. The strict JSON and
// msgpack decoders read a check's keys by this table: which keys exist
// (namespace only in batch and checks messages), which are required and in
// what order a missing one is reported, whether a value is a string or an
// integer, and the rule it must satisfy with its error message. The
// decoders only read values in their encoding; what a value must be is
// here. The one hand-tuned decoder of the usual msgpack shape (fastCheckMap)
// accepts a subset of what this table accepts and leaves every refusal, and
// its message, to it.

// checkField describes one key of a check object.
type checkField struct {
	name string
	bit  uint8
	// batchOnly: the key exists only in the checks of batch and checks
	// messages (the single check takes its namespace from the subject).
	batchOnly bool
	// required: a check without the key is refused with "<name> is
	// required"; the table's order is the order in which missing keys are
	// reported.
	required bool
	// ints is the range of an integer field, nil for a string or boolean
	// field.
	ints *wireIntField
	// boolean: the value is true or false (an optional field, false when
	// absent).
	boolean bool
	// dflt is what an optional integer field holds when its key is absent.
	dflt int64
}

// The fields' values are stored by a switch on the field rather than
// through function values, so that escape analysis keeps a decoder's check
// on its stack (a call through a function value makes it escape).

// setInt stores the integer v of field f, already checked against f.ints.
func (f *checkField) setInt(c *BatchCheck, v int64) {
	switch f.bit {
	case ckLimit:
		c.Limit = v
	case ckDuration:
		c.Duration = v
	case ckCost:
		c.Cost = v
	}
}

// setBool stores the boolean v of field f.
func (f *checkField) setBool(c *BatchCheck, v bool) {
	if f.bit == ckShadow {
		c.Shadow = v
	}
}

// typeError is the error for a value of the wrong type.
func (f *checkField) typeError() error {
	switch {
	case f.ints != nil:
		return f.ints.typeError()
	case f.boolean:
		return wireErr(f.name + " must be a boolean")
	}
	return wireErrNotString(f.name)
}

// setString checks the string s of field f against its rule and stores it
// (bodyString; a namespace equal to prevNS reuses it). A calendar window is
// noted in seen: it sets the duration, whose key must then be absent.
func (f *checkField) setString(c *BatchCheck, s []byte, view bool, prevNS string, seen *checkSeen) error {
	switch f.bit {
	case ckNamespace:
		if !window.ValidToken(s) {
			return wireErrNamespace
		}
		c.Namespace = bodyString(s, view, prevNS)
	case ckWindow:
		switch string(s) {
		case "sliding":
			c.Fixed = false
		case "fixed":
			c.Fixed = true
		default:
			code, ok, err := window.ParseCalendar(string(s))
			switch {
			case !ok:
				return wireErrWindow
			case err != nil:
				return wireErr("window: " + err.Error())
			}
			c.Duration, c.Fixed = code, true
			*seen |= ckCalendar
		}
	case ckCharge:
		ch, err := window.ParseCharge(string(s))
		if err != nil {
			return wireErr("charge must be all, drain or debit")
		}
		c.Charge = ch
	case ckIdentifier:
		if len(s) == 0 || len(s) > MaxIdentifierLen {
			return wireErrIdentifierLen(len(s))
		}
		c.Identifier = bodyString(s, view, "")
	}
	return nil
}

// checkFields is the table, in the order missing keys are reported.
var checkFields = [...]checkField{
	{name: "namespace", bit: ckNamespace, batchOnly: true, required: true},
	{name: "identifier", bit: ckIdentifier, required: true},
	{name: "limit", bit: ckLimit, required: true, ints: &wireLimitField},
	{name: "duration", bit: ckDuration, required: true, ints: &wireDurationField},
	{name: "cost", bit: ckCost, ints: &wireCostField, dflt: 1},
	{name: "shadow", bit: ckShadow, boolean: true},
	{name: "window", bit: ckWindow},
	{name: "charge", bit: ckCharge},
}

// checkFieldOf returns the field named key, or nil when a check (a batch's
// or checks message's with batch) has no such key.
func checkFieldOf(key []byte, batch bool) *checkField {
	for i := range checkFields {
		if f := &checkFields[i]; string(key) == f.name && (batch || !f.batchOnly) {
			return f
		}
	}
	return nil
}

// checkSeen records the keys of one check object as a decoder reads them
// (the field bits), and ckCalendar.
type checkSeen uint16

// ckCalendar is set in checkSeen when the window is a calendar period.
const ckCalendar checkSeen = 1 << 8

var wireErrCalendarDuration = wireErr("duration must be absent with a calendar window: the period is the window")

var wireErrWindow = wireErr("window must be sliding, fixed or a calendar period: " + window.CalendarRule)

// add marks f as read, or returns the duplicate-key error when it was.
func (s *checkSeen) add(f *checkField, key []byte) error {
	if uint8(*s)&f.bit != 0 {
		return wireErrDuplicateField(key)
	}
	*s |= checkSeen(f.bit)
	return nil
}

// finish reports the first required key missing and gives every absent
// optional integer its default. The decoders begin from a zero check, which
// holds the other optional fields' defaults (not shadow, sliding, charge
// all: window.ChargeAll is the zero Charge).
func (s checkSeen) finish(c *BatchCheck, batch bool) error {
	if s&ckCalendar != 0 && uint8(s)&ckDuration != 0 {
		return wireErrCalendarDuration
	}
	for i := range checkFields {
		f := &checkFields[i]
		switch {
		case uint8(s)&f.bit != 0 || f.batchOnly && !batch:
		case f.bit == ckDuration && s&ckCalendar != 0: // the calendar period is the duration
		case f.required:
			return wireErrRequired(f.name)
		case f.ints != nil:
			f.setInt(c, f.dflt)
		}
	}
	return nil
}
