package service

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// Every way a service decides (TryCheck, Check, CheckLocal, Batch, alone
// and with an origin, cold and on the warm path) names the pattern of the
// override that decided the check, and none where the query's own limit
// applied; the name follows the table's changes.
func TestADecisionNamesTheOverrideThatApplied(t *testing.T) {
	alone := newService(t, Config{})
	r := newTestRegion(t, 1, Config{})
	for name, s := range map[string]*Service{"alone": alone, "with an origin": r.svcs[0]} {
		set := func(p string, limit int64) {
			t.Helper()
			if _, err := s.Policies().Set(policy.Key{Workspace: "ws", Namespace: "ns", Pattern: p},
				policy.Override{Limit: limit, Duration: 60_000}, s.nowMs(), "r1"); err != nil {
				t.Fatal(err)
			}
		}
		set("org:*:admin", 5)
		set("org:*", 50)
		decide := map[string]func(q Query) (Decision, error){
			"Check": func(q Query) (Decision, error) {
				var d Decision
				var err error
				r.do(func() { d, err = s.Check(context.Background(), q) })
				return d, err
			},
			"CheckLocal": s.CheckLocal,
			"TryCheck": func(q Query) (Decision, error) {
				for {
					d, ok, err := s.TryCheck(q)
					if ok || err != nil {
						return d, err
					}
					r.do(func() { _, err = s.Check(context.Background(), q) }) // warms the cells
					if err != nil {
						return d, err
					}
				}
			},
			"Batch": func(q Query) (Decision, error) {
				var ds []Decision
				var err error
				r.do(func() { _, ds, err = s.Batch(context.Background(), []Query{query("plain", 100, 0), q}) })
				if err == nil && ds[0].Override != "" {
					t.Fatalf("%s: a batch's check without an override named %q", name, ds[0].Override)
				}
				if err != nil {
					return Decision{}, err
				}
				return ds[1], nil
			},
		}
		for how, f := range decide {
			for _, c := range []struct {
				id, want string
				limit    int64
			}{
				{"org:1:admin", "org:*:admin", 5},
				{"org:1:user", "org:*", 50},
				{"someone", "", 100},
			} {
				d, err := f(query(c.id, 100, 1))
				if err != nil {
					t.Fatal(err)
				}
				if d.Override != c.want || d.Limit != c.limit {
					t.Fatalf("%s, %s(%q): override %q, limit %d; want %q, %d", name, how, c.id, d.Override, d.Limit, c.want, c.limit)
				}
			}
		}
		// The cached match follows the table.
		set("org:1:admin", 7)
		if d, err := decide["TryCheck"](query("org:1:admin", 100, 1)); err != nil || d.Override != "org:1:admin" || d.Limit != 7 {
			t.Fatalf("%s: after an exact override was set: %+v, %v", name, d, err)
		}
		if _, err := s.Policies().Delete(policy.Key{Workspace: "ws", Namespace: "ns", Pattern: "org:*:admin"}, s.nowMs(), "r1"); err != nil {
			t.Fatal(err)
		}
		if d, err := decide["TryCheck"](query("org:2:admin", 100, 1)); err != nil || d.Override != "org:*" {
			t.Fatalf("%s: after the glob was deleted: %+v, %v", name, d, err)
		}
	}
}
