package rls

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/sluicehq/sluice/window"
)

// cellName returns the namespace and identifier of a descriptor of domain
// (the workspace is ServerConfig.Workspace); shared is Match.Shared (nil:
// none), and buf scratch space, returned for reuse. The mapping is
// injective: two descriptors share a cell only if they are the same domain
// and entries (or, for identifiers over 512 bytes, their SHA-256 collides).
//
//   - namespace: the domain itself when it is a token (1 to 64 of
//     [A-Za-z0-9_-]); otherwise "d-" and the first 32 hex digits of the
//     domain's SHA-256.
//   - identifier: the entries, each key=value, joined by '|', every byte of
//     keys and values outside the set below percent-encoded (%XX); an entry
//     matched by a share_threshold wildcard is key~pattern instead, so every
//     value it matches shares the count. For a domain that is not a token
//     the identifier starts with '@', the encoded domain and '|', so two
//     domains whose hashes (namespaces) agree still never share a cell. An
//     identifier longer than 512 bytes becomes '#' and the hex SHA-256 of
//     the long form.
//
// Keys and values keep [A-Za-z0-9] and -_.:/*+,;!$&'()[] and space as they
// are; '%', '|', '=', '~', '@' and '#' are always encoded, so a plain
// identifier never starts with '@' or '#' and the separators are unambiguous.
func cellName(domain string, entries []Entry, shared []string, buf []byte) (namespace, identifier string, _ []byte) {
	b := buf[:0]
	if window.ValidToken(domain) {
		namespace = domain
	} else {
		sum := sha256.Sum256([]byte(domain))
		namespace = "d-" + hex.EncodeToString(sum[:16])
		b = append(b, '@')
		b = appendEscaped(b, domain)
		b = append(b, '|')
	}
	for i, e := range entries {
		if i > 0 {
			b = append(b, '|')
		}
		b = appendEscaped(b, e.Key)
		if shared != nil && shared[i] != "" {
			b = append(b, '~')
			b = appendEscaped(b, shared[i])
			continue
		}
		b = append(b, '=')
		b = appendEscaped(b, e.Value)
	}
	if len(b) > window.MaxIdentifierLen {
		sum := sha256.Sum256(b)
		return namespace, "#" + hex.EncodeToString(sum[:]), b
	}
	return namespace, string(b), b
}

// plain holds, by byte, whether an identifier keeps it as it is.
var plain = func() (t [256]bool) {
	for _, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:/*+,;!$&'()[] ") {
		t[c] = true
	}
	return t
}()

func appendEscaped(b []byte, s string) []byte {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain[c] {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
	}
	return b
}
