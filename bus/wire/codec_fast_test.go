package wire

import (
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/window"
)

// FuzzFastCheckMsgpackAgreesWithTheGeneralDecoder: whatever the fast path
// accepts, the general decoder accepts with the same result; whatever the
// general decoder rejects, the fast path rejects. It decodes into a request
// that held another check before, as the limiter's reused one may: nothing
// of that one shows through.
func FuzzFastCheckMsgpackAgreesWithTheGeneralDecoder(f *testing.F) {
	req := func(kv ...any) []byte {
		b := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
		for i := 0; i < len(kv); i += 2 {
			b = msgp.AppendString(b, kv[i].(string))
			b, _ = msgp.AppendIntf(b, kv[i+1])
		}
		return b
	}
	f.Add(AppendCheckRequest(nil, Msgpack, CheckRequest{Identifier: "user-1", Limit: 10, Duration: 60000, Cost: 1}))
	f.Add(req("identifier", "u", "limit", int8(5), "duration", uint16(1000)))
	f.Add(req("identifier", "u", "limit", int64(-1), "duration", 60000))
	f.Add(req("identifier", "u", "limit", uint64(1<<63), "duration", 60000))
	f.Add(req("identifier", "u", "limit", 1, "duration", 999))
	f.Add(req("identifier", "u", "limit", 1, "duration", 60000, "cost", int32(1e9)))
	f.Add(req("identifier", "u", "identifier", "v", "limit", 1, "duration", 60000))
	f.Add(req("identifier", "", "limit", 1, "duration", 60000))
	f.Add(req("limit", 1, "duration", 60000))
	f.Add(append(req("identifier", "u", "limit", 1, "duration", 60000), 0))
	f.Add([]byte{0x83, 0xaa})
	f.Add(msgp.AppendBytes(req("limit", 1, "duration", 60000)[:0], []byte("x")))
	f.Fuzz(func(t *testing.T, body []byte) {
		fast := CheckRequest{Identifier: "before", Limit: 3, Duration: 5000, Cost: 7, Shadow: true, Fixed: true, Charge: window.ChargeDebit}
		ok := fastCheckMsgpack(body, false, &fast)
		general, err := decodeCheckMsgpackGeneral(body, false)
		if ok && (err != nil || fast != general) {
			t.Fatalf("fast path accepted %x as %+v; general decoder: %+v, %v", body, fast, general, err)
		}
		if err != nil && ok {
			t.Fatalf("fast path accepted %x, which the general decoder rejects: %v", body, err)
		}
	})
}
