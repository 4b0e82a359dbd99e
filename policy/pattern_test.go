package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/window"
)

// The precedence of patterns with '*' anywhere, case by case: the exact
// pattern; else the most literal bytes; then fewer '*'; then the longer
// literal prefix; then byte order. Today's prefix cases keep their answers.
func TestMatchTakesTheMostSpecificPattern(t *testing.T) {
	tab := NewTable()
	patterns := []string{
		"org:42:admin", "org:*:admin", "org:*", "*:admin", "org:42:*", "org:4*:admin", "*", "o*g*:*n",
		"a*b", "ab*", "*b", "a*",
		"x*yz", "xy*z", // same literal bytes and '*': the longer literal prefix
		"k*a*", "k*b*", // same in all but bytes: byte order
		"m*n", "*mn*", // same literal bytes: fewer '*'
		"user_*", "user_vip*", "user_1", // today's prefix cases
		"p*q*r*s", "p*s", "pq*", // many '*', and a prefix with fewer literal bytes
	}
	for i, p := range patterns {
		mustSet(t, tab, "acme", "api", p, int64(i+1))
	}
	mustSet(t, tab, "acme", "web", "*:admin", 100)

	for _, c := range []struct {
		ns, id, want string // want "": no match
	}{
		{"api", "org:42:admin", "org:42:admin"},     // exact beats every wildcard
		{"api", "org:43:admin", "org:4*:admin"},     // 11 literal bytes against 10
		{"api", "org:7:admin", "org:*:admin"},       // 10 against org:* (4) and *:admin (6)
		{"api", "org::admin", "org:*:admin"},        // '*' matches the empty run
		{"api", "org:42:user", "org:42:*"},          // the longer prefix
		{"api", "org:7:user", "org:*"},              // the only prefix
		{"api", "team:admin", "*:admin"},            // a leading '*'
		{"api", "org:n", "org:*"},                   // 4 literal bytes each: fewer '*' (o*g*:*n has 3)
		{"api", "xyz", "xy*z"},                      // literal prefix xy over x
		{"api", "kab", "k*a*"},                      // byte order
		{"api", "kbb", "k*b*"},                      // only k*b* matches
		{"api", "mn", "m*n"},                        // fewer '*'
		{"api", "cmnd", "*mn*"},                     // only *mn* (and *) match
		{"api", "ab", "ab*"},                        // a prefix beats a*b, which has as many literal bytes
		{"api", "axb", "a*b"},                       // 2 literal bytes against a* and *b (1)
		{"api", "cb", "*b"},                         // 1 against * (0)
		{"api", "a*b", "a*b"},                       // a '*' in an identifier is a byte
		{"api", "zzz", "*"},                         // the catch-all
		{"api", "pqrs", "p*q*r*s"},                  // 4 literal bytes against pq* (2), p*s (2)
		{"api", "pxs", "p*s"},                       // 2 against * (0)
		{"api", "pqs", "pq*"},                       // p*q*r*s needs an r: pq* over p*s (longer prefix)
		{"api", "user_1", "user_1"},                 // exact
		{"api", "user_vip_9", "user_vip*"},          // the longer prefix
		{"api", "user_2", "user_*"},                 // the prefix
		{"api", "user_", "user_*"},                  // a prefix matches itself
		{"api", "user_1x", "user_*"},                // the exact pattern is not a prefix
		{"api", "user_vip*", "user_vip*"},           // a '*' in an identifier is a byte
		{"web", "org:42:admin", "*:admin"},          // each namespace its own
		{"web", "org:42:user", ""},                  // no pattern of web matches
		{"other", "org:42:admin", ""},               // unknown namespace
		{"api", strings.Repeat("a", 512), "a*"},     // the longest identifier
		{"api", "org:42:admin\x00", "org:42:*"},     // any bytes, and exact is exact
		{"api", "\xfforg:1:admin", "*:admin"},       // anchored: org:*:admin does not match
		{"api", "org:1:admin:admin", "org:*:admin"}, // the '*' spans ":admin"
	} {
		a, ok := match(tab, "acme", c.ns, c.id)
		if c.want == "" {
			if ok {
				t.Errorf("Match(%s, %q) = %+v, want none", c.ns, c.id, a)
			}
			continue
		}
		want := int64(slices.Index(patterns, c.want) + 1)
		if c.ns == "web" {
			want = 100
		}
		if !ok || a.Pattern != c.want || a.Limit != want {
			t.Errorf("Match(%s, %q) = %+v, %v; want pattern %q (limit %d)", c.ns, c.id, a, ok, c.want, want)
		}
		if ref, _ := reference(tab.Entries(), "acme", c.ns, c.id); ref.Pattern != c.want {
			t.Errorf("the reference disagrees on %q: %q", c.id, ref.Pattern)
		}
	}
}

// ComparePatterns is a total order, the same as the reference's rank; it
// keeps the rules of patterns that were valid before '*' could appear
// anywhere: the exact one first, the longer of two prefixes first.
func TestComparePatternsIsATotalOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	var ps []string
	for len(ps) < 300 {
		if p := randomPattern(r); !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	for _, a := range ps {
		if ComparePatterns(a, a) != 0 {
			t.Fatalf("ComparePatterns(%q, itself) != 0", a)
		}
		for _, b := range ps {
			c := ComparePatterns(a, b)
			if a != b && (c == 0 || c != -ComparePatterns(b, a)) {
				t.Fatalf("ComparePatterns(%q, %q) = %d, reversed %d", a, b, c, ComparePatterns(b, a))
			}
			if sign(c) != sign(slices.Compare(rank(a), rank(b))) {
				t.Fatalf("ComparePatterns(%q, %q) = %d, the reference's rank says otherwise", a, b, c)
			}
		}
	}
	sorted := slices.Clone(ps)
	slices.SortFunc(sorted, ComparePatterns)
	for i := range sorted {
		for j := i + 1; j < len(sorted); j++ {
			if ComparePatterns(sorted[i], sorted[j]) >= 0 {
				t.Fatalf("not transitive: %q sorts before %q", sorted[i], sorted[j])
			}
		}
	}
	for _, c := range []struct{ win, lose string }{
		{"alice", "al*"}, {"alice", "*"}, {"bob", "bob*"}, // exact over a prefix that matches
		{"user_vip*", "user_*"}, {"al*", "a*"}, {"a*", "*"}, // the longer prefix
		{"ab*", "a*b"}, {"ab*", "*ab"}, {"ab*", "*a*b*"}, // a prefix over others of as many literal bytes
	} {
		if ComparePatterns(c.win, c.lose) >= 0 {
			t.Errorf("ComparePatterns(%q, %q) >= 0, want %q first", c.win, c.lose, c.win)
		}
	}
}

func sign(c int) int { return min(max(c, -1), 1) }

// MatchPattern is a literal match where each '*' matches any run of bytes.
func TestMatchPatternMatchesWildcardsAnywhere(t *testing.T) {
	for _, c := range []struct {
		p, id string
		want  bool
	}{
		{"org:*:admin", "org:42:admin", true},
		{"org:*:admin", "org::admin", true},
		{"org:*:admin", "org:42:admins", false},
		{"org:*:admin", "xorg:42:admin", false},
		{"org:*:admin", "org:admin", false}, // the literal runs may not overlap
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"*a*b*c*", "cbabc", true},
		{"*a*b*c*", "cba", false},
		{"*", "", true},
		{"abc", "abc", true},
		{"abc", "abcd", false},
		{"a*", "a", true},
		{"*x*x*", "xx", true},
		{"*x*x*", "x", false},
	} {
		if got := MatchPattern(c.p, c.id); got != c.want || got != naiveMatch(c.p, c.id) {
			t.Errorf("MatchPattern(%q, %q) = %v, want %v", c.p, c.id, got, c.want)
		}
	}
}

// What ValidatePattern accepts and refuses, with the words of its errors.
func TestValidatePatternAllowsWildcardsAnywhere(t *testing.T) {
	for _, p := range []string{"*", "a*", "*a", "a*b", "org:*:admin", "*a*b*", "\x00*\xff", strings.Repeat("*a", 256), strings.Repeat("a", 512)} {
		if err := ValidatePattern(p); err != nil {
			t.Errorf("ValidatePattern(%q) = %v", p, err)
		}
	}
	for _, c := range []struct{ p, want string }{
		{"", "invalid policy: pattern is empty; give an identifier, or a pattern where * matches any bytes"},
		{"**", `invalid policy: pattern "**" has two adjacent *; one * already matches any run of bytes`},
		{"a**", `invalid policy: pattern "a**" has two adjacent *; one * already matches any run of bytes`},
		{"org:**:admin", `pattern "org:**:admin" has two adjacent *`},
		{strings.Repeat("a", 513), "invalid policy: pattern of 513 bytes is longer than 512"},
		{strings.Repeat("*a", 256) + "*", "pattern of 513 bytes"},
	} {
		err := ValidatePattern(c.p)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ValidatePattern(%q) = %v, want ErrInvalid with %q", c.p, err, c.want)
		}
	}
}

// Globs come and go apart from the exact and prefix patterns beside them,
// and a namespace whose last glob goes is matched as before globs existed.
func TestGlobsChangeApartFromPrefixes(t *testing.T) {
	tab := NewTable()
	mustSet(t, tab, "acme", "api", "org:*", 1)
	mustSet(t, tab, "acme", "api", "org:*:admin", 2)
	mustSet(t, tab, "acme", "api", "org:*:owner", 3)
	mustSet(t, tab, "acme", "api", "org:1:admin", 4)
	match := func(id string) string {
		_, p, _ := tab.Match("acme", "api", id)
		return p
	}
	if got := match("org:2:admin"); got != "org:*:admin" {
		t.Fatalf("org:2:admin matched %q", got)
	}
	del := func(p string) {
		t.Helper()
		if _, err := tab.Delete(Key{"acme", "api", p}, now0, "us"); err != nil {
			t.Fatal(err)
		}
	}
	del("org:*:admin")
	if got := match("org:2:admin"); got != "org:*" {
		t.Fatalf("glob deleted: org:2:admin matched %q, want the prefix", got)
	}
	if got := match("org:2:owner"); got != "org:*:owner" {
		t.Fatalf("the other glob of the same literal prefix went: %q", got)
	}
	if got := match("org:1:admin"); got != "org:1:admin" {
		t.Fatalf("exact: %q", got)
	}
	del("org:*")
	if got := match("org:2:owner"); got != "org:*:owner" {
		t.Fatalf("prefix deleted: the glob went with it: %q", got)
	}
	if got := match("org:2:user"); got != "" {
		t.Fatalf("prefix deleted: org:2:user matched %q", got)
	}
	ns := func() *nsView { return (*tab.view.Load().ws["acme"].nss.Load())["api"] }
	if !ns().globs {
		t.Fatal("a namespace with a glob is not marked as having one")
	}
	del("org:*:owner")
	if ns().globs || ns().tree != nil {
		t.Fatalf("after the last glob: globs %v, tree %v; want neither", ns().globs, ns().tree)
	}
	mustSet(t, tab, "acme", "api", "org:*", 5)
	if ns().globs || match("org:2:owner") != "org:*" {
		t.Fatal("a prefix set after the globs went is not matched as before")
	}
}

// Match allocates nothing, whichever kind of pattern answers.
func TestMatchAllocatesNothing(t *testing.T) {
	tab := NewTable()
	for i := range 100 {
		mustSet(t, tab, "acme", "api", fmt.Sprintf("user_%d", i), 1)
		mustSet(t, tab, "acme", "api", fmt.Sprintf("org_%d:*", i), 2)
		mustSet(t, tab, "acme", "api", fmt.Sprintf("org_%d:*:admin", i), 3)
		mustSet(t, tab, "acme", "web", fmt.Sprintf("org_%d:*", i), 4)
	}
	mustSet(t, tab, "acme", "api", "*:owner", 5)
	for _, c := range []struct{ ns, id string }{
		{"api", "user_7"}, {"api", "org_7:x"}, {"api", "org_7:x:admin"}, {"api", "t:owner"},
		{"api", "nobody"}, {"web", "org_7:x"}, {"web", "nobody"}, {"none", "x"},
	} {
		if n := testing.AllocsPerRun(100, func() { tab.Match("acme", c.ns, c.id) }); n != 0 {
			t.Errorf("Match(%s, %q) allocates %v times", c.ns, c.id, n)
		}
	}
}

// Match answers each kind of pattern's override exactly as set, shadow mode
// included, with the pattern as set.
func TestMatchAnswersTheOverrideAsSet(t *testing.T) {
	tab := NewTable()
	for i, p := range []string{"alice", "al*", "a*e:x"} {
		for _, shadow := range []bool{false, true} {
			want := Override{Limit: int64(i), Duration: window.MaxDuration - int64(i), Shadow: shadow}
			if _, err := tab.Set(Key{"acme", "api", p}, want, now0, "us"); err != nil {
				t.Fatal(err)
			}
			id := strings.ReplaceAll(p, "*", "lic")
			if o, got, ok := tab.Match("acme", "api", id); !ok || o != want || got != p {
				t.Fatalf("Match(%q) = %+v, %q, %v; want %+v, %q", id, o, got, ok, want, p)
			}
		}
	}
}
