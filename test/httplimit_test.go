package test

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The HTTP middleware in front of an httptest server, checking with a real
// limiter process on the real Redis: 64 HTTP clients send three times the
// limit from one address, and exactly the limit is admitted. Every response
// carries RateLimit-Policy and RateLimit fields that a structured-field
// parser written here from the draft's text (not the middleware's code)
// accepts, with the values the sliding window implies; every 429 has the
// Retry-After of the first second at which one more request is admitted.
// Then the limiter process is stopped, and the fail-open route lets
// requests through while the fail-closed one answers 503.
func TestHTTPMiddlewareAgainstALimiterProcess(t *testing.T) {
	const (
		limit   = 100
		clients = 64
		calls   = 3 * limit
		ns      = "http"
	)
	srv := startServer(t)
	url := srv.ClientURL()
	lim := startProcess(t, "limiter", "--nats-url", url, "--redis-url", redistest.SharedURL(t),
		"--redis-prefix", redistest.Prefix(t), "--log-level", "warn")
	nc := connect(t, url)
	waitService(t, nc, "ratelimit", instancesPerLimiter)

	window := windowAwayFromItsEdges(time.Now())
	d := window.Milliseconds()
	rule := httplimit.Rule{Workspace: "acme", Namespace: ns, Limit: limit, Window: window}
	c := bus.NewClient(nc)
	open, err := httplimit.New(c, rule)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := httplimit.New(c, rule, httplimit.WithFailureMode(httplimit.FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int64
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		io.WriteString(w, "ok")
	})
	mux := http.NewServeMux()
	mux.Handle("/open", open.Handler(ok))
	mux.Handle("/closed", closed.Handler(ok))
	web := httptest.NewServer(mux)
	t.Cleanup(web.Close)

	type result struct {
		status     int
		header     http.Header
		sent, recv int64 // unix ms
	}
	results := make([]result, calls)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := make(chan struct{})
	for range clients {
		client := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
		t.Cleanup(client.CloseIdleConnections)
		wg.Go(func() {
			<-start
			for i := next.Add(1) - 1; i < calls; i = next.Add(1) - 1 {
				sent := time.Now().UnixMilli()
				resp, err := client.Get(web.URL + "/open")
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				results[i] = result{resp.StatusCode, resp.Header, sent, time.Now().UnixMilli()}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// end is the end of the fixed window holding ms; the previous window
	// is empty (a Redis prefix of the test's own, a window chosen so that
	// the burst is far from its edges), so once the limit is spent the
	// first instant admitting one more is d/limit into the next window.
	end := func(ms int64) int64 { return (ms/d + 1) * d }
	retryAt := func(ms int64) int64 { return end(ms) + d/limit }
	ceilSec := func(ms int64) int64 { return (ms + 999) / 1000 }
	// The limiter reads a clock refreshed every millisecond by a ticker,
	// which can lag under load: its instant of decision is taken to lie
	// in [sent-clockLag, recv].
	const clockLag = 100

	var admitted, denied int
	minR := int64(limit)
	for i, r := range results {
		policy, err := parseRateLimitPolicy(r.header.Values("RateLimit-Policy"))
		if err != nil {
			t.Fatalf("response %d (%d): RateLimit-Policy %q: %v", i, r.status, r.header.Values("RateLimit-Policy"), err)
		}
		if len(policy) != 1 || policy[0].name != ns || policy[0].q != limit || policy[0].w != d/1000 {
			t.Errorf("response %d: RateLimit-Policy %+v, want one policy %q, q=%d, w=%d", i, policy, ns, limit, d/1000)
		}
		limits, err := parseRateLimit(r.header.Values("RateLimit"))
		if err != nil {
			t.Fatalf("response %d (%d): RateLimit %q: %v", i, r.status, r.header.Values("RateLimit"), err)
		}
		if len(limits) != 1 || limits[0].name != ns || limits[0].t < 0 {
			t.Fatalf("response %d: RateLimit %+v, want one service limit %q with t", i, limits, ns)
		}
		sl := limits[0]
		switch r.status {
		case http.StatusOK:
			admitted++
			minR = min(minR, sl.r)
			lo, hi := ceilSec(end(r.recv)-r.recv), ceilSec(end(r.sent)-r.sent)
			if sl.r < 0 || sl.r >= limit || sl.t < lo || sl.t > hi {
				t.Errorf("admitted %d: r=%d t=%d, want r in [0,%d) and t in [%d,%d]", i, sl.r, sl.t, limit, lo, hi)
			}
			if v := r.header.Get("Retry-After"); v != "" {
				t.Errorf("admitted %d: Retry-After %q", i, v)
			}
		case http.StatusTooManyRequests:
			denied++
			ra, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
			lo, hi := ceilSec(retryAt(r.recv)-r.recv), ceilSec(retryAt(r.sent)-(r.sent-clockLag))
			if err != nil || ra < lo || ra > hi {
				t.Errorf("denied %d: Retry-After %q, want whole seconds in [%d,%d]", i, r.header.Get("Retry-After"), lo, hi)
			}
			if sl.r != 0 || sl.t != ra {
				t.Errorf("denied %d: RateLimit r=%d t=%d, want r=0 and t=Retry-After %d", i, sl.r, sl.t, ra)
			}
		default:
			t.Errorf("response %d: status %d", i, r.status)
		}
	}
	if admitted != limit || denied != calls-limit {
		t.Fatalf("%d admitted and %d denied of %d, want %d and %d", admitted, denied, calls, limit, calls-limit)
	}
	if minR != 0 {
		t.Errorf("the lowest r of an admission is %d, want 0 (the last one)", minR)
	}
	if got := reached.Load(); got != limit {
		t.Errorf("handler reached %d times, want %d", got, limit)
	}
	t.Logf("window %v: %d admitted, %d denied by 429", window, admitted, denied)

	// No limiter: the default fails open, FailClosed answers 503.
	if code := lim.stop(t, syscall.SIGTERM, 15*time.Second); code != 0 {
		t.Fatalf("limiter exited %d after SIGTERM, want 0", code)
	}
	before := reached.Load()
	resp, err := http.Get(web.URL + "/open")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || reached.Load() != before+1 || resp.Header.Get("RateLimit") != "" {
		t.Errorf("fail-open without a limiter: status %d, handler reached %d more times, RateLimit %q; want 200, 1, none",
			resp.StatusCode, reached.Load()-before, resp.Header.Get("RateLimit"))
	}
	resp, err = http.Get(web.URL + "/closed")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || reached.Load() != before+1 {
		t.Errorf("fail-closed without a limiter: status %d, handler reached %d more times; want 503, none",
			resp.StatusCode, reached.Load()-before-1)
	}
}

// windowAwayFromItsEdges returns a window of whole seconds, an hour or a
// little more, such that the fixed window holding now has at least a
// quarter of its length on either side of now: a burst of a few seconds
// then stays in one window, and its previous window holds nothing.
// Windows are aligned on multiples of their length since the Unix epoch,
// so changing the length by a second moves now within its window.
func windowAwayFromItsEdges(now time.Time) time.Duration {
	ms := now.UnixMilli()
	for s := int64(3600); ; s++ {
		d := s * 1000
		if e := ms % d; e >= d/4 && e <= 3*d/4 {
			return time.Duration(s) * time.Second
		}
	}
}

// A parser of the two fields of draft-ietf-httpapi-ratelimit-headers-11,
// written from the draft's text and RFC 9651 (Structured Field Values for
// HTTP), section 4.2, apart from the middleware's code. Both fields are
// Lists of Items; an Item's value names a policy and must be a String; its
// parameters are:
//
//	RateLimit-Policy: q (REQUIRED, non-negative Integer), qu (String),
//	                  w (non-negative, non-zero Integer), pk (Byte Sequence)
//	RateLimit:        r (REQUIRED, non-negative Integer),
//	                  t (non-negative Integer), pk (Byte Sequence)
//
// Other parameters are allowed and ignored.

// sfPolicy is one quota policy item; w is 0 when absent.
type sfPolicy struct {
	name string
	q, w int64
}

// sfServiceLimit is one service limit item; t is -1 when absent.
type sfServiceLimit struct {
	name string
	r, t int64
}

// sfItem is a parsed Item: a bare item and its parameters, in order.
type sfItem struct {
	value  any // int64, float64, string (String), sfToken, []byte, bool
	params []sfParam
}

type sfParam struct {
	key   string
	value any
}

type sfToken string

func (it sfItem) param(key string) (any, bool) {
	var v any
	found := false
	for _, p := range it.params { // a later duplicate overwrites (4.2.3.2)
		if p.key == key {
			v, found = p.value, true
		}
	}
	return v, found
}

func parseRateLimitPolicy(lines []string) ([]sfPolicy, error) {
	items, err := sfParseFieldList(lines)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("RateLimit-Policy must be a non-empty List")
	}
	var out []sfPolicy
	for _, it := range items {
		name, ok := it.value.(string)
		if !ok {
			return nil, fmt.Errorf("policy item value %v is not a String", it.value)
		}
		p := sfPolicy{name: name}
		q, ok := it.param("q")
		if !ok {
			return nil, fmt.Errorf("policy %q has no q", name)
		}
		if p.q, ok = q.(int64); !ok || p.q < 0 {
			return nil, fmt.Errorf("policy %q: q=%v is not a non-negative Integer", name, q)
		}
		if w, ok := it.param("w"); ok {
			if p.w, ok = w.(int64); !ok || p.w <= 0 {
				return nil, fmt.Errorf("policy %q: w=%v is not a positive Integer", name, w)
			}
		}
		if qu, ok := it.param("qu"); ok {
			if _, ok := qu.(string); !ok {
				return nil, fmt.Errorf("policy %q: qu=%v is not a String", name, qu)
			}
		}
		if pk, ok := it.param("pk"); ok {
			if _, ok := pk.([]byte); !ok {
				return nil, fmt.Errorf("policy %q: pk=%v is not a Byte Sequence", name, pk)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

func parseRateLimit(lines []string) ([]sfServiceLimit, error) {
	items, err := sfParseFieldList(lines)
	if err != nil {
		return nil, err
	}
	var out []sfServiceLimit
	for _, it := range items {
		name, ok := it.value.(string)
		if !ok {
			return nil, fmt.Errorf("service limit item value %v is not a String", it.value)
		}
		sl := sfServiceLimit{name: name, t: -1}
		r, ok := it.param("r")
		if !ok {
			return nil, fmt.Errorf("service limit %q has no r", name)
		}
		if sl.r, ok = r.(int64); !ok || sl.r < 0 {
			return nil, fmt.Errorf("service limit %q: r=%v is not a non-negative Integer", name, r)
		}
		if tv, ok := it.param("t"); ok {
			if sl.t, ok = tv.(int64); !ok || sl.t < 0 {
				return nil, fmt.Errorf("service limit %q: t=%v is not a non-negative Integer", name, tv)
			}
		}
		if pk, ok := it.param("pk"); ok {
			if _, ok := pk.([]byte); !ok {
				return nil, fmt.Errorf("service limit %q: pk=%v is not a Byte Sequence", name, pk)
			}
		}
		out = append(out, sl)
	}
	return out, nil
}

// sfParseFieldList parses the field lines of a List field: they are
// combined with commas (RFC 9651, 4.2), then parsed as a List whose members
// must be Items (both fields are Lists of Items, not Inner Lists).
func sfParseFieldList(lines []string) ([]sfItem, error) {
	if len(lines) == 0 {
		return nil, fmt.Errorf("field absent")
	}
	p := &sfParser{s: strings.Join(lines, ", ")}
	p.skipSP()
	items, err := p.list()
	if err != nil {
		return nil, err
	}
	p.skipSP()
	if !p.done() {
		return nil, fmt.Errorf("trailing characters at %d", p.i)
	}
	return items, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }
func (p *sfParser) peek() byte { return p.s[p.i] }
func (p *sfParser) skipSP() {
	for !p.done() && p.peek() == ' ' {
		p.i++
	}
}
func (p *sfParser) skipOWS() {
	for !p.done() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

// list is 4.2.1: members separated by OWS "," OWS, no trailing comma.
func (p *sfParser) list() ([]sfItem, error) {
	var items []sfItem
	for !p.done() {
		if p.peek() == '(' {
			return nil, fmt.Errorf("an Inner List at %d where an Item is required", p.i)
		}
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		p.skipOWS()
		if p.done() {
			return items, nil
		}
		if p.peek() != ',' {
			return nil, fmt.Errorf("expected ',' at %d, got %q", p.i, p.peek())
		}
		p.i++
		p.skipOWS()
		if p.done() {
			return nil, fmt.Errorf("trailing comma")
		}
	}
	return items, nil
}

// item is 4.2.3: a bare item, then parameters.
func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	params, err := p.parameters()
	return sfItem{value: v, params: params}, err
}

// parameters is 4.2.3.2.
func (p *sfParser) parameters() ([]sfParam, error) {
	var params []sfParam
	for !p.done() && p.peek() == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var v any = true
		if !p.done() && p.peek() == '=' {
			p.i++
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		params = append(params, sfParam{key, v})
	}
	return params, nil
}

// key is 4.2.3.3: lcalpha or "*", then lcalpha, DIGIT, "_", "-", ".", "*".
func (p *sfParser) key() (string, error) {
	start := p.i
	if p.done() || !(isLower(p.peek()) || p.peek() == '*') {
		return "", fmt.Errorf("a key must start with a-z or '*' at %d", p.i)
	}
	for !p.done() {
		c := p.peek()
		if !(isLower(c) || isDigit(c) || strings.IndexByte("_-.*", c) >= 0) {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

// bareItem is 4.2.3.1, for the types these fields may hold: Integer,
// Decimal, String, Token, Byte Sequence, Boolean.
func (p *sfParser) bareItem() (any, error) {
	if p.done() {
		return nil, fmt.Errorf("a bare item expected at the end")
	}
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == ':':
		return p.bytes()
	case c == '?':
		return p.boolean()
	case isAlpha(c) || c == '*':
		return p.token(), nil
	default:
		return nil, fmt.Errorf("unexpected %q at %d", c, p.i)
	}
}

// number is 4.2.4: an Integer has at most 15 digits, a Decimal at most 12
// before the point and 1 to 3 after it.
func (p *sfParser) number() (any, error) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	if p.done() || !isDigit(p.peek()) {
		return nil, fmt.Errorf("a digit expected at %d", p.i)
	}
	digits, dot := 0, -1
	for !p.done() {
		c := p.peek()
		if isDigit(c) {
			digits++
			p.i++
		} else if c == '.' && dot < 0 {
			if digits > 12 {
				return nil, fmt.Errorf("a Decimal's integer part has more than 12 digits")
			}
			dot = digits
			p.i++
		} else {
			break
		}
		if digits > 15 {
			return nil, fmt.Errorf("number too long at %d", start)
		}
	}
	text := p.s[start:p.i]
	if dot < 0 {
		n, err := strconv.ParseInt(text, 10, 64)
		return n, err
	}
	if frac := digits - dot; frac < 1 || frac > 3 {
		return nil, fmt.Errorf("a Decimal needs 1 to 3 fractional digits: %q", text)
	}
	return strconv.ParseFloat(text, 64)
}

// str is 4.2.5: printable ASCII, '\' escaping only '"' and '\'.
func (p *sfParser) str() (string, error) {
	p.i++ // the opening '"'
	var b strings.Builder
	for !p.done() {
		c := p.peek()
		p.i++
		switch {
		case c == '\\':
			if p.done() || (p.peek() != '"' && p.peek() != '\\') {
				return "", fmt.Errorf("bad escape in a String at %d", p.i)
			}
			b.WriteByte(p.peek())
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte %#x in a String", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("unterminated String")
}

// token is 4.2.6: ALPHA or "*", then tchar, ":" or "/".
func (p *sfParser) token() sfToken {
	start := p.i
	p.i++
	for !p.done() {
		c := p.peek()
		if !(isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0) {
			break
		}
		p.i++
	}
	return sfToken(p.s[start:p.i])
}

// bytes is 4.2.7: base64 between colons.
func (p *sfParser) bytes() ([]byte, error) {
	p.i++
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return nil, fmt.Errorf("unterminated Byte Sequence")
	}
	b, err := base64.StdEncoding.DecodeString(p.s[p.i : p.i+end])
	p.i += end + 1
	return b, err
}

// boolean is 4.2.8: ?0 or ?1.
func (p *sfParser) boolean() (bool, error) {
	p.i++
	if p.done() || (p.peek() != '0' && p.peek() != '1') {
		return false, fmt.Errorf("a Boolean must be ?0 or ?1")
	}
	v := p.peek() == '1'
	p.i++
	return v, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isLower(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool { return isLower(c) || 'A' <= c && c <= 'Z' }

// The parser reads the draft's own examples and refuses what the draft
// or RFC 9651 does not allow.
func TestRateLimitFieldParserReadsTheDraftsExamples(t *testing.T) {
	policies := map[string][]sfPolicy{
		`"burst";q=100;w=60,"daily";q=1000;w=86400`:                   {{"burst", 100, 60}, {"daily", 1000, 86400}},
		`"default";q=100;w=10`:                                        {{"default", 100, 10}},
		`"peruser";q=100;w=60;pk=:cHsdsRa894==:`:                      {{"peruser", 100, 60}},
		`"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`: {{"peruser", 65535, 10}},
		`"sliding";q=100;w=60;burst=1000`:                             {{"sliding", 100, 60}},
		`"hour";q=1000;w=3600, "day";q=5000;w=86400`:                  {{"hour", 1000, 3600}, {"day", 5000, 86400}},
		`"a\"b\\c";q=0`: {{`a"b\c`, 0, 0}},
	}
	for field, want := range policies {
		got, err := parseRateLimitPolicy([]string{field})
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("RateLimit-Policy: %s: %v, %v; want %v", field, got, err, want)
		}
	}
	limits := map[string][]sfServiceLimit{
		`"default";r=50;t=30`:                          {{"default", 50, 30}},
		`"default";r=999;pk=:dHJpYWwxMjEzMjM=:`:        {{"default", 999, -1}},
		`"default";r=300000000;t=60;pk=:QXBwLTk5OQ==:`: {{"default", 300000000, 60}},
		`"problemPolicy";r=0;t=10`:                     {{"problemPolicy", 0, 10}},
	}
	for field, want := range limits {
		got, err := parseRateLimit([]string{field})
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("RateLimit: %s: %v, %v; want %v", field, got, err, want)
		}
	}
	if got, err := parseRateLimit([]string{`"a";r=1`, `"b";r=2;t=3`}); err != nil || len(got) != 2 {
		t.Errorf("two field lines: %v, %v", got, err)
	}
	for _, bad := range []string{
		`default;q=100`,                // a Token, not a String
		`"default";w=10`,               // no q
		`"default";q=-1`,               // negative
		`"default";q=1.5`,              // a Decimal
		`"default";q=100;w=0`,          // w must be non-zero
		`"default";q="100"`,            // a String
		`"default";q=1234567890123456`, // 16 digits
		`"default";q=1,`,               // trailing comma
		`("default");q=1`,              // an Inner List
		`"default";Q=1`,                // keys are lower case
		`"default" ;q=1`,               // no space before parameters
		`"unterminated;q=1`,
		``,
	} {
		if got, err := parseRateLimitPolicy([]string{bad}); err == nil {
			t.Errorf("RateLimit-Policy %q accepted: %v", bad, got)
		}
	}
	for _, bad := range []string{`"default";t=1`, `"default";r=1;t=-1`, `"default";r=1;t=?1`, `"default";r=1;pk=abc`} {
		if got, err := parseRateLimit([]string{bad}); err == nil {
			t.Errorf("RateLimit %q accepted: %v", bad, got)
		}
	}
}
