package transport

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/wire"
)

// plainReply is a check reply as the contract writes it when no override
// applied, built here by hand (not by the encoders under test): the five
// keys in order, and nothing else.
func plainReply(enc wire.Encoding, r wire.CheckResponse) []byte {
	if enc == wire.JSON {
		return fmt.Appendf(nil, `{"success":%t,"limit":%d,"remaining":%d,"reset":%d,"retry_after":%d}`,
			r.Success, r.Limit, r.Remaining, r.Reset, r.RetryAfter)
	}
	b := msgp.AppendMapHeader(nil, 5)
	b = msgp.AppendBool(msgp.AppendString(b, "success"), r.Success)
	b = msgp.AppendInt64(msgp.AppendString(b, "limit"), r.Limit)
	b = msgp.AppendInt64(msgp.AppendString(b, "remaining"), r.Remaining)
	b = msgp.AppendInt64(msgp.AppendString(b, "reset"), r.Reset)
	return msgp.AppendInt64(msgp.AppendString(b, "retry_after"), r.RetryAfter)
}

// rawCheck sends one check body to the check endpoint and returns the
// reply's bytes and its decoding.
func (r *policyRig) rawCheck(t *testing.T, enc wire.Encoding, ns, id string, limit int64) ([]byte, wire.CheckResponse) {
	t.Helper()
	body := wire.AppendCheckRequest(nil, enc, wire.CheckRequest{Identifier: id, Limit: limit, Duration: 60_000, Cost: 1})
	msg, err := r.nc.Request("ratelimit.check.acme."+ns, body, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := wire.DecodeCheckResponse(enc, msg.Data)
	if err != nil {
		t.Fatalf("%s reply %q: %v", enc, msg.Data, err)
	}
	return msg.Data, resp
}

// An override whose pattern has a '*' inside decides the checks it matches,
// and the reply of each such check names its pattern, through every door
// (single checks in both encodings, batches, checks messages, the Go
// client's coalescing); a reply where no override applied has exactly the
// bytes it had before replies could name one.
func TestRepliesNameTheOverrideThatDecidedTheCheck(t *testing.T) {
	r := newPolicyRig(t)
	r.set(t, bus.Override{Namespace: "api", Identifier: "org:*:admin", Limit: 2, Duration: 60_000})
	r.set(t, bus.Override{Namespace: "api", Identifier: "org:*", Limit: 50, Duration: 60_000})
	r.set(t, bus.Override{Namespace: "api", Identifier: "org:7:admin", Limit: 3, Duration: 60_000})

	// Decided by org:*:admin: its limit, counted against it, named.
	for i, want := range []bool{true, true, false} {
		got := r.check(t, "api", "org:42:admin", 100, false)
		if got.Success != want || got.Limit != 2 || got.Override != "org:*:admin" {
			t.Fatalf("check %d of org:42:admin: %+v; want success %v, limit 2, override org:*:admin", i, got, want)
		}
	}
	for _, c := range []struct{ id, want string }{
		{"org:43:admin", "org:*:admin"}, // another org, the same glob
		{"org:42:user", "org:*"},        // the prefix
		{"org:7:admin", "org:7:admin"},  // the exact pattern
		{"team:1:admin", ""},            // none: the request's own limit
	} {
		for _, cl := range []*bus.Client{r.client, r.json} {
			got, err := cl.Check(t.Context(), "acme", "api", bus.CheckRequest{Identifier: c.id, Limit: 100, Duration: 60_000, Peek: true})
			if err != nil {
				t.Fatal(err)
			}
			if got.Override != c.want || (c.want == "") != (got.Limit == 100) {
				t.Fatalf("%q: %+v; want override %q", c.id, got, c.want)
			}
		}
	}

	// The bytes on the wire, in both encodings.
	for _, enc := range []wire.Encoding{wire.Msgpack, wire.JSON} {
		raw, got := r.rawCheck(t, enc, "api", "nobody-"+enc.String(), 100)
		if want := plainReply(enc, got); string(raw) != string(want) {
			t.Fatalf("%s reply without an override:\n got %q\nwant %q", enc, raw, want)
		}
		raw, got = r.rawCheck(t, enc, "api", "org:44:admin", 100)
		want := plainReply(enc, got)
		if enc == wire.JSON {
			want = append(want[:len(want)-1], `,"override":"org:*:admin"}`...)
		} else {
			want[0]++ // a sixth key
			want = msgp.AppendString(msgp.AppendString(want, "override"), "org:*:admin")
		}
		if string(raw) != string(want) {
			t.Fatalf("%s reply with an override:\n got %q\nwant %q", enc, raw, want)
		}
	}

	// A batch: each result names its own.
	batch, err := r.json.Batch(t.Context(), "acme", []bus.BatchCheck{
		{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "org:45:admin", Limit: 100, Duration: 60_000}},
		{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "someone", Limit: 100, Duration: 60_000}},
		{Namespace: "other", CheckRequest: bus.CheckRequest{Identifier: "org:45:admin", Limit: 100, Duration: 60_000}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := batch.Results; len(got) != 3 || got[0].Override != "org:*:admin" || got[0].Limit != 2 || got[1].Override != "" || got[2].Override != "" {
		t.Fatalf("batch results %+v", got)
	}

	// A checks message, read as the contract's JSON: "override" only where
	// an override applied.
	body := wire.AppendChecksRequest(nil, wire.JSON, []wire.BatchCheck{
		{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: "org:46:admin", Limit: 100, Duration: 60_000, Cost: 1}},
		{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: "someone-else", Limit: 100, Duration: 60_000, Cost: 1}},
	})
	msg, err := r.nc.Request("ratelimit.checks.acme", body, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var checks struct{ Results []map[string]any }
	if err := json.Unmarshal(msg.Data, &checks); err != nil || len(checks.Results) != 2 {
		t.Fatalf("checks reply %s: %v", msg.Data, err)
	}
	if o := checks.Results[0]["override"]; o != "org:*:admin" {
		t.Fatalf("checks result 0 names %v: %s", o, msg.Data)
	}
	if _, ok := checks.Results[1]["override"]; ok || len(checks.Results[1]) != 5 {
		t.Fatalf("checks result 1 without an override has keys %v", checks.Results[1])
	}

	// The Go client's coalesced checks (checks messages, msgpack).
	coalescing := bus.NewClient(r.nc, bus.WithCoalesceLimits(64, 1))
	results := make([]bus.CheckResponse, 12)
	errs := make([]error, len(results))
	done := make(chan struct{})
	for i := range results {
		go func() {
			defer func() { done <- struct{}{} }()
			id := "org:" + strconv.Itoa(100+i) + ":admin"
			if i%2 == 1 {
				id = "user-" + strconv.Itoa(i)
			}
			results[i], errs[i] = coalescing.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: id, Limit: 100, Duration: 60_000})
		}()
	}
	for range results {
		<-done
	}
	for i, res := range results {
		want := "org:*:admin"
		if i%2 == 1 {
			want = ""
		}
		if errs[i] != nil || res.Override != want {
			t.Fatalf("coalesced check %d: %+v, %v; want override %q", i, res, errs[i], want)
		}
	}
}
