package wire

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/window"
)

// "window" and "charge" are optional keys of a check in every body (check,
// batch, checks), in both encodings: written only when not the default,
// read back as written, a bad value refused with a message that names the
// choices, and a body without them decoded to the defaults even into a
// check that held others (the checks decoder reuses its items).
func TestWindowAndChargeKeys(t *testing.T) {
	month, _, err := window.ParseCalendar("month@Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, enc := range []Encoding{JSON, Msgpack} {
		for _, r := range []CheckRequest{
			{Identifier: "u", Limit: 10, Duration: month, Cost: 5, Fixed: true, Charge: window.ChargeDebit},
			{Identifier: "u", Limit: 10, Duration: 60_000, Cost: 5, Fixed: true, Charge: window.ChargeDebit},
			{Identifier: "u", Limit: 10, Duration: 60_000, Cost: 5, Charge: window.ChargeDrain},
			{Identifier: "u", Limit: 10, Duration: 60_000, Cost: 5},
		} {
			body := AppendCheckRequest(nil, enc, r)
			if window.IsCalendar(r.Duration) == strings.Contains(string(body), "duration") {
				t.Errorf("%v %+v: body %q writes a duration with a calendar period, or none without", enc, r, body)
			}
			if r.Fixed != strings.Contains(string(body), "window") || (r.Charge != window.ChargeAll) != strings.Contains(string(body), "charge") {
				t.Errorf("%v %+v: body %q writes a default or leaves out a value", enc, r, body)
			}
			got, err := DecodeCheckRequest(enc, body)
			if err != nil || got != r {
				t.Errorf("%v check %+v: decoded %+v, %v", enc, r, got, err)
			}
			b := BatchRequest{Checks: []BatchCheck{{Namespace: "api", CheckRequest: r}}}
			bb, err := DecodeBatchRequest(enc, AppendBatchRequest(nil, enc, b))
			if err != nil || bb.Checks[0] != b.Checks[0] {
				t.Errorf("%v batch %+v: decoded %+v, %v", enc, b, bb, err)
			}
			items := []ChecksItem{{BatchCheck: BatchCheck{CheckRequest: CheckRequest{Fixed: true, Charge: window.ChargeDebit}}}}
			items, err = DecodeChecksRequestView(enc, AppendChecksRequest(nil, enc, b.Checks), items[:0])
			if err != nil || len(items) != 1 || items[0].Err != nil || items[0].BatchCheck != b.Checks[0] {
				t.Errorf("%v checks %+v: decoded %+v, %v", enc, b, items, err)
			}
		}
	}
	for body, want := range map[string]string{
		`{"identifier":"u","limit":1,"duration":1000,"window":"tumbling"}`:               "window must be sliding, fixed or a calendar period: minute, hour",
		`{"identifier":"u","limit":1,"window":"month@Mars/Olympus"}`:                     `window: time zone "Mars/Olympus" is not an IANA zone name`,
		`{"identifier":"u","limit":1,"duration":1000,"window":"day"}`:                    "duration must be absent with a calendar window",
		`{"identifier":"u","limit":1,"window":"day","duration":1000}`:                    "duration must be absent with a calendar window",
		`{"identifier":"u","limit":1,"window":"fixed"}`:                                  "duration is required",
		`{"identifier":"u","limit":1,"duration":1000,"charge":"overdraft"}`:              "charge must be all, drain or debit",
		`{"identifier":"u","limit":1,"duration":1000,"charge":1}`:                        "charge must be a string",
		`{"identifier":"u","limit":1,"duration":1000,"window":"fixed","window":"fixed"}`: `duplicate field "window"`,
	} {
		if _, err := DecodeCheckRequest(JSON, []byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", body, err, want)
		}
	}
}
