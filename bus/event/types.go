package event

// The hand-written parts of the codecs: the types msg.go's structs use where
// the generated code alone would not enforce the rules (see the package
// comment), and the entry lists, which convert between the generated wire
// structs and global's types one entry at a time.

import (
	"math"
	"strconv"
	"strings"
	"unique"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/window"
)

// Fields of each kind of entry.
const (
	componentFields = 8
	denialFields    = 8
	importFields    = 9
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
// the one *t holds (the previous entry's, as the lists reuse one wire struct)
// keeps its string; any other is interned with unique.Make, so a bridge
// holding many cells of a region keeps one copy of each token, and the
// result never aliases b.
func (t *token) UnmarshalMsg(b []byte) ([]byte, error) {
	switch msgp.NextType(b) {
	case msgp.StrType:
	case msgp.InvalidType:
		return b, badValue(b)
	default:
		return b, errNotString
	}
	v, o, err := msgp.ReadStringZC(b)
	if err != nil {
		return b, err
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
	var (
		v, o []byte
		err  error
	)
	switch msgp.NextType(b) {
	case msgp.StrType:
		v, o, err = msgp.ReadStringZC(b)
	case msgp.BinType:
		v, o, err = msgp.ReadBytesZC(b)
	case msgp.InvalidType:
		return b, badValue(b)
	default:
		return b, errNotString
	}
	if err != nil {
		return b, err
	}
	if len(v) == 0 || len(v) > window.MaxIdentifierLen {
		return b, &fieldError{"must be 1 to " + strconv.Itoa(window.MaxIdentifierLen) + " bytes, got " + strconv.Itoa(len(v))}
	}
	*id = identifier(v)
	return o, nil
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
			return b, &wireError{`version "v" does not fit in 64 bits, got ` + strconv.FormatUint(u, 10)}
		}
		n = int64(u)
	case msgp.InvalidType:
		return b, malformed(badValue(b))
	default:
		return b, &wireError{`version "v" must be an integer`}
	}
	if err != nil {
		return b, malformed(err)
	}
	if n != Version {
		return b, &wireError{"unsupported version " + strconv.FormatInt(n, 10) + ", want " + strconv.Itoa(Version)}
	}
	*v = true
	return o, nil
}

// more is a snapshot chunk's "m", a msgpack bool, and whether a decoder read
// it.
type more struct {
	value, seen bool
}

// MarshalMsg appends m.value.
func (m more) MarshalMsg(b []byte) ([]byte, error) { return msgp.AppendBool(b, m.value), nil }

// Msgsize bounds the size MarshalMsg appends.
func (more) Msgsize() int { return msgp.BoolSize }

// UnmarshalMsg reads a bool.
func (m *more) UnmarshalMsg(b []byte) ([]byte, error) {
	switch msgp.NextType(b) {
	case msgp.BoolType:
	case msgp.InvalidType:
		return b, malformed(badValue(b))
	default:
		return b, &wireError{`more "m" must be a boolean`}
	}
	v, o, err := msgp.ReadBoolBytes(b)
	if err != nil {
		return b, malformed(err)
	}
	*m = more{value: v, seen: true}
	return o, nil
}

// --- entry lists -----------------------------------------------------------------

// The lists hold global's types and convert each entry to or from its
// generated wire struct as they go, so no second slice is allocated. A
// decoded list is never nil; a nil list after decoding means the event did
// not carry one.

// componentList is a components event's "c".
type componentList []global.Component

// denialList is a denials event's "d".
type denialList []global.Denial

// importList is an imports event's or a snapshot chunk's "i".
type importList []global.Import

// The generated Msgsize of an entry is a constant plus the lengths of its
// strings: the lists add up the lengths without converting each entry
// (TestListSizes checks that they match the generated Msgsize).
var (
	componentSize = (&wireComponent{}).Msgsize()
	denialSize    = (&wireDenial{}).Msgsize()
	importSize    = (&wireImport{}).Msgsize()
)

func toWireCell(c *window.Cell) wireCell {
	return wireCell{Workspace: token(c.Workspace), Namespace: token(c.Namespace), Identifier: identifier(c.Identifier),
		Duration: uint64(c.Duration), Sequence: uint64(c.Sequence)}
}

func toWireComponent(c *global.Component) wireComponent {
	return wireComponent{wireCell: toWireCell(&c.Cell), Region: token(c.Region), Count: uint64(c.Count), ExpireAt: uint64(c.ExpireAt)}
}

func toWireDenial(d *global.Denial) wireDenial {
	return wireDenial{wireCell: toWireCell(&d.Cell), Region: token(d.Region), Usage: uint64(d.Usage), ExpireAt: uint64(d.ExpireAt)}
}

func toWireImport(im *global.Import) wireImport {
	return wireImport{wireCell: toWireCell(&im.Cell), Foreign: uint64(im.Foreign), Own: uint64(im.Own),
		Floor: uint64(im.Floor), ExpireAt: uint64(im.ExpireAt)}
}

// MarshalMsg appends the list; the generated encoders never fail.
func (l componentList) MarshalMsg(b []byte) ([]byte, error) {
	b = msgp.AppendArrayHeader(b, uint32(len(l)))
	for i := range l {
		w := toWireComponent(&l[i])
		start := len(b)
		b, _ = w.MarshalMsg(b)
		b = appendEpoch(b, start, l[i].Cell.Epoch)
	}
	return b, nil
}

// Msgsize bounds the size MarshalMsg appends.
func (l componentList) Msgsize() int {
	s := msgp.ArrayHeaderSize + len(l)*componentSize
	for i := range l {
		c := &l[i]
		s += len(c.Cell.Workspace) + len(c.Cell.Namespace) + len(c.Cell.Identifier) + len(c.Region)
		if c.Cell.Epoch != 0 {
			s += msgp.Uint64Size
		}
	}
	return s
}

// UnmarshalMsg reads a list of valid components.
func (l *componentList) UnmarshalMsg(b []byte) ([]byte, error) {
	n, b, err := listHeader(b, "c", componentFields)
	if err != nil {
		return b, err
	}
	list := make(componentList, n)
	var (
		w       wireComponent
		scratch []byte
	)
	for i := range list {
		var (
			epoch   uint64
			written bool
		)
		if b, err = entryHeader(b); err == nil {
			var in, after []byte
			if in, after, epoch, err = splitEpoch(b, componentFields, &scratch); err == nil {
				var rest []byte
				rest, err = w.UnmarshalMsg(in)
				switch {
				case after == nil:
					b = rest
				case err == nil && len(rest) != 0:
					err = &wireError{"epoch: trailing bytes"}
				case err == nil:
					b, written = after, true
				}
			}
		}
		if err == nil {
			err = w.check()
		}
		if err == nil {
			err = w.checkEpoch(epoch, written)
		}
		if err != nil {
			return b, entryError("components", i, err)
		}
		list[i] = global.Component{Cell: w.cellAt(epoch), Region: string(w.Region), Count: int64(w.Count), ExpireAt: int64(w.ExpireAt)}
	}
	*l = list
	return b, nil
}

// MarshalMsg appends the list; the generated encoders never fail.
func (l denialList) MarshalMsg(b []byte) ([]byte, error) {
	b = msgp.AppendArrayHeader(b, uint32(len(l)))
	for i := range l {
		w := toWireDenial(&l[i])
		start := len(b)
		b, _ = w.MarshalMsg(b)
		b = appendEpoch(b, start, l[i].Cell.Epoch)
	}
	return b, nil
}

// Msgsize bounds the size MarshalMsg appends.
func (l denialList) Msgsize() int {
	s := msgp.ArrayHeaderSize + len(l)*denialSize
	for i := range l {
		c := &l[i]
		s += len(c.Cell.Workspace) + len(c.Cell.Namespace) + len(c.Cell.Identifier) + len(c.Region)
		if c.Cell.Epoch != 0 {
			s += msgp.Uint64Size
		}
	}
	return s
}

// UnmarshalMsg reads a list of valid denials.
func (l *denialList) UnmarshalMsg(b []byte) ([]byte, error) {
	n, b, err := listHeader(b, "d", denialFields)
	if err != nil {
		return b, err
	}
	list := make(denialList, n)
	var (
		w       wireDenial
		scratch []byte
	)
	for i := range list {
		var (
			epoch   uint64
			written bool
		)
		if b, err = entryHeader(b); err == nil {
			var in, after []byte
			if in, after, epoch, err = splitEpoch(b, denialFields, &scratch); err == nil {
				var rest []byte
				rest, err = w.UnmarshalMsg(in)
				switch {
				case after == nil:
					b = rest
				case err == nil && len(rest) != 0:
					err = &wireError{"epoch: trailing bytes"}
				case err == nil:
					b, written = after, true
				}
			}
		}
		if err == nil {
			err = w.check()
		}
		if err == nil {
			err = w.checkEpoch(epoch, written)
		}
		if err != nil {
			return b, entryError("denials", i, err)
		}
		list[i] = global.Denial{Cell: w.cellAt(epoch), Region: string(w.Region), Usage: int64(w.Usage), ExpireAt: int64(w.ExpireAt)}
	}
	*l = list
	return b, nil
}

// MarshalMsg appends the list; the generated encoders never fail.
func (l importList) MarshalMsg(b []byte) ([]byte, error) {
	b = msgp.AppendArrayHeader(b, uint32(len(l)))
	for i := range l {
		w := toWireImport(&l[i])
		start := len(b)
		b, _ = w.MarshalMsg(b)
		b = appendEpoch(b, start, l[i].Cell.Epoch)
	}
	return b, nil
}

// Msgsize bounds the size MarshalMsg appends.
func (l importList) Msgsize() int {
	s := msgp.ArrayHeaderSize + len(l)*importSize
	for i := range l {
		c := &l[i]
		s += len(c.Cell.Workspace) + len(c.Cell.Namespace) + len(c.Cell.Identifier)
		if c.Cell.Epoch != 0 {
			s += msgp.Uint64Size
		}
	}
	return s
}

// UnmarshalMsg reads a list of valid imports.
func (l *importList) UnmarshalMsg(b []byte) ([]byte, error) {
	n, b, err := listHeader(b, "i", importFields)
	if err != nil {
		return b, err
	}
	list := make(importList, n)
	var (
		w       wireImport
		scratch []byte
	)
	for i := range list {
		var (
			epoch   uint64
			written bool
		)
		if b, err = entryHeader(b); err == nil {
			var in, after []byte
			if in, after, epoch, err = splitEpoch(b, importFields, &scratch); err == nil {
				var rest []byte
				rest, err = w.UnmarshalMsg(in)
				switch {
				case after == nil:
					b = rest
				case err == nil && len(rest) != 0:
					err = &wireError{"epoch: trailing bytes"}
				case err == nil:
					b, written = after, true
				}
			}
		}
		if err == nil {
			err = w.check()
		}
		if err == nil {
			err = w.checkEpoch(epoch, written)
		}
		if err != nil {
			return b, entryError("imports", i, err)
		}
		list[i] = global.Import{Cell: w.cellAt(epoch), Foreign: int64(w.Foreign), Own: int64(w.Own), Floor: int64(w.Floor),
			ExpireAt: int64(w.ExpireAt)}
	}
	*l = list
	return b, nil
}

// --- the cell's epoch ---------------------------------------------------------

// An entry of a cell of a reset's epoch (window.Cell.Epoch not 0) carries
// the epoch as one more, last element: the generated tuple codecs know
// only the fixed fields, so appendEntry and readEntry add and take it by
// hand. Every entry of a cell never reset keeps the bytes it always had.

// appendEpoch makes the entry appended from start on (by a generated
// encoder, which writes a fixarray header of at most 15 elements: one
// byte) one element longer, epoch, when epoch is not 0.
func appendEpoch(b []byte, start int, epoch int64) []byte {
	if epoch == 0 {
		return b
	}
	b[start]++
	return msgp.AppendUint64(b, uint64(epoch))
}

// splitEpoch looks at the entry b starts with: of fields+1 elements whose
// last is an unsigned integer, it returns the entry's first fields
// elements behind a header of fields, in scratch (the generated decoder
// wants exactly fields elements), the bytes after the entry, and the last
// element, the epoch. Any other entry is returned as it is, after nil,
// for the generated decoder to read or refuse.
func splitEpoch(b []byte, fields uint32, scratch *[]byte) (in, after []byte, epoch uint64, err error) {
	n, body, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n != fields+1 {
		return b, nil, 0, nil
	}
	p := body
	for range fields {
		if p, err = msgp.Skip(p); err != nil {
			return b, nil, 0, nil
		}
	}
	epoch, end, err := msgp.ReadUint64Bytes(p)
	if err != nil {
		return b, nil, 0, &wireError{"epoch must be an integer from 1 to " + strconv.Itoa(window.MaxTime)}
	}
	*scratch = append(msgp.AppendArrayHeader((*scratch)[:0], fields), body[:len(body)-len(p)]...)
	return *scratch, end, epoch, nil
}

// checkEpoch checks an entry's epoch against its cell as
// window.Cell.Validate does: 0, or from the start of the cell's window to
// the end of the next plus window.MaxEpochLead.
func (w *wireCell) checkEpoch(epoch uint64, written bool) error {
	switch {
	case epoch == 0 && written:
		return &wireError{"epoch 0 is written: a cell never reset carries no epoch"}
	case epoch == 0:
		return nil
	case epoch > window.MaxTime:
		return outOfRange("Epoch", epoch)
	}
	if err := w.cellAt(epoch).Validate(); err != nil {
		return &wireError{err.Error()}
	}
	return nil
}

// listHeader reads the header of the entry list under key, of at most
// MaxEntries entries of fields fields each. It refuses a count that the
// bytes after the header cannot hold (each entry takes at least a byte per
// field and one for its own header), so a hostile header never makes a
// decoder allocate.
func listHeader(b []byte, key string, fields uint32) (uint32, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
	case msgp.InvalidType:
		return 0, b, malformed(badValue(b))
	default:
		return 0, b, &wireError{`entry list "` + key + `" must be an array`}
	}
	n, o, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return 0, b, malformed(err)
	}
	if n > MaxEntries {
		return 0, b, &wireError{`entry list "` + key + `" holds ` + strconv.FormatUint(uint64(n), 10) +
			" entries, more than " + strconv.Itoa(MaxEntries)}
	}
	if uint64(n)*uint64(fields+1) > uint64(len(o)) {
		return 0, b, &wireError{`malformed msgpack: entry list "` + key + `" announces ` +
			strconv.FormatUint(uint64(n), 10) + " entries but only " + strconv.Itoa(len(o)) + " bytes follow"}
	}
	return n, o, nil
}

// entryHeader checks that b starts with an array, so that a nil entry is not
// read as an empty array; the generated decoder checks its length.
func entryHeader(b []byte) ([]byte, error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		return b, nil
	case msgp.InvalidType:
		return b, badValue(b)
	}
	return b, errNotArray
}

// --- ranges ----------------------------------------------------------------------

// The generated code reads every integer of an entry as a uint64, so none is
// negative (a negative one fails with msgp.UintBelowZero, which entryError
// words as out of range); check tests the upper bounds and the duration's
// lower one.

func (w *wireCell) check() error {
	switch {
	case w.Duration < window.MinDuration || w.Duration > window.MaxDuration:
		return outOfRange("Duration", w.Duration)
	case w.Sequence > math.MaxInt64:
		return outOfRange("Sequence", w.Sequence)
	}
	return nil
}

func (w *wireCell) cellAt(epoch uint64) window.Cell {
	return window.Cell{Workspace: string(w.Workspace), Namespace: string(w.Namespace), Identifier: string(w.Identifier),
		Duration: int64(w.Duration), Sequence: int64(w.Sequence), Epoch: int64(epoch)}
}

func (w *wireComponent) check() error {
	if err := w.wireCell.check(); err != nil {
		return err
	}
	switch {
	case w.Count > window.MaxCount:
		return outOfRange("Count", w.Count)
	case w.ExpireAt > math.MaxInt64:
		return outOfRange("ExpireAt", w.ExpireAt)
	}
	return nil
}

func (w *wireDenial) check() error {
	if err := w.wireCell.check(); err != nil {
		return err
	}
	switch {
	case w.Usage > window.MaxCount:
		return outOfRange("Usage", w.Usage)
	case w.ExpireAt > math.MaxInt64:
		return outOfRange("ExpireAt", w.ExpireAt)
	}
	return nil
}

func (w *wireImport) check() error {
	if err := w.wireCell.check(); err != nil {
		return err
	}
	switch {
	case w.Foreign > window.MaxCount:
		return outOfRange("Foreign", w.Foreign)
	case w.Own > window.MaxCount:
		return outOfRange("Own", w.Own)
	case w.Floor > window.MaxCount:
		return outOfRange("Floor", w.Floor)
	case w.ExpireAt > math.MaxInt64:
		return outOfRange("ExpireAt", w.ExpireAt)
	}
	return nil
}

// wireField is a field of an entry as the wire names it, and, for an
// integer, its range.
type wireField struct {
	name     string
	min, max int64
}

// fieldNamed returns the field of the wire structs named goName, the name
// msgp gives it in errors; its name is empty for a name it does not know.
func fieldNamed(goName string) wireField {
	switch goName {
	case "Workspace", "Namespace", "Identifier", "Region":
		return wireField{name: strings.ToLower(goName)}
	case "Duration":
		return wireField{"duration", window.MinDuration, window.MaxDuration}
	case "Sequence":
		return wireField{"sequence", 0, math.MaxInt64}
	case "Count", "Usage", "Foreign", "Own", "Floor":
		return wireField{strings.ToLower(goName), 0, window.MaxCount}
	case "ExpireAt":
		return wireField{"expire_at", 0, math.MaxInt64}
	case "Epoch":
		return wireField{"epoch", 1, window.MaxTime}
	}
	return wireField{}
}
