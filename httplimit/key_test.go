package httplimit

import (
	"net/http"
	"net/netip"
	"testing"
)

func TestClientAddrTrustsHeadersOnlyFromTrustedProxies(t *testing.T) {
	lb := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	cases := []struct {
		name   string
		remote string
		header ProxyHeader
		xff    []string
		fwd    []string
		trust  []netip.Prefix
		want   string
	}{
		{name: "no proxy trusted: headers ignored", remote: "10.0.0.1:4000", xff: []string{"203.0.113.7"}, want: "10.0.0.1"},
		{name: "untrusted peer: header ignored", remote: "198.51.100.9:4000", xff: []string{"203.0.113.7"}, trust: lb, want: "198.51.100.9"},
		{name: "trusted peer, one hop", remote: "10.0.0.1:4000", xff: []string{"203.0.113.7"}, trust: lb, want: "203.0.113.7"},
		{name: "client-sent entries left of the real one are ignored", remote: "10.0.0.1:4000",
			xff: []string{"1.2.3.4, 5.6.7.8, 203.0.113.7"}, trust: lb, want: "203.0.113.7"},
		{name: "trusted hops are skipped from the right", remote: "10.0.0.1:4000",
			xff: []string{"1.2.3.4, 203.0.113.7, 10.0.0.3, 10.0.0.2"}, trust: lb, want: "203.0.113.7"},
		{name: "several header lines read in order", remote: "10.0.0.1:4000",
			xff: []string{"1.2.3.4", "203.0.113.7, 10.0.0.2"}, trust: lb, want: "203.0.113.7"},
		{name: "every hop trusted: the left-most", remote: "10.0.0.1:4000", xff: []string{"10.0.0.3, 10.0.0.2"}, trust: lb, want: "10.0.0.3"},
		{name: "trusted peer, no header: the peer", remote: "10.0.0.1:4000", trust: lb, want: "10.0.0.1"},
		{name: "empty header: the peer", remote: "10.0.0.1:4000", xff: []string{""}, trust: lb, want: "10.0.0.1"},
		{name: "garbage from the nearest proxy: the peer", remote: "10.0.0.1:4000", xff: []string{"203.0.113.7, nonsense"}, trust: lb, want: "10.0.0.1"},
		{name: "garbage further left: the proxy that wrote it", remote: "10.0.0.1:4000",
			xff: []string{"nonsense, 10.0.0.2"}, trust: lb, want: "10.0.0.2"},
		{name: "ports in the header", remote: "10.0.0.1:4000", xff: []string{"203.0.113.7:5555, [fd00::2]:443"}, trust: lb, want: "203.0.113.7"},
		{name: "IPv6 peer and client", remote: "[fd00::1]:4000", xff: []string{"2001:db8::1"}, trust: lb, want: "2001:db8::1"},
		{name: "IPv6 canonical form", remote: "[2001:DB8:0:0::1]:4000", want: "2001:db8::1"},
		{name: "IPv4-mapped peer is IPv4", remote: "[::ffff:10.0.0.1]:4000", xff: []string{"203.0.113.7"}, trust: lb, want: "203.0.113.7"},
		{name: "zone dropped", remote: "[fe80::1%eth0]:4000", want: "fe80::1"},
		{name: "peer without port", remote: "198.51.100.9", want: "198.51.100.9"},
		{name: "Forwarded, RFC 7239 example", remote: "10.0.0.1:4000", header: Forwarded,
			fwd: []string{`for=192.0.2.43, for="[2001:db8:cafe::17]:4711";proto=https`}, trust: lb, want: "2001:db8:cafe::17"},
		{name: "Forwarded skips trusted hops, case-insensitive key", remote: "10.0.0.1:4000", header: Forwarded,
			fwd: []string{`for=1.2.3.4`, `For=203.0.113.7;by="x,y;z", for=10.0.0.2`}, trust: lb, want: "203.0.113.7"},
		{name: "Forwarded unknown node: the proxy that wrote it", remote: "10.0.0.1:4000", header: Forwarded,
			fwd: []string{`for=unknown, for=10.0.0.2`}, trust: lb, want: "10.0.0.2"},
		{name: "Forwarded element without for: the peer", remote: "10.0.0.1:4000", header: Forwarded,
			fwd: []string{`proto=https`}, trust: lb, want: "10.0.0.1"},
		{name: "Forwarded configured, only X-Forwarded-For sent: the peer", remote: "10.0.0.1:4000", header: Forwarded,
			xff: []string{"203.0.113.7"}, trust: lb, want: "10.0.0.1"},
		{name: "X-Forwarded-For configured, only Forwarded sent: the peer", remote: "10.0.0.1:4000",
			fwd: []string{"for=203.0.113.7"}, trust: lb, want: "10.0.0.1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := http.NewRequest("GET", "http://example.test/", nil)
			if err != nil {
				t.Fatal(err)
			}
			r.RemoteAddr = c.remote
			for _, v := range c.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			for _, v := range c.fwd {
				r.Header.Add("Forwarded", v)
			}
			got, err := ClientAddr(Proxies{Trusted: c.trust, Header: c.header})(r)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("key %q, want %q", got, c.want)
			}
		})
	}
}

func TestClientAddrRefusesARemoteAddressThatIsNotAnAddress(t *testing.T) {
	for _, remote := range []string{"", "pipe", "example.test:80", "[::1", "[::1]x", "1.2.3.4:http"} {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		if k, err := ClientAddr(Proxies{})(r); err == nil {
			t.Errorf("remote %q: key %q, want an error", remote, k)
		}
	}
}

func TestClientAddrCopiesItsTrustedList(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	key := ClientAddr(Proxies{Trusted: trusted})
	trusted[0] = netip.MustParsePrefix("192.0.2.0/24")
	r := &http.Request{RemoteAddr: "10.0.0.1:1", Header: http.Header{"X-Forwarded-For": {"203.0.113.7"}}}
	if k, _ := key(r); k != "203.0.113.7" {
		t.Errorf("key %q after the caller changed its slice, want 203.0.113.7", k)
	}
}
