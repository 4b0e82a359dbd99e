package adminwire

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// A cursor names the last override a page of override.list held, so the
// next page starts strictly after it: the URL-safe base64, unpadded, of a
// version byte (cursorVersion) followed by the namespace and the pattern,
// each preceded by its length as a uvarint. Clients treat it as opaque.
const cursorVersion = 1

// MaxCursorLen is the length of the longest cursor EncodeCursor writes:
// that of a namespace of window.MaxTokenLen bytes and a pattern of
// policy.MaxPatternLen (774). A longer one is refused unread.
const MaxCursorLen = (maxCursorBytes*8 + 5) / 6

// maxCursorBytes is the longest cursor before base64: the version, a
// namespace and a pattern with their uvarint lengths (1 and 2 bytes).
const maxCursorBytes = 1 + 1 + window.MaxTokenLen + 2 + policy.MaxPatternLen

// EncodeCursor returns the cursor of position p: the next page starts
// strictly after p.
func EncodeCursor(p policy.Position) string {
	b := make([]byte, 0, 1+2*binary.MaxVarintLen16+len(p.Namespace)+len(p.Pattern))
	b = append(b, cursorVersion)
	b = binary.AppendUvarint(b, uint64(len(p.Namespace)))
	b = append(b, p.Namespace...)
	b = binary.AppendUvarint(b, uint64(len(p.Pattern)))
	b = append(b, p.Pattern...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeCursor returns the position cursor names, or a
// *wire.BadRequestError when it is not one EncodeCursor wrote for a valid
// position: not base64url (or not in the form EncodeCursor writes it),
// another version, lengths out of range, a namespace that is not a token,
// a pattern that is not valid, trailing bytes.
func DecodeCursor(cursor string) (policy.Position, error) {
	bad := func(why string) (policy.Position, error) {
		return policy.Position{}, badf("cursor is not one this service wrote (%s): pass a reply's next as it is, or leave it out to start from the first override", why)
	}
	switch {
	case cursor == "":
		return bad("empty")
	case len(cursor) > MaxCursorLen:
		return bad(fmt.Sprintf("%d bytes, longer than %d", len(cursor), MaxCursorLen))
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(cursor)
	if err != nil {
		return bad("not base64url: " + err.Error())
	}
	if len(b) == 0 { // only line breaks, which base64 skips
		return bad("no bytes")
	}
	if b[0] != cursorVersion {
		return bad(fmt.Sprintf("version %d, want %d", b[0], cursorVersion))
	}
	b = b[1:]
	ns, b, ok := lengthPrefixed(b, window.MaxTokenLen)
	if !ok || !window.ValidToken(ns) {
		return bad("no valid namespace")
	}
	pattern, b, ok := lengthPrefixed(b, policy.MaxPatternLen)
	if !ok || policy.ValidatePattern(string(pattern)) != nil {
		return bad("no valid pattern")
	}
	if len(b) != 0 {
		return bad(fmt.Sprintf("%d trailing bytes", len(b)))
	}
	p := policy.Position{Namespace: string(ns), Pattern: string(pattern)}
	if EncodeCursor(p) != cursor {
		// Base64 decoding skips line breaks, and a uvarint may be written
		// longer than it needs: one position, one cursor.
		return bad("not in its canonical form")
	}
	return p, nil
}

// lengthPrefixed reads a uvarint length of at most maxLen and that many
// bytes from b, and returns them and the rest.
func lengthPrefixed(b []byte, maxLen int) ([]byte, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(maxLen) || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	return b[k : k+int(n)], b[k+int(n):], true
}

// listOverhead bounds the bytes of a list reply besides its overrides, in
// either encoding: the keys, the array header, and the longest next.
const listOverhead = 32 + MaxCursorLen

// ListWriter writes the reply of override.list one override at a time, so
// that a page can end before its reply would exceed a byte budget. The
// bytes it writes are those of AppendList for the same overrides and next.
// The zero value is not usable; call NewListWriter.
type ListWriter struct {
	enc    Encoding
	budget int    // 0: none
	items  []byte // the overrides, JSON ones separated by commas
	n      int
}

// NewListWriter returns a writer of a list reply in enc whose bytes, with
// any next cursor, stay within budget (0: no bound), unless one override
// alone exceeds it.
func NewListWriter(enc Encoding, budget int) *ListWriter {
	return &ListWriter{enc: enc, budget: budget}
}

// Add appends o and reports true if the reply, with the longest next
// cursor, stays within the budget, or if o is the first override (a page
// holds at least one, so a listing always moves on: the budget is then
// exceeded only by an override larger than the budget less listOverhead).
// Otherwise it appends nothing and reports false.
func (w *ListWriter) Add(o Override) bool {
	mark := len(w.items)
	if w.enc == JSON && w.n > 0 {
		w.items = append(w.items, ',')
	}
	w.items = AppendOverride(w.items, w.enc, o)
	if w.budget > 0 && w.n > 0 && len(w.items)+listOverhead > w.budget {
		w.items = w.items[:mark]
		return false
	}
	w.n++
	return true
}

// Len returns how many overrides were added.
func (w *ListWriter) Len() int { return w.n }

// Append appends the reply to dst: the overrides added, and next unless it
// is "".
func (w *ListWriter) Append(dst []byte, next string) []byte {
	return appendObject(dst, w.enc, member{key: "overrides", val: encodedList{w.items, w.n}},
		member{key: "next", val: next, omit: next == ""})
}

// encodedList is an array whose n values are already encoded, JSON ones
// separated by commas.
type encodedList struct {
	items []byte
	n     int
}

// MarshalJSON implements json.Marshaler: the values between brackets.
func (l encodedList) MarshalJSON() ([]byte, error) {
	return append(append(append(make([]byte, 0, len(l.items)+2), '['), l.items...), ']'), nil
}

// MarshalMsg implements msgp.Marshaler: an array header and the values.
func (l encodedList) MarshalMsg(b []byte) ([]byte, error) {
	return append(msgp.AppendArrayHeader(b, uint32(l.n)), l.items...), nil
}
