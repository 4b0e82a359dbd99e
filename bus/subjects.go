package bus

import (
	"errors"
	"fmt"
	"strings"
)

// DefaultPrefix is the subject prefix every Sluice subject starts with unless
// configured otherwise.
const DefaultPrefix = "ratelimit"

// Subjects builds and parses the client-facing subjects under one prefix:
// <prefix>.check.<workspace>.<namespace> and <prefix>.batch.<workspace>.
// The zero value uses DefaultPrefix.
type Subjects struct {
	// Prefix is one or more subject tokens, without a trailing dot.
	Prefix string
}

func (s Subjects) prefix() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// ValidPrefix reports whether p is usable as a prefix: one or more tokens of
// [A-Za-z0-9_-] separated by dots.
func ValidPrefix(p string) bool {
	if p == "" {
		return false
	}
	for tok := range strings.SplitSeq(p, ".") {
		if !ValidToken(tok) {
			return false
		}
	}
	return true
}

// CheckPrefix returns an error saying what is wrong with p as a prefix, or
// nil when ValidPrefix(p).
func CheckPrefix(p string) error {
	if !ValidPrefix(p) {
		return fmt.Errorf("subject prefix %q: want tokens of [A-Za-z0-9_-] separated by dots", p)
	}
	return nil
}

// Check returns the subject of a single check.
func (s Subjects) Check(workspace, namespace string) string {
	return s.prefix() + ".check." + workspace + "." + namespace
}

// Batch returns the subject of a batch check.
func (s Subjects) Batch(workspace string) string {
	return s.prefix() + ".batch." + workspace
}

// CheckWildcard is the subject the limiter's check endpoint serves.
func (s Subjects) CheckWildcard() string { return s.prefix() + ".check.*.*" }

// BatchWildcard is the subject the limiter's batch endpoint serves.
func (s Subjects) BatchWildcard() string { return s.prefix() + ".batch.*" }

var (
	errWorkspace = errors.New("workspace must be 1 to 64 characters of [A-Za-z0-9_-]")
	errNamespace = errors.New("namespace must be 1 to 64 characters of [A-Za-z0-9_-]")
)

// ParseCheck returns the workspace and namespace of a check subject. The
// results are substrings of subject; nothing is allocated.
func (s Subjects) ParseCheck(subject string) (workspace, namespace string, err error) {
	rest, ok := strings.CutPrefix(subject, s.prefix()+".check.")
	if !ok {
		return "", "", errors.New("subject must be " + s.prefix() + ".check.<workspace>.<namespace>")
	}
	return parseCheckTokens(rest)
}

// parseCheckTokens splits and validates "<workspace>.<namespace>".
func parseCheckTokens(rest string) (workspace, namespace string, err error) {
	workspace, namespace, ok := strings.Cut(rest, ".")
	if !ValidToken(workspace) {
		return "", "", errWorkspace
	}
	if !ok || !ValidToken(namespace) {
		return "", "", errNamespace
	}
	return workspace, namespace, nil
}

// ParseBatch returns the workspace of a batch subject.
func (s Subjects) ParseBatch(subject string) (workspace string, err error) {
	rest, ok := strings.CutPrefix(subject, s.prefix()+".batch.")
	if !ok {
		return "", errors.New("subject must be " + s.prefix() + ".batch.<workspace>")
	}
	if !ValidToken(rest) {
		return "", errWorkspace
	}
	return rest, nil
}
