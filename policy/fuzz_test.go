package policy

import (
	"errors"
	"strings"
	"testing"
)

// FuzzValidatePattern checks that any bytes either make a pattern that a
// set stores and a check then matches (exactly, or as a prefix of longer
// identifiers), or are refused with ErrInvalid and change nothing.
func FuzzValidatePattern(f *testing.F) {
	for _, s := range []string{"alice", "al*", "*", "**", "a*b", "", "\x00*", "user:42", strings.Repeat("a", 512), strings.Repeat("a", 511) + "*", strings.Repeat("a", 513)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := ValidatePattern(p)
		tab := NewTable()
		_, setErr := tab.Set(Key{"w", "n", p}, Override{Limit: 7, Duration: 1000}, now0, "us")
		if (err == nil) != (setErr == nil) {
			t.Fatalf("ValidatePattern(%q) = %v but Set = %v", p, err, setErr)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ValidatePattern(%q) = %v, not ErrInvalid", p, err)
			}
			if len(tab.Entries()) != 0 || tab.Digest() != 0 {
				t.Fatalf("a refused pattern %q changed the table", p)
			}
			valid := len(p) >= 1 && len(p) <= MaxPatternLen && strings.IndexByte(p, '*') >= len(p)-1
			if valid {
				t.Fatalf("ValidatePattern refused %q, which follows the rule: %v", p, err)
			}
			return
		}
		if len(p) == 0 || len(p) > MaxPatternLen || strings.Count(p, "*") > 1 || strings.Contains(p, "*") && !strings.HasSuffix(p, "*") {
			t.Fatalf("ValidatePattern accepted %q", p)
		}
		k := Key{"w", "n", p}
		id := k.Prefix()
		if k.IsPrefix() {
			id += "tail"
		}
		if o, ok := tab.Match("w", "n", id); !ok || o.Limit != 7 {
			t.Fatalf("pattern %q stored, Match(%q) = %+v, %v", p, id, o, ok)
		}
		if _, ok := tab.Match("w", "n", id+"x"); ok != k.IsPrefix() {
			t.Fatalf("pattern %q: Match of a longer identifier = %v", p, ok)
		}
	})
}

// FuzzMatch checks Match against brute force on tables made from the
// input: patterns separated by newlines, then the identifier looked up.
func FuzzMatch(f *testing.F) {
	f.Add("a*\nab*\nabc\n*", "abcd")
	f.Add("x\ny*\nyy*", "yyy")
	f.Add("ab*\nabc*\nabd*\nb", "abz")
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
		got, gotOK := tab.Match("w", "n", id)
		want, wantOK := reference(tab.Entries(), "w", "n", id)
		if got != want || gotOK != wantOK {
			t.Fatalf("Match(%q) = %+v, %v; brute force %+v, %v; entries %v", id, got, gotOK, want, wantOK, tab.Entries())
		}
	})
}
