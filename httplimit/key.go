package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// KeyFunc returns the identifier a request is limited by: 1 to 512 bytes
// of anything. An error refuses the request (the error handler answers it).
type KeyFunc func(r *http.Request) (string, error)

// ProxyHeader names the header field that trusted proxies append the
// address of their client to.
type ProxyHeader int

const (
	// XForwardedFor is the de facto X-Forwarded-For: a comma-separated
	// list of addresses, the client's first, each proxy's peer appended.
	XForwardedFor ProxyHeader = iota
	// Forwarded is RFC 7239's Forwarded: elements of which the "for"
	// parameter names the address, in the same order.
	Forwarded
)

// Proxies says which peers are proxies whose word about the client's
// address is trusted, and which header they write it to.
//
// Only one header is read: a proxy appends to the one it writes and passes
// the other on as the client sent it, so reading both would let a client
// choose its own address.
type Proxies struct {
	// Trusted are the prefixes of the trusted proxies' addresses (for
	// example the load balancers' subnet). Empty: no proxy is trusted and
	// the key is always the immediate peer's address.
	Trusted []netip.Prefix
	// Header is the header the trusted proxies append to (default
	// XForwardedFor).
	Header ProxyHeader
}

// trusts reports whether a is one of p's trusted proxies.
func (p Proxies) trusts(a netip.Addr) bool {
	return slices.ContainsFunc(p.Trusted, func(pre netip.Prefix) bool { return pre.Contains(a) })
}

// ClientAddr returns the key function that limits each client address: the
// address of the immediate peer (the connection's remote address) unless
// that peer is a trusted proxy. When it is, the key is the right-most
// address of p.Header that is not a trusted proxy (each trusted proxy
// appends its peer's address, so the addresses to the right of that one
// were written by proxies the server trusts, and everything to its left
// by the client); if every address in the header is a trusted proxy, the
// left-most one; if the header is missing, the peer. An entry that is not
// an address (Forwarded's "unknown" or an obfuscated "_name", or garbage)
// before an untrusted one is found ends the walk: the key is then the
// address of the trusted proxy that wrote it (its right neighbour, or the
// peer). With no trusted proxies the headers are never read, whatever they
// hold: the default.
//
// Keys are addresses in their canonical text (IPv4 dotted, IPv6 RFC 5952),
// without port or zone; IPv4-mapped IPv6 addresses are read as IPv4.
func ClientAddr(p Proxies) KeyFunc {
	p.Trusted = append([]netip.Prefix(nil), p.Trusted...)
	return func(r *http.Request) (string, error) {
		a, err := clientAddr(r, p)
		if err != nil {
			return "", err
		}
		return a.String(), nil
	}
}

// clientAddr is ClientAddr's rule.
func clientAddr(r *http.Request, p Proxies) (netip.Addr, error) {
	peer, ok := parseNode(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("remote address %q is not an IP address", r.RemoteAddr)
	}
	if len(p.Trusted) == 0 || !p.trusts(peer) {
		return peer, nil
	}
	var hops []string
	if p.Header == Forwarded {
		hops = forwardedFor(r.Header.Values("Forwarded"))
	} else {
		hops = forwardedList(r.Header.Values("X-Forwarded-For"))
	}
	last := peer // the nearest trusted address so far
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseNode(hops[i])
		if !ok {
			return last, nil
		}
		if !p.trusts(a) {
			return a, nil
		}
		last = a
	}
	return last, nil
}

// parseNode reads an address with or without a port: "192.0.2.1",
// "192.0.2.1:443", "2001:db8::1", "[2001:db8::1]", "[2001:db8::1]:443".
// The zone is dropped and an IPv4-mapped address is unmapped.
func parseNode(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		rest := s[end+1:]
		if rest != "" && (rest[0] != ':' || !isPort(rest[1:])) {
			return netip.Addr{}, false
		}
		s = s[1:end]
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 && strings.IndexByte(s, ':') == i {
		// One colon: an IPv4 address and a port.
		if !isPort(s[i+1:]) {
			return netip.Addr{}, false
		}
		s = s[:i]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

// isPort reports whether s is 1 to 5 decimal digits.
func isPort(s string) bool {
	return s != "" && len(s) <= 5 && strings.Trim(s, "0123456789") == ""
}

// forwardedList splits X-Forwarded-For's values, in order, into entries.
func forwardedList(values []string) []string {
	var hops []string
	for _, v := range values {
		for e := range strings.SplitSeq(v, ",") {
			hops = append(hops, strings.TrimSpace(e))
		}
	}
	return hops
}

// forwardedFor returns the "for" parameter of each element of the
// Forwarded values (RFC 7239, section 4), in order, unquoted; "" for an
// element without one.
func forwardedFor(values []string) []string {
	var hops []string
	for _, v := range values {
		var (
			elem   string // this element's for=, so far
			key    strings.Builder
			val    strings.Builder
			inVal  bool
			quoted bool
			escape bool
		)
		endPair := func() {
			if strings.EqualFold(strings.TrimSpace(key.String()), "for") {
				elem = strings.TrimSpace(val.String())
			}
			key.Reset()
			val.Reset()
			inVal = false
		}
		for i := 0; i < len(v); i++ {
			c := v[i]
			switch {
			case quoted && escape:
				val.WriteByte(c)
				escape = false
			case quoted && c == '\\':
				escape = true
			case quoted && c == '"':
				quoted = false
			case quoted:
				val.WriteByte(c)
			case c == '"' && inVal:
				quoted = true
			case c == '=' && !inVal:
				inVal = true
			case c == ';':
				endPair()
			case c == ',':
				endPair()
				hops = append(hops, elem)
				elem = ""
			case inVal:
				val.WriteByte(c)
			default:
				key.WriteByte(c)
			}
		}
		endPair()
		hops = append(hops, elem)
	}
	return hops
}
