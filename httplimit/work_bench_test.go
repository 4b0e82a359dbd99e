package httplimit

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
)

// BenchmarkOwnWork measures what the middleware does around a check: the
// key (the peer's address; behind a trusted proxy, read from
// X-Forwarded-For) and the header fields of a reply. BenchmarkMiddleware's
// limited less check is this plus noise.
func BenchmarkOwnWork(b *testing.B) {
	now := time.Now()
	resp := bus.CheckResponse{Success: true, Limit: 100, Remaining: 42, Reset: now.Add(17 * time.Second).UnixMilli()}
	f := fields{name: "api", windowMs: 60_000}
	for _, c := range []struct {
		name string
		key  KeyFunc
		xff  string
	}{
		{"peer", ClientAddr(Proxies{}), ""},
		{"proxied", ClientAddr(Proxies{Trusted: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}), "198.51.100.1, 192.0.2.7"},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest("GET", "/", nil) // RemoteAddr 192.0.2.1:1234
			if c.xff != "" {
				req.Header.Set("X-Forwarded-For", c.xff)
			}
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.key(req); err != nil {
					b.Fatal(err)
				}
				clear(h)
				f.write(h, resp, now)
			}
		})
	}
}
