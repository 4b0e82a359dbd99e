package transport

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus/wire"
)

// The HTTP door (README, "HTTP door"): the limiter's endpoints over HTTP,
// for clients without NATS (curl, serverless functions). It is an adapter,
// not a second implementation: a request's path names the subject the NATS
// door would have received, its body and headers are the NATS request's,
// and the endpoint's own handler answers it through an httpRequest, a
// micro.Request whose answer becomes the HTTP response. So the same strict
// decoders, the same --max-waiting-checks gate, the same counters
// (EndpointStats, AdminStats, Stats) and latency samples apply.
//
// Every path is the subject under the default prefix with '/' for '.', and
// maps to the subject under the limiter's prefix (Subjects):
//
//	POST /ratelimit/check/{workspace}/{namespace}   <prefix>.check.<workspace>.<namespace>
//	POST /ratelimit/batch/{workspace}               <prefix>.batch.<workspace>
//	POST /ratelimit/checks/{workspace}              <prefix>.checks.<workspace>
//	POST /ratelimit/admin/{workspace}/override/set  <prefix>.admin.<workspace>.override.set
//	     (and override/get, override/delete, override/list, reset)
//
// The reply is the NATS reply's body with status 200 (a denial too: the
// decision is the body), or the error reply's body with the micro error
// code as the status (400, 500, 503) and the same Nats-Service-Error and
// Nats-Service-Error-Code headers. Content-Type names the reply's encoding,
// the request's. The door itself answers, with a JSON {"error": ...} body,
// 404 for a path no endpoint serves (where NATS would have no responders),
// 405 for a method other than POST, 413 for a body over the NATS
// connection's max payload, and 401 or 403 for an admin request without
// credentials or with wrong ones; none of those is counted by an endpoint.

// HTTPPathPrefix starts every path of the HTTP door.
const HTTPPathPrefix = "/ratelimit/"

// HTTPConfig holds what the HTTP door needs beyond its limiter.
type HTTPConfig struct {
	// AdminToken, when not empty, admits a request to the admin paths that
	// carries it as "Authorization: Bearer <AdminToken>". A request whose
	// TLS client certificate the server verified (http.Request.TLS's
	// VerifiedChains, which a tls.Config with ClientCAs fills) is admitted
	// without it. Anything else is refused: 401 without credentials when a
	// token is set, 403 otherwise.
	AdminToken string
	// Logger receives refused admin requests; nil: the limiter's.
	Logger *slog.Logger
}

// HTTPHandler returns the limiter's HTTP door: an http.Handler that answers
// the paths above with the limiter's endpoints. It is safe for
// simultaneous use, serves any number of requests at once, and waits for a
// request's one answer (or the request's context to end) before it
// returns. Shutdown of the limiter makes its endpoints answer 503; stop
// the HTTP server first (http.Server.Shutdown), so that requests in flight
// get their decisions.
func (l *Limiter) HTTPHandler(cfg HTTPConfig) http.Handler {
	d := &httpDoor{l: l, log: cfg.Logger, hasToken: cfg.AdminToken != ""}
	if d.log == nil {
		d.log = l.log
	}
	d.tokenSum = sha256.Sum256([]byte(cfg.AdminToken))
	return d
}

type httpDoor struct {
	l        *Limiter
	log      *slog.Logger
	hasToken bool
	tokenSum [sha256.Size]byte // compared in constant time, whatever the length
}

// The endpoints: what a path names, and whose subject Limiter.open parses.
const (
	routeCheck = iota + 1
	routeBatch
	routeChecks
	routeAdmin
)

// route returns the endpoint and subject of path, or 0 when no endpoint
// serves it: a segment missing, extra, empty or holding a '.' (which would
// shift the subject's tokens: NATS would route such a subject to no
// endpoint).
func (d *httpDoor) route(path string) (int, string) {
	rest, ok := strings.CutPrefix(path, HTTPPathPrefix)
	if !ok {
		return 0, ""
	}
	var seg [5]string
	n := 0
	for s := range strings.SplitSeq(rest, "/") {
		if n == len(seg) || s == "" || strings.IndexByte(s, '.') >= 0 {
			return 0, ""
		}
		seg[n] = s
		n++
	}
	subj := d.l.cfg.Subjects
	switch {
	case n == 3 && seg[0] == "check":
		return routeCheck, subj.Check(seg[1], seg[2])
	case n == 2 && seg[0] == "batch":
		return routeBatch, subj.Batch(seg[1])
	case n == 2 && seg[0] == "checks":
		return routeChecks, subj.Checks(seg[1])
	case n == 3 && seg[0] == "admin" && seg[2] == "reset",
		n == 4 && seg[0] == "admin" && seg[2] == "override" &&
			(seg[3] == "set" || seg[3] == "get" || seg[3] == "delete" || seg[3] == "list"):
		return routeAdmin, subj.Base() + ".admin." + strings.Join(seg[1:n], ".")
	}
	return 0, ""
}

func (d *httpDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route, subject := d.route(r.URL.Path)
	if route == 0 {
		d.refuse(w, http.StatusNotFound, "no endpoint at "+strconv.Quote(r.URL.Path)+": POST to "+HTTPPathPrefix+
			"check/{workspace}/{namespace}, batch/{workspace}, checks/{workspace} or admin/{workspace}/(override/(set|get|delete|list)|reset)")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		d.refuse(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed: use POST")
		return
	}
	if route == routeAdmin && !d.authorized(w, r) {
		return
	}
	body, status, err := d.readBody(w, r)
	if err != nil {
		d.refuse(w, status, err.Error())
		return
	}
	req := &httpRequest{subject: subject, data: body, headers: micro.Headers(r.Header), admin: route == routeAdmin,
		done: make(chan struct{})}
	l := d.l
	switch route {
	case routeCheck:
		l.check(req, false)
	case routeBatch:
		l.handleBatch(req)
	case routeChecks:
		l.handleChecks(req, false)
	case routeAdmin:
		l.handleAdmin(req)
	}
	select {
	case <-req.done:
	case <-r.Context().Done():
		return // the client is gone; the answer, when it comes, is dropped
	}
	h := w.Header()
	maps.Copy(h, req.header)
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", req.contentType())
	}
	h.Set("Content-Length", strconv.Itoa(len(req.body)))
	w.WriteHeader(req.status)
	_, _ = w.Write(req.body)
}

// readBody reads the request's body, at most the NATS connection's max
// payload: what the NATS door could have received. Over it, status 413.
func (d *httpDoor) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	limit := d.l.nc.MaxPayload()
	if limit <= 0 {
		limit = 1 << 20 // NATS's default, before the server announced its own
	}
	if r.ContentLength > limit {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body of %d bytes is over the limit of %d", r.ContentLength, limit)
	}
	rd := http.MaxBytesReader(w, r.Body, limit)
	var body []byte
	var err error
	if r.ContentLength >= 0 {
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(rd, body)
	} else {
		body, err = io.ReadAll(rd)
	}
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body is over the limit of %d bytes", limit)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading the body: %w", err)
	}
	return body, 0, nil
}

// authorized reports whether r may use an admin path, and answers it when
// not: a verified client certificate or the bearer token admits it.
func (d *httpDoor) authorized(w http.ResponseWriter, r *http.Request) bool {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	auth := r.Header.Get("Authorization")
	if !d.hasToken {
		d.refuse(w, http.StatusForbidden, "the admin paths need a client certificate this door verifies, or a bearer token it was given")
		return false
	}
	scheme, token, _ := strings.Cut(auth, " ")
	if auth == "" || !strings.EqualFold(scheme, "Bearer") {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
		d.refuse(w, http.StatusUnauthorized, "the admin paths need Authorization: Bearer <token>")
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if subtle.ConstantTimeCompare(sum[:], d.tokenSum[:]) != 1 {
		d.log.Warn("HTTP admin request refused: wrong token", "remote", r.RemoteAddr, "path", r.URL.Path)
		d.refuse(w, http.StatusForbidden, "wrong token")
		return false
	}
	return true
}

// refuse answers one of the door's own refusals, counted by status
// (Limiter.HTTPRefusals): status and a JSON error body, as the endpoints'
// errors read.
func (d *httpDoor) refuse(w http.ResponseWriter, status int, msg string) {
	d.l.httpRefused.add(status)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(wire.AppendError(nil, wire.JSON, msg))
}

// errAnswered is what an httpRequest's second answer returns: it is dropped.
var errAnswered = errors.New("bus: HTTP request already answered")

// httpRequest is a request of the HTTP door as the endpoints' handlers see
// it. The first answer (Respond, RespondJSON, Error, or answer from the
// limiter's own reply paths), from any goroutine, is kept and ends the wait
// of the HTTP handler, which writes it; later answers are dropped.
type httpRequest struct {
	subject string
	data    []byte
	headers micro.Headers
	admin   bool

	answered atomic.Bool
	done     chan struct{} // closed once the answer below is set
	status   int
	header   http.Header // the answer's own headers
	body     []byte
}

var _ micro.Request = (*httpRequest)(nil)

// Respond answers 200 with a copy of body and the headers opts set.
func (r *httpRequest) Respond(body []byte, opts ...micro.RespondOpt) error {
	return r.answer(200, respondHeader(opts), bytes.Clone(body))
}

// RespondJSON answers 200 with v in JSON.
func (r *httpRequest) RespondJSON(v any, opts ...micro.RespondOpt) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%w: %v", micro.ErrMarshalResponse, err)
	}
	return r.answer(200, respondHeader(opts), body)
}

// Error answers the micro error code as the HTTP status (500 when it is
// not one), with the micro error headers and a copy of data.
func (r *httpRequest) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	if code == "" {
		return fmt.Errorf("%w: error code", micro.ErrArgRequired)
	}
	status, err := strconv.Atoi(code)
	if err != nil || status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	h := respondHeader(opts)
	if h == nil {
		h = make(http.Header, 2)
	}
	h[micro.ErrorHeader] = []string{description}
	h[micro.ErrorCodeHeader] = []string{code}
	return r.answer(status, h, bytes.Clone(data))
}

func (r *httpRequest) Data() []byte           { return r.data }
func (r *httpRequest) Headers() micro.Headers { return r.headers }
func (r *httpRequest) Subject() string        { return r.subject }

// Reply is empty: no NATS subject waits for the answer.
func (r *httpRequest) Reply() string { return "" }

// answer keeps the first answer, whose body it takes, and ends the wait.
func (r *httpRequest) answer(status int, h http.Header, body []byte) error {
	if !r.answered.CompareAndSwap(false, true) {
		return errAnswered
	}
	r.status, r.header, r.body = status, h, body
	close(r.done)
	return nil
}

// contentType names the reply's encoding: the request's, as the endpoint
// decided it (JSON when it could not).
func (r *httpRequest) contentType() string {
	enc, _ := requestEncoding(r)
	if r.admin {
		enc, _ = adminEncoding(r)
	}
	return enc.ContentType()
}

// respondHeader returns the headers that opts set on a reply, or nil.
func respondHeader(opts []micro.RespondOpt) http.Header {
	if len(opts) == 0 {
		return nil
	}
	m := &nats.Msg{Header: nats.Header{}}
	for _, o := range opts {
		o(m)
	}
	return http.Header(m.Header)
}

// httpRefusals counts the HTTP door's own refusals by status; endpoints
// count what they answer themselves.
type httpRefusals struct {
	byStatus [6]atomic.Int64 // 400, 401, 403, 404, 405, 413
}

// httpRefusalCodes are the statuses httpRefusals counts, in its order.
var httpRefusalCodes = [...]int{400, 401, 403, 404, 405, 413}

func (c *httpRefusals) add(status int) {
	if i := slices.Index(httpRefusalCodes[:], status); i >= 0 {
		c.byStatus[i].Add(1)
	}
}

// HTTPRefusals calls yield with each status the HTTP door refused requests
// with before any endpoint saw them (a path or method it does not serve, a
// body over the max payload or unreadable, admin credentials missing or
// wrong) and how many, until yield returns false.
func (l *Limiter) HTTPRefusals(yield func(status int, n int64) bool) {
	for i, code := range httpRefusalCodes {
		if !yield(code, l.httpRefused.byStatus[i].Load()) {
			return
		}
	}
}
