package event

// The one codec of entry lists: every event's list of entries (components,
// imports, overrides, reset marks) is an entryList, which writes
// and reads the list and leaves each entry to the entryCodec of its kind.

import (
	"strconv"

	"github.com/tinylib/msgp/msgp"
)

// listKind is what the list codec and the errors know of one kind of entry.
type listKind struct {
	// name names the list in errors, as in "components[3]: ...".
	name string
	// key is the event's key of the list.
	key string
	// fields is the number of fields every entry has, the cell's epoch
	// aside: listHeader bounds the entries by it.
	fields uint32
	// field holds the wire name and the range of each field of the
	// generated tuple by its Go name (the name msgp puts in errors); a
	// field it does not hold has an empty name.
	field map[string]wireField
}

// entryCodec writes and reads the entries T of one kind. Its methods are
// those of a zero-size value: it holds nothing.
type entryCodec[T any] interface {
	// kind describes the entries.
	kind() *listKind
	// size bounds the size appendEntry appends for e.
	size(e *T) int
	// appendEntry appends e; it never fails.
	appendEntry(b []byte, e *T) []byte
	// readEntry reads the entry b starts with into e and checks it, and
	// returns the bytes after it. prev is the list's previous entry, nil
	// for the first: its tokens are the ones a token equal to them keeps.
	// scratch is the buffer the previous call returned, to reuse.
	readEntry(b []byte, e, prev *T, scratch []byte) (rest, scratchOut []byte, err error)
}

// entryList is a list of entries T written and read by the codec C. A
// decoded list is never nil; a nil list after decoding means the event did
// not carry one.
type entryList[T any, C entryCodec[T]] []T

// MarshalMsg appends the list; it never fails.
func (l entryList[T, C]) MarshalMsg(b []byte) ([]byte, error) {
	var c C
	b = msgp.AppendArrayHeader(b, uint32(len(l)))
	for i := range l {
		b = c.appendEntry(b, &l[i])
	}
	return b, nil
}

// Msgsize bounds the size MarshalMsg appends.
func (l entryList[T, C]) Msgsize() int {
	var c C
	s := msgp.ArrayHeaderSize
	for i := range l {
		s += c.size(&l[i])
	}
	return s
}

// IsZero reports whether the list is empty: an optional list is written
// only when it is not.
func (l entryList[T, C]) IsZero() bool { return len(l) == 0 }

// UnmarshalMsg reads a list of valid entries into a new slice. An error is
// a *wire.BadRequestError naming the list, and the entry and its field if
// one is at fault.
func (l *entryList[T, C]) UnmarshalMsg(b []byte) ([]byte, error) {
	var c C
	k := c.kind()
	n, b, err := listHeader(b, k)
	if err != nil {
		return b, err
	}
	list := make([]T, n)
	var (
		scratch []byte
		prev    *T
	)
	for i := range list {
		if b, scratch, err = c.readEntry(b, &list[i], prev, scratch); err != nil {
			return b, entryError(k, i, err)
		}
		prev = &list[i]
	}
	*l = list
	return b, nil
}

// listHeader reads the header of a list of kind k, of at most MaxEntries
// entries. It refuses a count that the bytes after the header cannot hold
// (each entry takes at least a byte per field and one for its own header),
// so a hostile header never makes a decoder allocate.
func listHeader(b []byte, k *listKind) (uint32, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
	case msgp.InvalidType:
		return 0, b, malformed(badValue(b))
	default:
		return 0, b, bad(`entry list "` + k.key + `" must be an array`)
	}
	n, o, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return 0, b, malformed(err)
	}
	if n > MaxEntries {
		return 0, b, bad(`entry list "` + k.key + `" holds ` + strconv.FormatUint(uint64(n), 10) +
			" entries, more than " + strconv.Itoa(MaxEntries))
	}
	if uint64(n)*uint64(k.fields+1) > uint64(len(o)) {
		return 0, b, bad(`malformed msgpack: entry list "` + k.key + `" announces ` +
			strconv.FormatUint(uint64(n), 10) + " entries but only " + strconv.Itoa(len(o)) + " bytes follow")
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
