package natslimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/wire"
)

// KeyFunc returns the identifier a request is limited under, from its
// subject and headers, and false when the request carries none (the
// Middleware then limits it under Config.Unidentified). A key function
// must be safe for simultaneous use; the headers are the request's own and
// must not be changed.
type KeyFunc func(subject string, h nats.Header) (string, bool)

// SubjectToken returns a KeyFunc taking the i-th token of the subject
// (0 is the first; a negative i counts from the end, -1 being the last),
// for a service whose subject carries the caller: "orders.<tenant>.create"
// with SubjectToken(1). A subject with too few tokens, or an empty token,
// has no key.
func SubjectToken(i int) KeyFunc {
	return func(subject string, _ nats.Header) (string, bool) {
		tokens := strings.Split(subject, ".")
		if i < 0 {
			i += len(tokens)
		}
		if i < 0 || i >= len(tokens) || tokens[i] == "" {
			return "", false
		}
		return tokens[i], true
	}
}

// Header returns a KeyFunc taking the first value of the header name
// (NATS header names are case-sensitive). A missing or empty value has no
// key. A header is whatever the caller sent: limit by it only where the
// caller cannot choose it freely (a gateway or an upstream service sets
// it), or for fairness between well-behaved callers.
func Header(name string) KeyFunc {
	return func(_ string, h nats.Header) (string, bool) {
		v := h.Get(name)
		return v, v != ""
	}
}

// Account returns a KeyFunc taking the requesting account from the
// Nats-Request-Info header (RequestInfo.Account). The server sets that
// header on every request that crosses a service import, so a service
// that tenants reach through imports limits each tenant account apart.
// A request without the header, or with one that does not parse, has no
// key.
func Account() KeyFunc {
	return func(_ string, h nats.Header) (string, bool) {
		info, err := ParseRequestInfo(h)
		if err != nil || info.Account == "" {
			return "", false
		}
		return info.Account, true
	}
}

// User returns a KeyFunc taking the requesting account and user from the
// Nats-Request-Info header as "<account>/<user>", so that users of one
// account are limited apart and two accounts' users of the same name are
// not mixed. The server names the user only when the tenant's import
// shares it (`share: true` in the import, `nsc add import --share`); a
// request without a user has no key.
func User() KeyFunc {
	return func(_ string, h nats.Header) (string, bool) {
		info, err := ParseRequestInfo(h)
		if err != nil || info.Account == "" || info.User == "" {
			return "", false
		}
		return info.Account + "/" + info.User, true
	}
}

// FirstOf returns a KeyFunc taking the key of the first of keys that has
// one: FirstOf(User(), Account()) limits per user where the import shares
// users and per account elsewhere.
func FirstOf(keys ...KeyFunc) KeyFunc {
	return func(subject string, h nats.Header) (string, bool) {
		for _, k := range keys {
			if v, ok := k(subject, h); ok {
				return v, true
			}
		}
		return "", false
	}
}

// RequestInfoHeader is the header in which nats-server tells a service who
// sent a request that crossed a service import: a JSON object with at
// least "acc", the requesting account.
const RequestInfoHeader = "Nats-Request-Info"

// MaxRequestInfo is the longest Nats-Request-Info value ParseRequestInfo
// decodes, in bytes. A shared import puts the user's JWT in it, a few
// KiB at most; anything longer is refused unread.
const MaxRequestInfo = 64 << 10

// RequestInfo is what nats-server says of a request's sender in the
// Nats-Request-Info header.
//
// The server writes the header when a request crosses a service import
// into the service's account, replacing any header of that name the
// sender wrote, so on a subject that only imports reach the header is the
// server's word. Inside the service's own account nothing crosses an
// import: a client of that account may write the header itself, so trust
// it only on subjects that no client of the service's account publishes
// to (or that its permissions forbid them).
type RequestInfo struct {
	// Account is the requesting account ("acc"): the account's name in a
	// configuration file, its public key (A…) in operator mode. Always
	// present.
	Account string `json:"acc"`
	// User is the requesting user ("user"): the user name, or the user's
	// public key for nkey and JWT users. Present only when the import
	// shares details (`share: true`).
	User string `json:"user"`
	// Name is the client's connection name ("name"), with sharing only.
	Name string `json:"name"`
	// Service is the account whose service import forwarded the request
	// when imports are chained ("svc"); empty for a direct import.
	Service string `json:"svc"`
}

// Errors of ParseRequestInfo.
var (
	// ErrNoRequestInfo is returned when the header is absent: the request
	// did not cross a service import.
	ErrNoRequestInfo = errors.New("natslimit: no " + RequestInfoHeader + " header")
	// ErrBadRequestInfo is wrapped by the errors for a header that is
	// present but not one value of at most MaxRequestInfo bytes holding a
	// JSON object whose account and user are valid identifiers.
	ErrBadRequestInfo = errors.New("natslimit: bad " + RequestInfoHeader + " header")
)

// ParseRequestInfo decodes the Nats-Request-Info header of h. It returns
// ErrNoRequestInfo when h has none, and an error wrapping ErrBadRequestInfo
// for a header given more than once, longer than MaxRequestInfo, not a
// JSON object, without an account, or naming an account or user that is
// not an identifier (1 to 512 bytes). It never panics, whatever the bytes.
func ParseRequestInfo(h nats.Header) (RequestInfo, error) {
	vs := h[RequestInfoHeader]
	switch {
	case len(vs) == 0:
		return RequestInfo{}, ErrNoRequestInfo
	case len(vs) > 1:
		return RequestInfo{}, fmt.Errorf("%w: %d values", ErrBadRequestInfo, len(vs))
	case len(vs[0]) > MaxRequestInfo:
		return RequestInfo{}, fmt.Errorf("%w: %d bytes, more than %d", ErrBadRequestInfo, len(vs[0]), MaxRequestInfo)
	}
	var info RequestInfo
	if err := json.Unmarshal([]byte(vs[0]), &info); err != nil {
		return RequestInfo{}, fmt.Errorf("%w: %v", ErrBadRequestInfo, err)
	}
	if info.Account == "" {
		return RequestInfo{}, fmt.Errorf("%w: no account", ErrBadRequestInfo)
	}
	// The keys are identifiers: the account alone (Account), and
	// "<account>/<user>" (User).
	if len(info.Account) > wire.MaxIdentifierLen || info.User != "" && len(info.Account)+1+len(info.User) > wire.MaxIdentifierLen {
		return RequestInfo{}, fmt.Errorf("%w: account or user longer than an identifier", ErrBadRequestInfo)
	}
	return info, nil
}
