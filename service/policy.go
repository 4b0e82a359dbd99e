package service

import (
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// Decision is a check's decision under the policy it was decided by: what
// the window rule decided (counted exactly as if enforced, shadow mode or
// not), the limit applied, whether shadow mode answers it, and which
// override applied, if any.
type Decision struct {
	window.Decision
	// Limit is the limit applied: the matching override's, else the
	// query's own.
	Limit int64
	// Shadow reports shadow mode (the matching override's or the query's):
	// a denial is answered as a success with shadow_denied (Reply).
	Shadow bool
	// Override is the pattern of the override that applied (its identity
	// in the namespace, as policy.Table.Match returns it), "" when none did
	// and the query's own limit and duration applied. It is the table's
	// string, never the query's identifier, so it may be kept.
	Override string
}

// Reply is what the check answers beyond the decision's counts: success,
// shadow_denied and retry_after, by policy.ShadowReply.
func (d Decision) Reply() policy.Reply { return policy.ShadowReply(d.Decision, d.Shadow) }

// policyCache is a bucket's cached match of the overrides, valid while the
// table's generation is gen.
type policyCache struct {
	gen     uint64
	o       policy.Override
	pattern string
	ok      bool
}

// Policies returns the override table the service decides by: the one
// Config.Policies named, else its own. Changes to it apply to the checks
// that follow.
func (s *Service) Policies() *policy.Table { return s.policies }

// police applies the overrides to q: the matching override's limit and
// duration replace q's, its shadow mode makes q's, and its pattern is
// recorded for the Decision. b, when not nil, is
// the bucket of q's key as q was sent: its cached match answers while the
// table has not changed, and a fresh match is cached there. So a warm check
// pays two atomic loads and a compare for its policy, match or none.
func (s *Service) police(q *Query, b *bucket) {
	gen := s.policies.Generation()
	if gen == 0 {
		return // no override was ever set
	}
	if b != nil {
		if pc := b.policy.Load(); pc != nil && pc.gen == gen {
			pc.apply(q)
			return
		}
	}
	o, pattern, ok := s.policies.Match(q.Workspace, q.Namespace, q.Identifier)
	pc := policyCache{gen: gen, o: o, pattern: pattern, ok: ok}
	if b != nil {
		b.policy.Store(&pc)
	}
	pc.apply(q)
}

func (pc *policyCache) apply(q *Query) {
	if pc.ok {
		q.Limit, q.Duration = pc.o.Limit, pc.o.Duration
		q.Shadow = q.Shadow || pc.o.Shadow
		q.override = pc.pattern
	}
}

// decided returns d as the Decision of q (policed), counting it by q's
// workspace and namespace (through b, q's bucket, when the caller has it)
// and handing it to Config.Decisions.
func (s *Service) decided(q *Query, b *bucket, d window.Decision) Decision {
	var st *seriesStripe
	if b != nil {
		st = s.series.of(b).stripe(b.h)
	} else {
		st = s.series.get(q.Workspace, q.Namespace).stripe(0)
	}
	c := &st.denied
	if d.Admitted {
		c = &st.admitted
	} else if q.Shadow {
		c = &st.shadow
	}
	c.Add(1)
	if s.sink != nil {
		s.hand(q, d)
	}
	return Decision{Decision: d, Limit: q.Limit, Shadow: q.Shadow, Override: q.override}
}

// hand gives the decision d of q to Config.Decisions. It stays out of
// line so that a check without a sink does not pay for preparing the copy.
//
//go:noinline
func (s *Service) hand(q *Query, d window.Decision) {
	s.sink.Decided(*q, Decision{Decision: d, Limit: q.Limit, Shadow: q.Shadow, Override: q.override})
}
