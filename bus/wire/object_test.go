package wire

import (
	"errors"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// toTable is a table of every kind, for the tests of DecodeObject.
type toTable struct {
	ns, id, cursor string
	n              int64
	flag           bool
}

func (v *toTable) fields() []Field {
	return []Field{
		{Name: "ns", Kind: FieldToken, Required: true, Str: &v.ns},
		{Name: "id", Kind: FieldBytes, Required: true, MaxLen: 4, Str: &v.id},
		{Name: "cursor", Kind: FieldString, MaxLen: 3, LongHint: ": send it as it was", Str: &v.cursor},
		{Name: "n", Kind: FieldInt, Int: &v.n},
		{Name: "flag", Kind: FieldBool, Bool: &v.flag},
	}
}

// toMsgpack writes a map of key, value pairs.
func toMsgpack(kv ...any) []byte {
	b := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
	for i := 0; i < len(kv); i += 2 {
		b = msgp.AppendString(b, kv[i].(string))
		var err error
		if b, err = msgp.AppendIntf(b, kv[i+1]); err != nil {
			panic(err)
		}
	}
	return b
}

func TestDecodeObject(t *testing.T) {
	for _, tc := range []struct {
		name string
		enc  Encoding
		body []byte
		want string // the error, "" for none
	}{
		{"all", JSON, []byte(`{"ns":"a","id":"bcd","cursor":"x","n":-7,"flag":true}`), ""},
		{"required only", JSON, []byte(` {"id":"b","ns":"a"} `), ""},
		{"not an object", JSON, []byte(`[1]`), "body must be a JSON object"},
		{"empty", JSON, nil, "malformed JSON: unexpected end of body"},
		{"syntax", JSON, []byte(`{"ns":}`), "malformed JSON: invalid character '}' looking for beginning of value"},
		{"trailing", JSON, []byte(`{"ns":"a","id":"b"} {}`), "trailing bytes after the JSON object"},
		{"not UTF-8", JSON, []byte("{\"ns\":\"a\",\"id\":\"\xff\"}"), "JSON body is not valid UTF-8 (send identifiers of other bytes in msgpack)"},
		{"unknown", JSON, []byte(`{"ns":"a","x":1}`), `unknown field "x"`},
		{"long unknown", JSON, []byte(`{"` + strings.Repeat("k", 70) + `":1}`), `unknown field "` + strings.Repeat("k", 64) + `…"`},
		{"duplicate", JSON, []byte(`{"ns":"a","ns":"a"}`), `duplicate field "ns"`},
		{"missing in table order", JSON, []byte(`{"n":1}`), `missing field "ns"`},
		{"missing second", JSON, []byte(`{"ns":"a"}`), `missing field "id"`},
		{"fraction", JSON, []byte(`{"n":1.0}`), "n must be an integer"},
		{"exponent", JSON, []byte(`{"n":1e2}`), "n must be an integer"},
		{"overflow", JSON, []byte(`{"n":9223372036854775808}`), "n 9223372036854775808 is out of range"},
		{"null", JSON, []byte(`{"n":null}`), "n must be an integer"},
		{"string for bool", JSON, []byte(`{"flag":"true"}`), "flag must be true or false"},
		{"object for string", JSON, []byte(`{"id":{}}`), "id must be a string"},
		{"bad token", JSON, []byte(`{"ns":"a b"}`), `ns "a b" is not 1 to 64 characters of [A-Za-z0-9_-]`},
		{"long bytes", JSON, []byte(`{"id":"abcde"}`), "id of 5 bytes is longer than 4"},
		{"long string", JSON, []byte(`{"cursor":"abcd"}`), "cursor of 4 bytes is longer than 3: send it as it was"},
		{"unknown encoding", Encoding(9), []byte(`{}`), "unknown encoding 9"},

		{"mp all", Msgpack, toMsgpack("ns", "a", "id", []byte{0xff}, "cursor", "x", "n", uint64(5), "flag", false), ""},
		{"mp not a map", Msgpack, msgp.AppendArrayHeader(nil, 0), "body must be a msgpack map"},
		{"mp empty", Msgpack, nil, "body must be a msgpack map"},
		{"mp bin token", Msgpack, toMsgpack("ns", []byte("a")), "ns must be a string"},
		{"mp bin string", Msgpack, toMsgpack("cursor", []byte("a")), "cursor must be a string"},
		{"mp float", Msgpack, toMsgpack("n", 1.0), "n must be an integer"},
		{"mp uint overflow", Msgpack, toMsgpack("n", uint64(1<<63)), "n 9223372036854775808 is out of range"},
		{"mp nil", Msgpack, toMsgpack("flag", nil), "flag must be true or false"},
		{"mp truncated", Msgpack, toMsgpack("ns", "a", "id", "b")[:6], "malformed msgpack: msgp: too few bytes left to read object"},
		{"mp trailing", Msgpack, append(toMsgpack("ns", "a", "id", "b"), 0xc0, 0xc0), "2 trailing bytes after the msgpack map"},
		{"mp header lies", Msgpack, append(msgp.AppendMapHeader(nil, 1<<31), 0xa1, 'x'), `unknown field "x"`},
		{"mp duplicate", Msgpack, toMsgpack("ns", "a", "ns", "a"), `duplicate field "ns"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v toTable
			_, err := DecodeObject(tc.body, tc.enc, v.fields())
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var bad *BadRequestError
			if !errors.As(err, &bad) || bad.Msg != tc.want {
				t.Fatalf("error %#v, want %q", err, tc.want)
			}
		})
	}
}

func TestDecodeObjectPresentAndValues(t *testing.T) {
	var v toTable
	seen, err := DecodeObject([]byte(`{"flag":true,"id":"b\u00e9","ns":"a","n":-9223372036854775808}`), JSON, v.fields())
	if err != nil {
		t.Fatal(err)
	}
	want := toTable{ns: "a", id: "bé", n: -1 << 63, flag: true}
	if v != want {
		t.Fatalf("decoded %+v, want %+v", v, want)
	}
	for i, w := range []bool{true, true, false, true, true} {
		if seen.Has(i) != w {
			t.Errorf("Has(%d) = %v", i, !w)
		}
	}
	if seen.Has(-1) || seen.Has(MaxObjectFields) {
		t.Error("Has out of the table")
	}
	if _, err := DecodeObject([]byte(`{}`), JSON, make([]Field, MaxObjectFields+1)); err == nil || errors.As(err, new(*BadRequestError)) {
		t.Errorf("a table too long: %v", err)
	}
}

// FuzzDecodeObject checks that DecodeObject never panics, refuses only
// with a *BadRequestError, and accepts only an object holding the required
// fields with values of their kinds.
func FuzzDecodeObject(f *testing.F) {
	f.Add([]byte(`{"ns":"a","id":"bcd","cursor":"x","n":-7,"flag":true}`), true)
	f.Add(toMsgpack("ns", "a", "id", []byte{0xff}, "cursor", "x", "n", uint64(5), "flag", false), false)
	f.Add([]byte(`{"ns":"a","id":"b","n":1.5}`), true)
	f.Fuzz(func(t *testing.T, body []byte, isJSON bool) {
		enc := twEncodingOf(isJSON)
		var v toTable
		seen, err := DecodeObject(body, enc, v.fields())
		if err != nil {
			if !errors.As(err, new(*BadRequestError)) {
				t.Fatalf("error %v is not a *BadRequestError", err)
			}
			return
		}
		if !seen.Has(0) || !seen.Has(1) || !ValidToken(v.ns) || len(v.id) > 4 || len(v.cursor) > 3 {
			t.Fatalf("accepted %+v (present %b)", v, seen)
		}
	})
}
