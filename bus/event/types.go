package event

// The hand-written parts of the codecs: the types msg.go's structs use where
// the generated code alone would not enforce the rules (see the package
// comment), and the codecs of the cells' entries (components,
// imports), which convert between the generated wire structs and global's
// types one entry at a time.

import (
	"math"
	"strconv"
	"unique"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// Fields of each kind of entry.
const (
	componentFields = 8
	importFields    = 8
)

// --- tokens and identifiers ----------------------------------------------------

// token is a workspace, namespace or region: a msgpack str satisfying
// window.ValidToken.
type token string

// MarshalMsg appends t as a str.
func (t token) MarshalMsg(b []byte) ([]byte, error) { return msgp.AppendString(b, string(t)), nil }

// Msgsize bounds the size MarshalMsg appends.
func (t token) Msgsize() int { return msgp.StringPrefixSize + len(t) }

// UnmarshalMsg reads a str satisfying window.ValidToken. A token equal to
// the one *t holds (the previous entry's, which the entry codecs set there)
// keeps its string; any other is interned with unique.Make, so a bridge
// holding many cells of a region keeps one copy of each token, and the
// result never aliases b.
func (t *token) UnmarshalMsg(b []byte) ([]byte, error) {
	var v, o []byte
	if len(b) != 0 && b[0]&0xe0 == 0xa0 && len(b) > int(b[0]&0x1f) {
		// A fixstr, read in line: its length is in its first byte.
		end := 1 + int(b[0]&0x1f)
		v, o = b[1:end], b[end:]
	} else {
		var err error
		if v, o, err = readString(b, false); err != nil {
			return b, err
		}
	}
	if len(v) != 0 && string(v) == string(*t) {
		// *t was checked when it was set.
		return o, nil
	}
	s := msgp.UnsafeString(v)
	if !window.ValidToken(s) {
		return b, &fieldError{quote(s) + " is not " + window.TokenRule}
	}
	*t = token(unique.Make(s).Value())
	return o, nil
}

// readString reads, without copying, the str b starts with, or its bin if
// bin is true: anything else is errNotString.
func readString(b []byte, bin bool) (v, o []byte, err error) {
	switch t := msgp.NextType(b); {
	case t == msgp.StrType:
		return msgp.ReadStringZC(b)
	case t == msgp.BinType && bin:
		return msgp.ReadBytesZC(b)
	case t == msgp.InvalidType:
		return nil, b, badValue(b)
	}
	return nil, b, errNotString
}

// identifier is an identifier: written as a msgpack bin, read from a bin or
// a str of 1 to window.MaxIdentifierLen bytes.
type identifier string

// MarshalMsg appends id as a bin.
func (id identifier) MarshalMsg(b []byte) ([]byte, error) {
	b = msgp.AppendBytesHeader(b, uint32(len(id)))
	return append(b, id...), nil
}

// Msgsize bounds the size MarshalMsg appends.
func (id identifier) Msgsize() int { return msgp.BytesPrefixSize + len(id) }

// UnmarshalMsg reads a bin or a str of 1 to window.MaxIdentifierLen bytes
// into a new string.
func (id *identifier) UnmarshalMsg(b []byte) ([]byte, error) {
	var v, o []byte
	if len(b) >= 2 && b[0] == 0xc4 && len(b)-2 >= int(b[1]) {
		// A bin8, the form this package writes, read in line.
		v, o = b[2:2+int(b[1])], b[2+int(b[1]):]
	} else {
		var err error
		if v, o, err = readString(b, true); err != nil {
			return b, err
		}
	}
	if len(v) == 0 || len(v) > window.MaxIdentifierLen {
		return b, &fieldError{"must be 1 to " + strconv.Itoa(window.MaxIdentifierLen) + " bytes, got " + strconv.Itoa(len(v))}
	}
	*id = identifier(v)
	return o, nil
}

// --- writing entries ---------------------------------------------------------------

// The entries' encoders are written by hand: they write what the generated
// encoders of the tuples would (TestEntriesAsGenerated, TestEventGolden and
// TestEventEncodeAnything check the bytes), faster
// (BenchmarkAppendComponents). These write the short forms in line and
// leave the others to msgp.

// appendStr appends s as a msgpack str, as msgp.AppendString does.
func appendStr(b []byte, s string) []byte {
	if len(s) <= 31 {
		return append(append(b, 0xa0|byte(len(s))), s...)
	}
	return msgp.AppendString(b, s)
}

// appendBin appends s as a msgpack bin, as msgp.AppendBytes does.
func appendBin(b []byte, s string) []byte {
	if len(s) <= 0xff {
		return append(append(b, 0xc4, byte(len(s))), s...)
	}
	return append(msgp.AppendBytesHeader(b, uint32(len(s))), s...)
}

// appendUint appends v in its shortest unsigned form, as msgp.AppendUint64
// does.
func appendUint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return msgp.AppendUint64(b, v)
}

// --- the version and "m" -------------------------------------------------------

// version is "v": true once a decoder has read it. It is always written as
// Version, and read from any integer form, which must hold Version:
// an event of another version is refused as soon as its "v" is read, before
// entries that may follow another shape.
type version bool

// MarshalMsg appends Version.
func (version) MarshalMsg(b []byte) ([]byte, error) { return msgp.AppendUint64(b, Version), nil }

// Msgsize bounds the size MarshalMsg appends.
func (version) Msgsize() int { return msgp.Uint64Size }

// UnmarshalMsg reads an integer equal to Version.
func (v *version) UnmarshalMsg(b []byte) ([]byte, error) {
	var (
		n   int64
		o   []byte
		err error
	)
	switch msgp.NextType(b) {
	case msgp.IntType:
		n, o, err = msgp.ReadInt64Bytes(b)
	case msgp.UintType:
		var u uint64
		if u, o, err = msgp.ReadUint64Bytes(b); err == nil && u > math.MaxInt64 {
			return b, bad(`version "v" does not fit in 64 bits, got ` + strconv.FormatUint(u, 10))
		}
		n = int64(u)
	case msgp.InvalidType:
		return b, malformed(badValue(b))
	default:
		return b, bad(`version "v" must be an integer`)
	}
	if err != nil {
		return b, malformed(err)
	}
	if n != Version {
		return b, bad("unsupported version " + strconv.FormatInt(n, 10) + ", want " + strconv.Itoa(Version))
	}
	*v = true
	return o, nil
}

// more is a snapshot chunk's or a policies event's "m", a msgpack bool,
// and whether a decoder read it.
type more struct {
	value, seen bool
}

// MarshalMsg appends m.value.
func (m more) MarshalMsg(b []byte) ([]byte, error) { return msgp.AppendBool(b, m.value), nil }

// Msgsize bounds the size MarshalMsg appends.
func (more) Msgsize() int { return msgp.BoolSize }

// IsZero reports whether m is false: where "m" is optional, it is written
// only when true.
func (m more) IsZero() bool { return !m.value }

// UnmarshalMsg reads a bool.
func (m *more) UnmarshalMsg(b []byte) ([]byte, error) {
	switch msgp.NextType(b) {
	case msgp.BoolType:
	case msgp.InvalidType:
		return b, malformed(badValue(b))
	default:
		return b, bad(`more "m" must be a boolean`)
	}
	v, o, err := msgp.ReadBoolBytes(b)
	if err != nil {
		return b, malformed(err)
	}
	*m = more{value: v, seen: true}
	return o, nil
}

// --- the cells' entries ------------------------------------------------------------

// The entry lists of the cells' events. Their codecs write each entry
// from global's type and read it through its generated wire struct into
// global's type, so no second slice is allocated.
type (
	// componentList is a components event's "c".
	componentList = entryList[global.Component, componentCodec]
	// importList is an imports event's or a snapshot chunk's "i".
	importList = entryList[global.Import, importCodec]
)

var (
	componentKind = listKind{name: "components", key: "c", fields: componentFields, field: cellWire}
	importKind    = listKind{name: "imports", key: "i", fields: importFields, field: cellWire}
)

// The generated Msgsize of an entry is a constant plus the lengths of its
// strings: the codecs add up the lengths without converting each entry
// (TestListSizes checks that they match the generated Msgsize).
var (
	componentSize = (&wireComponent{}).Msgsize()
	importSize    = (&wireImport{}).Msgsize()
)

// cellSize is the size the strings and the epoch of c add to an entry.
func cellSize(c *window.Cell) int {
	s := len(c.Workspace) + len(c.Namespace) + len(c.Identifier)
	if c.Epoch != 0 {
		s += msgp.Uint64Size
	}
	return s
}

// prevTokens returns the wire cell holding the tokens of c, the previous
// entry's cell: a token read equal to one of them keeps its string.
func prevTokens(c *window.Cell) wireCell {
	return wireCell{Workspace: token(c.Workspace), Namespace: token(c.Namespace)}
}

// componentCodec is the entryCodec of components.
type componentCodec struct{}

func (componentCodec) kind() *listKind { return &componentKind }

func (componentCodec) size(c *global.Component) int {
	return componentSize + cellSize(&c.Cell) + len(c.Region)
}

func (componentCodec) appendEntry(b []byte, c *global.Component) []byte {
	b = appendCell(b, &c.Cell, componentFields)
	b = appendStr(b, c.Region)
	b = appendUint(b, uint64(c.Count))
	b = appendUint(b, uint64(c.ExpireAt))
	return appendEpoch(b, c.Cell.Epoch)
}

func (componentCodec) readEntry(b []byte, c, prev *global.Component, scratch []byte) ([]byte, []byte, error) {
	var w wireComponent
	if prev != nil {
		w.wireCell, w.Region = prevTokens(&prev.Cell), token(prev.Region)
	}
	in, after, epoch, scratch, err := openEntry(b, componentFields, scratch)
	if err != nil {
		return b, scratch, err
	}
	rest, err := w.UnmarshalMsg(in)
	b, written, err := closeEntry(rest, after, err)
	if err == nil {
		err = w.check(epoch, written)
	}
	if err != nil {
		return b, scratch, err
	}
	*c = global.Component{Cell: w.cellAt(epoch), Region: string(w.Region), Count: int64(w.Count), ExpireAt: int64(w.ExpireAt)}
	return b, scratch, nil
}

// importCodec is the entryCodec of imports.
type importCodec struct{}

func (importCodec) kind() *listKind { return &importKind }

func (importCodec) size(im *global.Import) int { return importSize + cellSize(&im.Cell) }

func (importCodec) appendEntry(b []byte, im *global.Import) []byte {
	b = appendCell(b, &im.Cell, importFields)
	b = appendUint(b, uint64(im.Foreign))
	b = appendUint(b, uint64(im.Own))
	b = appendUint(b, uint64(im.ExpireAt))
	return appendEpoch(b, im.Cell.Epoch)
}

func (importCodec) readEntry(b []byte, im, prev *global.Import, scratch []byte) ([]byte, []byte, error) {
	var w wireImport
	if prev != nil {
		w.wireCell = prevTokens(&prev.Cell)
	}
	in, after, epoch, scratch, err := openEntry(b, importFields, scratch)
	if err != nil {
		return b, scratch, err
	}
	rest, err := w.UnmarshalMsg(in)
	b, written, err := closeEntry(rest, after, err)
	if err == nil {
		err = w.check(epoch, written)
	}
	if err != nil {
		return b, scratch, err
	}
	*im = global.Import{Cell: w.cellAt(epoch), Foreign: int64(w.Foreign), Own: int64(w.Own), ExpireAt: int64(w.ExpireAt)}
	return b, scratch, nil
}

// --- the cell's epoch ---------------------------------------------------------

// An entry of a cell of a reset's epoch (window.Cell.Epoch not 0) carries
// the epoch as one more, last element: the generated tuple decoders know
// only the fixed fields, so openEntry and closeEntry take it by hand. Every entry of a cell never reset keeps the
// bytes it always had.

// appendCell appends the header of an entry of fields fields (at most 14),
// one more for the epoch of a reset's cell, and the cell's five fields, as
// the generated encoder of the entry's tuple would.
func appendCell(b []byte, c *window.Cell, fields byte) []byte {
	if c.Epoch != 0 {
		fields++
	}
	b = append(b, 0x90|fields)
	b = appendStr(b, c.Workspace)
	b = appendStr(b, c.Namespace)
	b = appendBin(b, c.Identifier)
	b = appendUint(b, uint64(c.Duration))
	return appendUint(b, uint64(c.Sequence))
}

// appendEpoch appends the epoch of a reset's cell as an entry's last
// element; nothing for a cell never reset.
func appendEpoch(b []byte, epoch int64) []byte {
	if epoch == 0 {
		return b
	}
	return appendUint(b, uint64(epoch))
}

// openEntry checks that b starts with an entry and returns what the
// generated decoder of entries of fields fields is to read: b itself, with
// after nil, or, for an entry of fields+1 elements whose last is an
// unsigned integer, its first fields elements behind a header of fields,
// copied into scratch (returned, to reuse), with the bytes after the entry
// and the last element, the epoch.
func openEntry(b []byte, fields uint32, scratch []byte) (in, after []byte, epoch uint64, scratchOut []byte, err error) {
	if len(b) != 0 && uint32(b[0]) == 0x90|fields {
		// A fixarray of fields elements: no epoch.
		return b, nil, 0, scratch, nil
	}
	if b, err = entryHeader(b); err != nil {
		return b, nil, 0, scratch, err
	}
	n, body, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n != fields+1 {
		return b, nil, 0, scratch, nil
	}
	p := body
	for range fields {
		if p, err = msgp.Skip(p); err != nil {
			return b, nil, 0, scratch, nil
		}
	}
	epoch, end, err := msgp.ReadUint64Bytes(p)
	if err != nil {
		return b, nil, 0, scratch, bad("epoch must be an integer from 1 to " + strconv.Itoa(window.MaxTime))
	}
	scratch = append(msgp.AppendArrayHeader(scratch[:0], fields), body[:len(body)-len(p)]...)
	return scratch, end, epoch, scratch, nil
}

// closeEntry takes the outcome of the generated decoder, which read in
// from openEntry and left rest, and returns the bytes after the entry and
// whether it carried an epoch.
func closeEntry(rest, after []byte, err error) ([]byte, bool, error) {
	switch {
	case err != nil:
		return rest, false, err
	case after == nil:
		return rest, false, nil
	case len(rest) != 0:
		return rest, false, bad("epoch: trailing bytes")
	}
	return after, true, nil
}

// checkEpoch checks an entry's epoch against its cell as
// window.Cell.Validate does: 0, or from the start of the cell's window to
// the end of the next plus window.MaxEpochLead.
func (w *wireCell) checkEpoch(epoch uint64, written bool) error {
	switch {
	case epoch == 0 && written:
		return bad("epoch 0 is written: a cell never reset carries no epoch")
	case epoch == 0:
		return nil
	case epoch > window.MaxTime:
		return outOfRange(cellWire["Epoch"], epoch)
	}
	if err := w.cellAt(epoch).Validate(); err != nil {
		return bad(err.Error())
	}
	return nil
}

// --- ranges ----------------------------------------------------------------------

// The generated code reads every integer of an entry as a uint64, so none is
// negative (a negative one fails with msgp.UintBelowZero, which entryError
// words as out of range); check tests the upper bounds and the duration's
// lower one, then the epoch.

func (w *wireCell) check() error {
	switch {
	case w.Duration < window.MinDuration:
		return outOfRange(cellWire["Duration"], w.Duration)
	case w.Duration > window.MaxDuration && (w.Duration > math.MaxInt64 || !window.IsCalendar(int64(w.Duration))):
		return outOfRange(cellWire["Duration"], w.Duration)
	case window.ValidDuration(int64(w.Duration)) != nil:
		return bad(window.ValidDuration(int64(w.Duration)).Error())
	case w.Sequence > math.MaxInt64:
		return outOfRange(cellWire["Sequence"], w.Sequence)
	}
	return nil
}

func (w *wireCell) cellAt(epoch uint64) window.Cell {
	return window.Cell{Workspace: string(w.Workspace), Namespace: string(w.Namespace), Identifier: string(w.Identifier),
		Duration: int64(w.Duration), Sequence: int64(w.Sequence), Epoch: int64(epoch)}
}

// bound is an integer field of an entry, by its Go name in cellWire,
// and the largest value it may hold.
type bound struct {
	goName string
	v, max uint64
}

// checkEntry checks an entry whose cell is w: the cell, then each bound in
// order, then the epoch.
func (w *wireCell) checkEntry(epoch uint64, written bool, bounds ...bound) error {
	if err := w.check(); err != nil {
		return err
	}
	for _, b := range bounds {
		if b.v > b.max {
			return outOfRange(cellWire[b.goName], b.v)
		}
	}
	return w.checkEpoch(epoch, written)
}

func (w *wireComponent) check(epoch uint64, written bool) error {
	return w.checkEntry(epoch, written, bound{"Count", w.Count, window.MaxCount}, bound{"ExpireAt", w.ExpireAt, math.MaxInt64})
}

func (w *wireImport) check(epoch uint64, written bool) error {
	return w.checkEntry(epoch, written, bound{"Foreign", w.Foreign, window.MaxCount},
		bound{"Own", w.Own, window.MaxCount}, bound{"ExpireAt", w.ExpireAt, math.MaxInt64})
}

// wireField is a field of an entry as the wire names it, and, for an
// integer, its range.
type wireField struct {
	name     string
	min, max int64
}

// cellWire is the listKind.field of the cells' entries.
var cellWire = map[string]wireField{
	"Workspace":  {name: "workspace"},
	"Namespace":  {name: "namespace"},
	"Identifier": {name: "identifier"},
	"Region":     {name: "region"},
	"Duration":   {"duration", window.MinDuration, window.MaxDuration},
	"Sequence":   {"sequence", 0, math.MaxInt64},
	"Count":      {"count", 0, window.MaxCount},
	"Foreign":    {"foreign", 0, window.MaxCount},
	"Own":        {"own", 0, window.MaxCount},
	"ExpireAt":   {"expire_at", 0, math.MaxInt64},
	"Epoch":      {"epoch", 1, window.MaxTime},
}
