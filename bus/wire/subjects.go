package wire

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/window"
)

// DefaultPrefix is the subject prefix every Sluice subject starts with unless
// configured otherwise.
const DefaultPrefix = "ratelimit"

// Subjects builds and parses the client-facing subjects under one prefix:
// <prefix>.check.<workspace>.<namespace>, <prefix>.batch.<workspace> and
// <prefix>.checks.<workspace>.
// The zero value uses DefaultPrefix.
type Subjects struct {
	// Prefix is one or more subject tokens, without a trailing dot.
	Prefix string
}

// Base returns the prefix in effect: Prefix, or DefaultPrefix when empty.
func (s Subjects) Base() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// Internal returns the subject of an internal event kind for region:
// <prefix>.<kind>.<region>, e.g. <prefix>.gc.eu (docs/architecture.md lists
// them).
func (s Subjects) Internal(kind, region string) string { return s.Base() + "." + kind + "." + region }

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
	return s.Base() + ".check." + workspace + "." + namespace
}

// Batch returns the subject of a batch check.
func (s Subjects) Batch(workspace string) string {
	return s.Base() + ".batch." + workspace
}

// Checks returns the subject of a checks message: many independent checks
// of workspace in one message (README, "Many checks in one message").
func (s Subjects) Checks(workspace string) string {
	return s.Base() + ".checks." + workspace
}

// ChecksWildcard is the subject the limiter's checks endpoint serves.
func (s Subjects) ChecksWildcard() string { return s.Base() + ".checks.*" }

// CheckWildcard is the subject the limiter's check endpoint serves.
func (s Subjects) CheckWildcard() string { return s.Base() + ".check.*.*" }

// BatchWildcard is the subject the limiter's batch endpoint serves.
func (s Subjects) BatchWildcard() string { return s.Base() + ".batch.*" }

var (
	errWorkspace = errors.New("workspace must be " + window.TokenRule)
	errNamespace = errors.New("namespace must be " + window.TokenRule)
)

// ParseCheck returns the workspace and namespace of a check subject. The
// results are substrings of subject; nothing is allocated.
func (s Subjects) ParseCheck(subject string) (workspace, namespace string, err error) {
	rest, ok := strings.CutPrefix(subject, s.Base()+".check.")
	if !ok {
		return "", "", errors.New("subject must be " + s.Base() + ".check.<workspace>.<namespace>")
	}
	return ParseCheckTokens(rest)
}

// ParseCheckTokens splits and validates "<workspace>.<namespace>".
func ParseCheckTokens(rest string) (workspace, namespace string, err error) {
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
	return s.parseWorkspace(subject, "batch")
}

// ParseChecks returns the workspace of a checks subject.
func (s Subjects) ParseChecks(subject string) (workspace string, err error) {
	return s.parseWorkspace(subject, "checks")
}

// parseWorkspace returns the workspace of a <prefix>.<kind>.<workspace>
// subject.
func (s Subjects) parseWorkspace(subject, kind string) (string, error) {
	rest, ok := strings.CutPrefix(subject, s.Base()+"."+kind+".")
	if !ok {
		return "", errors.New("subject must be " + s.Base() + "." + kind + ".<workspace>")
	}
	if !ValidToken(rest) {
		return "", errWorkspace
	}
	return rest, nil
}

// CheckTokens returns a *BadRequestError saying which of workspace and
// namespaces (each optional) is not a valid subject token, or nil: what a
// client can refuse before sending.
func CheckTokens(workspace string, namespaces ...string) error {
	if !ValidToken(workspace) {
		return &BadRequestError{Msg: errWorkspace.Error()}
	}
	for _, ns := range namespaces {
		if !ValidToken(ns) {
			return &BadRequestError{Msg: errNamespace.Error()}
		}
	}
	return nil
}

// Decisions returns the subject decision events of workspace and namespace
// are published on: <prefix>.decisions.<workspace>.<namespace>.
func (s Subjects) Decisions(workspace, namespace string) string {
	return s.Base() + ".decisions." + workspace + "." + namespace
}

// DecisionsWildcard is the subject of every decision event:
// <prefix>.decisions.>.
func (s Subjects) DecisionsWildcard() string { return s.Base() + ".decisions.>" }
