package rls

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// Descriptors that differ in any byte of domain, key or value, or in where
// the entries split, name different cells; every name is a valid query.
func TestCellNamesAreCollisionFree(t *testing.T) {
	type in struct {
		domain string
		es     []Entry
		shared []string
	}
	ins := []in{
		{"d", ent("a=b"), nil},
		{"d", ent("a=b", "c=d"), nil},
		{"d", ent("a=b|c=d"), nil},
		{"d", ent("a", "b=c"), nil},
		{"d", ent("a=b=c"), nil},
		{"d", []Entry{{"a=b", "c"}}, nil},
		{"d", ent("a=%62"), nil},
		{"d", ent("a=b*"), nil},
		{"d", ent("a=bc"), []string{"b*"}},
		{"d", ent("a~b*"), nil},
		{"d", ent("@a=b"), nil},
		{"d", ent("#a=b"), nil},
		{"d", ent("a="), nil},
		{"d", []Entry{{"", ""}}, nil},
		{"e", ent("a=b"), nil},
		{"d e", ent("a=b"), nil},
		{"d|a=b", ent("c=d"), nil},
		{"d e|a=b", ent("c=d"), nil},
		{"d e", ent("a=b|c=d"), nil},
		{"ünïcode", ent("a=b"), nil},
		{strings.Repeat("x", 65), ent("a=b"), nil},
		{"d", ent("a=" + strings.Repeat("v", 600)), nil},
		{"d", ent("a=" + strings.Repeat("v", 601)), nil},
		{"d", ent("a=\x00\xff\n"), nil},
	}
	seen := map[[2]string]int{}
	for i, c := range ins {
		ns, id, _ := cellName(c.domain, c.es, c.shared, nil)
		if j, dup := seen[[2]string{ns, id}]; dup {
			t.Errorf("%+v and %+v share the cell %s/%s", ins[j], c, ns, id)
		}
		seen[[2]string{ns, id}] = i
		q := service.Query{Workspace: "envoy", Namespace: ns, Identifier: id, Limit: 1, Duration: 1000, Cost: 1}
		if err := q.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
		if !window.ValidToken(ns) {
			t.Errorf("%+v: namespace %q is not a token", c, ns)
		}
	}
	// Readable where it can be.
	if ns, id, _ := cellName("api", ent("user=alice", "path=/v1/items"), nil, nil); ns != "api" || id != "user=alice|path=/v1/items" {
		t.Errorf("plain descriptor named %s/%s", ns, id)
	}
	if _, id, _ := cellName("my domain", ent("k=v"), nil, nil); id != "@my domain|k=v" {
		t.Errorf("non-token domain named %q", id)
	}
}

func FuzzCellNameIsInjective(f *testing.F) {
	f.Add("d", "a", "b", "d", "a|", "b")
	f.Fuzz(func(t *testing.T, d1, k1, v1, d2, k2, v2 string) {
		ns1, id1, _ := cellName(d1, []Entry{{k1, v1}}, nil, nil)
		ns2, id2, _ := cellName(d2, []Entry{{k2, v2}}, nil, nil)
		same := d1 == d2 && k1 == k2 && v1 == v2
		if (ns1 == ns2 && id1 == id2) != same {
			t.Errorf("(%q,%q,%q)->%s/%s and (%q,%q,%q)->%s/%s", d1, k1, v1, ns1, id1, d2, k2, v2, ns2, id2)
		}
	})
}
