// Package redact hides the secrets in connection strings (NATS and Redis
// URLs, MySQL DSNs) before they reach a log line, an error or a probe's
// answer. Every Sluice process prints its connection strings through it.
//
// It errs towards hiding: where a string could be read two ways, the reading
// that hides more wins.
package redact

import (
	"net/url"
	"slices"
	"strings"
)

// Mask replaces every hidden secret.
const Mask = "xxxxx"

// Conn returns s, a connection string, with its secrets replaced by Mask:
//
//   - a URL (scheme://[userinfo@]host...) or a comma-separated list of them,
//     as --nats-url takes: a password (user:password@) is replaced and the
//     user kept; userinfo without a colon is a NATS token (nats://token@host)
//     and is replaced whole; the userinfo ends at the URL's last @, so an @
//     inside a password hides too much rather than too little;
//   - a MySQL DSN (user[:password]@net(addr)/db?params): the password is
//     replaced, found as the go-sql-driver finds it (after the first colon,
//     before the last @ that precedes the last slash).
//
// Conn never fails and does not validate s.
func Conn(s string) string {
	var b strings.Builder
	last := 0
	for _, sp := range spans(s) {
		b.WriteString(s[last:sp[0]])
		b.WriteString(Mask)
		last = sp[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// Secrets returns the secrets Conn hides in s, each as written and, where
// it differs, percent-decoded (a URL's password reaches the server decoded,
// and libraries may quote either form in their errors).
func Secrets(s string) []string {
	var out []string
	for _, sp := range spans(s) {
		v := s[sp[0]:sp[1]]
		out = append(out, v)
		if d, err := url.PathUnescape(v); err == nil && d != v {
			out = append(out, d)
		}
	}
	return out
}

// spans returns the byte ranges [start, end) of the secrets in s, in order.
func spans(s string) [][2]int {
	if !strings.Contains(s, "://") {
		if sp, ok := dsnSpan(s); ok {
			return [][2]int{sp}
		}
		return nil
	}
	var out [][2]int
	off := 0
	for p := range strings.SplitSeq(s, ",") {
		if sp, ok := urlSpan(p); ok {
			out = append(out, [2]int{off + sp[0], off + sp[1]})
		}
		off += len(p) + 1
	}
	return out
}

// urlSpan finds the secret of one URL: the password of user:password@, or
// a whole userinfo without a colon (a token).
func urlSpan(raw string) ([2]int, bool) {
	i := strings.Index(raw, "://")
	if i < 0 {
		return dsnSpan(raw)
	}
	start := i + len("://")
	at := strings.LastIndex(raw[start:], "@")
	if at <= 0 {
		return [2]int{}, false
	}
	at += start
	if colon := strings.Index(raw[start:at], ":"); colon >= 0 {
		start += colon + 1
	}
	if start == at {
		return [2]int{}, false // user: with an empty password
	}
	return [2]int{start, at}, true
}

// dsnSpan finds the password of a MySQL DSN.
func dsnSpan(s string) ([2]int, bool) {
	head := s
	if slash := strings.LastIndex(s, "/"); slash >= 0 {
		head = s[:slash]
	}
	at := strings.LastIndex(head, "@")
	if at < 0 {
		return [2]int{}, false
	}
	colon := strings.Index(head[:at], ":")
	if colon < 0 || colon+1 == at {
		return [2]int{}, false
	}
	return [2]int{colon + 1, at}, true
}

// Error returns err with every secret of conn (see Secrets) replaced by
// Mask in its text, for errors that libraries build from a connection
// string (a URL parser quotes the whole URL). errors.Is and errors.As still
// see err. It returns nil for a nil err and err itself when conn holds no
// secret.
func Error(err error, conn string) error {
	if err == nil {
		return nil
	}
	secrets := Secrets(conn)
	if len(secrets) == 0 {
		return err
	}
	return &redactedError{err: err, secrets: secrets}
}

// redactedError is an error whose text hides some secrets.
type redactedError struct {
	err     error
	secrets []string
}

// Error returns the wrapped error's text with the secrets replaced.
func (e *redactedError) Error() string {
	return Text(e.err.Error(), e.secrets...)
}

// Unwrap returns the wrapped error.
func (e *redactedError) Unwrap() error { return e.err }

// Text returns s with every non-empty secret replaced by Mask, longest
// first, so that a secret holding another is hidden whole.
func Text(s string, secrets ...string) string {
	sorted := slices.DeleteFunc(slices.Clone(secrets), func(v string) bool { return v == "" })
	slices.SortFunc(sorted, func(a, b string) int { return len(b) - len(a) })
	for _, v := range sorted {
		s = strings.ReplaceAll(s, v, Mask)
	}
	return s
}
