// Package policy holds the rules of Sluice's policies: overrides of the
// limit and duration that checks carry, shadow mode, and reset marks. It is
// pure: no I/O, no clock (instants are arguments), no goroutines. Storing
// and carrying policies between processes and regions is the global
// layer's; serving and applying them is the limiter's.
//
// An override is keyed by (workspace, namespace, pattern); a pattern is an
// exact identifier, or bytes with '*' wildcards, each matching any run of
// bytes (possibly empty). A check takes the override of the most specific
// pattern that matches its identifier (ComparePatterns): the exact one if there is
// one; otherwise the one with the most literal bytes, so among prefixes
// ("user_*") the longest; otherwise none (Table.Match). The pattern is the
// override's identity within its namespace: there is no other id.
//
// Every entry is versioned, and entries of one key merge last-writer-wins
// by a total order (Compare), so replicas that receive the same entries in
// any order, any number of times, hold the same table.
//
// A reset is a Mark: an epoch, merged by max, that becomes part of the
// identity of the one window cell it falls in, so a decision reads cells
// that hold only usage after the reset and nothing is ever subtracted
// (CellEpoch, Forgotten).
package policy

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/window"
)

// Bounds of what the policies of one workspace may hold.
const (
	// MaxOverridesPerWorkspace is the most live overrides one workspace
	// may set; Table.Set refuses a new pattern beyond it. It also bounds
	// the tombstones a workspace keeps.
	MaxOverridesPerWorkspace = 10_000
	// MaxMarksPerWorkspace is the most reset marks (one per identifier and
	// duration, until they expire) one workspace may hold; Marks.Reset
	// refuses a new one beyond it. Marks of every duration last 5 to 10
	// minutes (AllDurationsFor), so it bounds the rate of resets (about
	// 170 a second, sustained), not their total.
	MaxMarksPerWorkspace = 100_000
	// MaxPatternLen is the longest pattern, in bytes, '*'s included.
	MaxPatternLen = window.MaxIdentifierLen
	// TombstoneRetention is how long a deleted override is remembered,
	// so that an older set arriving late cannot bring it back. Pass
	// TombstoneCutoff(now) to Table.Prune.
	TombstoneRetention = 24 * time.Hour
	// tombstoneStep is the step of TombstoneCutoff.
	tombstoneStep = int64(time.Minute / time.Millisecond)
)

// TombstoneCutoff returns the version (unix ms) before which tombstones are
// forgotten at now: now less TombstoneRetention, rounded down to a whole
// minute. Every replica prunes at the same cutoffs, so two that prune at
// different moments of one minute still hold the same entries, and their
// digests agree.
func TombstoneCutoff(now int64) int64 {
	c := now - TombstoneRetention.Milliseconds()
	return c - ((c%tombstoneStep)+tombstoneStep)%tombstoneStep
}

// Errors that policy operations wrap.
var (
	// ErrInvalid: a value outside the contract's bounds (token, pattern,
	// limit, duration, version, epoch). Nothing was changed.
	ErrInvalid = errors.New("invalid policy")
	// ErrTooMany: a workspace already holds the most overrides or marks
	// allowed. Nothing was changed.
	ErrTooMany = errors.New("too many policies")
	// ErrNotFound: a delete of a pattern that has no live override.
	ErrNotFound = errors.New("no such override")
	// ErrFuture: an entry or mark stamped later than the receiver's clock
	// plus the clock-skew tolerance; merging it would let one bad clock
	// win every later change (an entry) or forget usage not yet made (a
	// mark).
	ErrFuture = errors.New("stamped ahead of the local clock by more than the clock-skew tolerance")
)

// Key identifies an override: a workspace, a namespace and a pattern.
type Key struct {
	Workspace string
	Namespace string
	// Pattern is an exact identifier (no '*'), or bytes with '*'
	// wildcards (ValidatePattern).
	Pattern string
}

// IsExact reports whether k's pattern is an exact identifier (has no '*').
func (k Key) IsExact() bool { return strings.IndexByte(k.Pattern, '*') < 0 }

// IsPrefix reports whether k's pattern is a prefix pattern: one '*', its
// last byte.
func (k Key) IsPrefix() bool {
	return strings.IndexByte(k.Pattern, '*') == len(k.Pattern)-1
}

// isGlob reports whether k's pattern is neither exact nor a prefix pattern.
func (k Key) isGlob() bool { return !k.IsExact() && !k.IsPrefix() }

// Prefix returns the literal bytes of k's pattern before its first '*':
// the prefix of a prefix pattern ("" for "*"), the exact identifier of an
// exact pattern.
func (k Key) Prefix() string {
	if i := strings.IndexByte(k.Pattern, '*'); i >= 0 {
		return k.Pattern[:i]
	}
	return k.Pattern
}

// Validate says what is wrong with k, if anything: tokens by
// window.ValidToken and the pattern by ValidatePattern. The error wraps
// ErrInvalid.
func (k Key) Validate() error {
	if err := validScope(k.Workspace, k.Namespace); err != nil {
		return err
	}
	return ValidatePattern(k.Pattern)
}

// validScope says, wrapping ErrInvalid, which of workspace and namespace
// breaks window.ValidToken, if either does.
func validScope(workspace, namespace string) error {
	return cmp.Or(validToken("workspace", workspace), validToken("namespace", namespace))
}

// validToken says, wrapping ErrInvalid, that token s (named what) breaks
// window.ValidToken, if it does.
func validToken(what, s string) error {
	if !window.ValidToken(s) {
		return fmt.Errorf("%w: %w", ErrInvalid, window.TokenError(what, s))
	}
	return nil
}

// validateAll returns the first error of items' Validate, prefixed by op
// and the item's index.
func validateAll[T interface{ Validate() error }](op string, items []T) error {
	for i, v := range items {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("%s %d: %w", op, i, err)
		}
	}
	return nil
}

// checkAt returns err, or, when err is nil and the version or epoch at
// (named what) is more than skewMs ahead of now, an error wrapping
// ErrFuture.
func checkAt(err error, what string, at, now, skewMs int64) error {
	if err == nil && at > now+skewMs {
		return fmt.Errorf("%w: %s %dms from now (tolerance %dms)", ErrFuture, what, at-now, skewMs)
	}
	return err
}

// ValidatePattern reports whether p is a valid pattern: 1 to MaxPatternLen
// bytes of any value, where each '*' is a wildcard matching any run of
// bytes, possibly empty ("*" alone matches every identifier), and no two
// '*' are adjacent ("**" would match what "*" does, under another key).
// A pattern without '*' is an exact identifier; so an identifier holding
// '*' cannot have an exact override, only patterns that match it. The
// error wraps ErrInvalid.
func ValidatePattern(p string) error {
	switch {
	case len(p) == 0:
		return fmt.Errorf("%w: pattern is empty; give an identifier, or a pattern where * matches any bytes", ErrInvalid)
	case len(p) > MaxPatternLen:
		return fmt.Errorf("%w: pattern of %d bytes is longer than %d", ErrInvalid, len(p), MaxPatternLen)
	case strings.Contains(p, "**"):
		return fmt.Errorf("%w: pattern %q has two adjacent *; one * already matches any run of bytes", ErrInvalid, truncate(p))
	}
	return nil
}

// truncate shortens s for an error message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Override is what a matching override makes a check apply: its limit and
// duration in place of the request's, and whether it is in shadow mode
// (counted as if enforced, never denied).
type Override struct {
	Limit    int64 // 0 to window.MaxLimit
	Duration int64 // milliseconds, window.MinDuration to window.MaxDuration, or a calendar period (window.ValidDuration)
	Shadow   bool
}

// Validate says what is wrong with o, if anything: a limit or duration
// outside the bounds a check has. The error wraps ErrInvalid.
func (o Override) Validate() error {
	switch {
	case o.Limit < 0 || o.Limit > window.MaxLimit:
		return fmt.Errorf("%w: limit %d out of range 0..%d", ErrInvalid, o.Limit, int64(window.MaxLimit))
	case window.ValidDuration(o.Duration) != nil:
		return fmt.Errorf("%w: %w", ErrInvalid, window.ValidDuration(o.Duration))
	}
	return nil
}

// Version orders the changes of one key: when the change was accepted
// (unix milliseconds, by the accepting process's clock) and the region that
// accepted it.
type Version struct {
	At     int64
	Origin string
}

// Next returns the version a change accepted at now (unix ms) in region
// origin gets when it replaces v: At is now, or v.At+1 when the clock has
// not moved past v, so a change always wins over the one it replaces where
// it was made.
func (v Version) Next(now int64, origin string) Version {
	return Version{At: max(now, v.At+1), Origin: origin}
}

// Validate says what is wrong with v, if anything: At of 1 to
// window.MaxTime, Origin a token. The error wraps ErrInvalid.
func (v Version) Validate() error {
	if v.At < 1 || v.At > window.MaxTime {
		return fmt.Errorf("%w: version time %d out of range 1..%d", ErrInvalid, v.At, int64(window.MaxTime))
	}
	return validToken("version origin", v.Origin)
}

// Entry is one versioned override, or the tombstone of a deleted one
// (Deleted set, Override zero). It is what replicas exchange and store.
type Entry struct {
	Key
	Override
	Deleted bool
	Version Version
}

// Validate says what is wrong with e, if anything: its key, its version,
// and, unless it is a tombstone, its override; a tombstone's override must
// be zero. The error wraps ErrInvalid.
func (e Entry) Validate() error {
	if err := cmp.Or(e.Key.Validate(), e.Version.Validate()); err != nil {
		return err
	}
	if e.Deleted {
		if e.Override != (Override{}) {
			return fmt.Errorf("%w: a deleted override carries limit %d, duration %d, shadow %t", ErrInvalid, e.Limit, e.Duration, e.Shadow)
		}
		return nil
	}
	return e.Override.Validate()
}

// CheckAt is Validate for an entry received from another process at now
// (unix ms, the receiver's clock): it is also refused, with ErrFuture, when
// its version is more than skewMs ahead of now.
func (e Entry) CheckAt(now, skewMs int64) error {
	return checkAt(e.Validate(), "version", e.Version.At, now, skewMs)
}

// Compare orders two entries of one key by which wins a merge: the later
// Version.At, then the larger Version.Origin (byte order), then the content
// (a tombstone over a live entry, then the larger limit, duration and
// shadow). It is a total order on entries of one key (0 only for equal
// entries), so a merge that keeps the larger is commutative, associative
// and idempotent.
func Compare(a, b Entry) int {
	return cmp.Or(compareVersions(a.Version, b.Version), cmp.Compare(b2i(a.Deleted), b2i(b.Deleted)),
		cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Duration, b.Duration), cmp.Compare(b2i(a.Shadow), b2i(b.Shadow)))
}

// compareVersions orders versions by At, then Origin (byte order).
func compareVersions(a, b Version) int {
	return cmp.Or(cmp.Compare(a.At, b.At), strings.Compare(a.Origin, b.Origin))
}
