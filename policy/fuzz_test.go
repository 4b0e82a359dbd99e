package policy

import (
	"errors"
	"strings"
	"testing"
)

// FuzzValidatePattern checks that any bytes either make a pattern that a
// set stores and a check then matches (every identifier made by filling its
// '*'s, and no other), or are refused with ErrInvalid and change nothing.
func FuzzValidatePattern(f *testing.F) {
	for _, s := range []string{"alice", "al*", "*", "**", "a*b", "*a*", "a**b", "", "\x00*", "user:42", "org:*:admin",
		strings.Repeat("a", 512), strings.Repeat("a", 511) + "*", strings.Repeat("a", 513), strings.Repeat("*a", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := ValidatePattern(p)
		tab := NewTable()
		_, setErr := tab.Set(Key{"w", "n", p}, Override{Limit: 7, Duration: 1000}, now0, "us")
		if (err == nil) != (setErr == nil) {
			t.Fatalf("ValidatePattern(%q) = %v but Set = %v", p, err, setErr)
		}
		valid := len(p) >= 1 && len(p) <= MaxPatternLen && !strings.Contains(p, "**")
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ValidatePattern(%q) = %v, not ErrInvalid", p, err)
			}
			if len(tab.Entries()) != 0 || tab.Digest() != 0 {
				t.Fatalf("a refused pattern %q changed the table", p)
			}
			if valid {
				t.Fatalf("ValidatePattern refused %q, which follows the rule: %v", p, err)
			}
			return
		}
		if !valid {
			t.Fatalf("ValidatePattern accepted %q", p)
		}
		for _, fill := range []string{"", "x", "*", "tail"} {
			id := strings.ReplaceAll(p, "*", fill)
			if id == "" || len(id) > MaxPatternLen {
				continue
			}
			if o, got, ok := tab.Match("w", "n", id); !ok || o.Limit != 7 || got != p {
				t.Fatalf("pattern %q stored, Match(%q) = %+v, %q, %v", p, id, o, got, ok)
			}
		}
		k := Key{"w", "n", p}
		if _, _, ok := tab.Match("w", "n", k.Prefix()+"x"); ok != naiveMatch(p, k.Prefix()+"x") {
			t.Fatalf("pattern %q: Match of %q = %v", p, k.Prefix()+"x", ok)
		}
	})
}

// FuzzMatch checks Match against brute force (reference: naiveMatch and
// the precedence rule as a tuple) on tables made from the input: patterns
// separated by newlines, then the identifier looked up.
func FuzzMatch(f *testing.F) {
	f.Add("a*\nab*\nabc\n*", "abcd")
	f.Add("x\ny*\nyy*", "yyy")
	f.Add("ab*\nabc*\nabd*\nb", "abz")
	f.Add("org:*:admin\norg:*\n*:admin\norg:42:*", "org:42:admin")
	f.Add("a*b*c\na*c\n*bc\nab*\n*b*", "abbc")
	f.Add("*a*b*\n*b*a*\na*\n*b", "ab")
	f.Add("x*y\nx*\n*y\nxy", "xy")
	f.Fuzz(func(t *testing.T, patterns, id string) {
		if id == "" || len(id) > MaxPatternLen {
			return
		}
		tab := NewTable()
		for i, p := range strings.Split(patterns, "\n") {
			if ValidatePattern(p) != nil {
				continue
			}
			if _, err := tab.Set(Key{"w", "n", p}, Override{Limit: int64(i), Duration: 1000}, now0, "us"); err != nil {
				t.Fatal(err)
			}
			// Delete every third, so path-copying deletes are fuzzed too.
			if i%3 == 2 {
				if _, err := tab.Delete(Key{"w", "n", p}, now0, "us"); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, gotOK := match(tab, "w", "n", id)
		want, wantOK := reference(tab.Entries(), "w", "n", id)
		if got != want || gotOK != wantOK {
			t.Fatalf("Match(%q) = %+v, %v; brute force %+v, %v; entries %v", id, got, gotOK, want, wantOK, tab.Entries())
		}
		for _, e := range tab.Entries() {
			if MatchPattern(e.Pattern, id) != naiveMatch(e.Pattern, id) {
				t.Fatalf("MatchPattern(%q, %q) = %v", e.Pattern, id, !naiveMatch(e.Pattern, id))
			}
		}
	})
}
