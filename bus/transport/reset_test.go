package transport

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bus"
)

// The reset endpoint, through the Go client in msgpack and JSON: an
// identifier spent to its limit is admitted again with the whole limit
// left; the reply's epoch is the limiter's clock; a reset of another
// duration leaves this one; bad requests get a 400 that says what to fix
// and reset nothing.
func TestResetEndpointForgetsAnIdentifiersUsage(t *testing.T) {
	r := newPolicyRig(t)
	for i, c := range []*bus.Client{r.client, r.json} {
		id := []string{"msgpack-user", "json-user"}[i]
		if n, last := r.admitted(t, 12, "api", id, 10); n != 10 || last.Success {
			t.Fatalf("%s: admitted %d of 12 at limit 10", id, n)
		}
		before := r.svc.Now().UnixMilli()
		epoch, err := c.Reset(t.Context(), "acme", "api", id, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if resp := r.check(t, "api", id, 10, false); resp.Success {
			t.Fatalf("%s: a reset of 1s freed the minute: %+v", id, resp)
		}
		epoch, err = c.Reset(t.Context(), "acme", "api", id, 0)
		if err != nil {
			t.Fatal(err)
		}
		if epoch < before || epoch > r.svc.Now().UnixMilli()+1 {
			t.Fatalf("%s: epoch %d, want the limiter's clock (about %d)", id, epoch, before)
		}
		if resp := r.check(t, "api", id, 10, false); !resp.Success || resp.Remaining != 9 {
			t.Fatalf("%s after the reset: %+v, want admitted with 9 left", id, resp)
		}
	}
	if got := r.lim.AdminStats().Resets; got != 4 {
		t.Fatalf("AdminStats().Resets = %d, want 4", got)
	}

	r.admitted(t, 10, "api", "kept", 10)
	for _, tc := range []struct{ name, body, want string }{
		{"no identifier", `{"namespace":"api"}`, "identifier"},
		{"duration too short", `{"namespace":"api","identifier":"kept","duration":999}`, "duration"},
		{"unknown field", `{"namespace":"api","identifier":"kept","limit":1}`, "limit"},
		{"bad namespace", `{"namespace":"a.b","identifier":"kept"}`, "namespace"},
	} {
		msg, err := r.nc.RequestWithContext(t.Context(), "ratelimit.admin.acme.reset", []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var se *bus.ServiceError
		if err := bus.ReplyError(msg); !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Description, tc.want) {
			t.Fatalf("%s: %v, want a 400 mentioning %q", tc.name, err, tc.want)
		}
	}
	if resp := r.check(t, "api", "kept", 10, false); resp.Success {
		t.Fatalf("bad reset requests reset something: %+v", resp)
	}
	if n := r.svc.Marks().Len("acme"); n != 4 {
		t.Fatalf("%d marks held, want 4 (of 1s and of every duration, for two identifiers)", n)
	}
}
