package rls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/window"
)

func mustLoad(t *testing.T, path string) *Config {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ent builds entries from "key=value" pairs ("key=" for an empty value).
func ent(kvs ...string) []Entry {
	es := make([]Entry, len(kvs))
	for i, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		es[i] = Entry{k, v}
	}
	return es
}

type want struct {
	rpu       uint32
	unit      Unit
	none      bool
	unlimited bool
	shadow    bool
	name      string
	path      string
}

func checkMatch(t *testing.T, c *Config, domain string, es []Entry, w want) {
	t.Helper()
	m := c.Match(domain, es)
	if w.none {
		if m.Limit != nil {
			t.Errorf("%s %v: matched %+v, want no limit", domain, es, *m.Limit)
		}
		return
	}
	l := m.Limit
	if l == nil {
		t.Errorf("%s %v: no limit, want %+v", domain, es, w)
		return
	}
	if l.RequestsPerUnit != w.rpu || l.Unit != w.unit || l.Unlimited != w.unlimited || l.ShadowMode != w.shadow ||
		l.Name != w.name || (w.path != "" && l.Path != w.path) {
		t.Errorf("%s %v: matched %d/%s unlimited %v shadow %v name %q path %q, want %+v", domain, es,
			l.RequestsPerUnit, l.Unit, l.Unlimited, l.ShadowMode, l.Name, l.Path, w)
	}
}

// The matching rules on upstream's own test configuration: exact value,
// then the bare key; a limit only where the descriptor ends on a node that
// has one; nothing for a longer descriptor, an empty one, or an unknown
// domain.
func TestMatchUpstreamBasicConfig(t *testing.T) {
	c := mustLoad(t, "testdata/upstream/basic_config.yaml")
	const d = "test-domain"
	cases := []struct {
		es []Entry
		w  want
	}{
		{nil, want{none: true}},
		{ent("key1=value1"), want{none: true}}, // a node without rate_limit
		{ent("key1=value2"), want{none: true}},
		{ent("key1=value1", "subkey1=something"), want{rpu: 5, unit: Second, path: "key1_value1.subkey1"}},
		{ent("key1=value1", "subkey1=subvalue1"), want{rpu: 10, unit: Second, path: "key1_value1.subkey1_subvalue1"}},
		{ent("key2=value2"), want{rpu: 30, unit: Minute}},
		{ent("key2=anything"), want{rpu: 20, unit: Minute, path: "key2"}},
		{ent("key2=value3"), want{none: true}}, // a value with no limit: allowed
		{ent("key2=value2", "subkey=x"), want{none: true}},
		{ent("key3=foo"), want{rpu: 1, unit: Hour}},
		{ent("key4=foo"), want{rpu: 1, unit: Day, name: "key4_rate_limit"}},
		{ent("key5=value5"), want{rpu: 15, unit: Day}},
		{ent("key5=value5", "subkey5=subvalue5"), want{rpu: 25, unit: Day}},
		{ent("key5=value5", "subkey5=other"), want{none: true}},
		{ent("key6=x"), want{unlimited: true}},
		{ent("key7=unspecified"), want{rpu: 70, unit: Minute}},
		{ent("nokey=x"), want{none: true}},
	}
	for _, tc := range cases {
		checkMatch(t, c, d, tc.es, tc.w)
	}
	checkMatch(t, c, "other-domain", ent("key2=value2"), want{none: true})
	if !c.Known(d) || c.Known("other-domain") {
		t.Error("Known is wrong")
	}
}

// Wildcards: trailing, middle and multiple stars; an exact value before a
// wildcard; keys compared exactly.
func TestMatchUpstreamWildcards(t *testing.T) {
	c := mustLoad(t, "testdata/upstream/wildcard.yaml")
	const d = "test-domain"
	cases := []struct {
		es []Entry
		w  want
	}{
		{ent("wild=foo1"), want{rpu: 20, unit: Minute}},
		{ent("wild=foo"), want{rpu: 20, unit: Minute}}, // '*' matches nothing too
		{ent("wild=bar"), want{none: true}},
		{ent("noWild=foo1"), want{none: true}},
		{ent("noWild=foo"), want{rpu: 20, unit: Minute}},
		{ent("noVal=foo"), want{rpu: 20, unit: Minute}},
		{ent("midWild=barab"), want{rpu: 20, unit: Minute}},
		{ent("midWild=barb"), want{rpu: 20, unit: Minute}},
		{ent("midWild=barba"), want{none: true}},
		{ent("multiWild=foo1bar2baz"), want{rpu: 10, unit: Minute}},
		{ent("multiWild=foobarbaz"), want{rpu: 10, unit: Minute}},
		{ent("multiWild=foobaz"), want{none: true}},
		{ent("multiWild=foo-baz-bar"), want{none: true}}, // in order
		{ent("nestedWild=val1", "wild=goo2"), want{rpu: 20, unit: Minute}},
		{ent("nestedWild=val1", "wild=foo2"), want{none: true}},
	}
	for _, tc := range cases {
		checkMatch(t, c, d, tc.es, tc.w)
	}
}

func TestMatchUpstreamShadowMode(t *testing.T) {
	c := mustLoad(t, "testdata/upstream/shadowmode_config.yaml")
	const d = "test-domain"
	checkMatch(t, c, d, ent("key1=value1", "subkey1=x"), want{rpu: 5, unit: Second})
	checkMatch(t, c, d, ent("key1=value1", "subkey1=subvalue1"), want{rpu: 10, unit: Second, shadow: true})
	checkMatch(t, c, d, ent("key2=x"), want{rpu: 20, unit: Minute, shadow: true})
	checkMatch(t, c, d, ent("key2=value2"), want{rpu: 30, unit: Minute})
}

// Every example configuration of upstream's README loads from one
// directory, and matches as the README says.
func TestMatchUpstreamReadmeExamples(t *testing.T) {
	c := mustLoad(t, "testdata/readme")
	if n := len(c.Domains()); n != 16 {
		t.Fatalf("loaded %d domains (%v), want 16", n, c.Domains())
	}
	cases := []struct {
		domain string
		es     []Entry
		w      want
	}{
		// Example 1
		{"mongo_cps", ent("database=users"), want{rpu: 500, unit: Second}},
		{"mongo_cps", ent("database=other"), want{none: true}},
		// Example 2: nested, and a bare key for any value
		{"messaging", ent("message_type=marketing", "to_number=2061111111"), want{rpu: 5, unit: Day}},
		{"messaging", ent("to_number=2061111111"), want{rpu: 100, unit: Day}},
		{"messaging", ent("message_type=marketing"), want{none: true}},
		// Example 3: the value before the key
		{"edge_proxy_per_ip", ent("remote_address=50.0.0.1"), want{rpu: 10, unit: Second}},
		{"edge_proxy_per_ip", ent("remote_address=50.0.0.5"), want{rpu: 0, unit: Second}},
		// Example 4: the depth must match
		{"example4", ent("key=value", "subkey=subvalue"), want{none: true}},
		{"example4_1", ent("key=value", "subkey=subvalue"), want{rpu: 300, unit: Second}},
		// Example 5
		{"internal", ent("ldap=x"), want{unlimited: true}},
		{"internal", ent("azure=x"), want{rpu: 100, unit: Minute}},
		// Example 6
		{"example6", ent("service=auth-service", "user=user-a"), want{rpu: 10, unit: Second, shadow: true}},
		{"example6", ent("service=auth-service", "user=user-b"), want{rpu: 20, unit: Second}},
		// Example 7: the limits (replaces is applied per request, in the server)
		{"example7", ent("key_1=value_1", "user=bkthomps"), want{rpu: 5, unit: Second, name: "specific_limit"}},
		{"example7", ent("key_2=value_2", "user=bkthomps"), want{rpu: 10, unit: Second}},
		// Example 8
		{"example8", ent("key1=unspecified_value"), want{rpu: 10, unit: Minute}},
		{"example8", ent("key1=value1"), want{rpu: 20, unit: Minute}},
		// Example 9: wildcards anywhere
		{"example9", ent("key1=valueXYZ"), want{rpu: 20, unit: Minute}},
		{"example9_1", ent("path=/api/123/action"), want{rpu: 20, unit: Minute}},
		{"example9_1", ent("path=/api/123/other"), want{none: true}},
		{"example9_2", ent("route=/api/v1/resource/123/action"), want{rpu: 20, unit: Minute}},
		{"example9_2", ent("route=/api/v1/resource/123"), want{none: true}},
		// Example 10
		{"example10", ent("route=api", "http_method=GET", "subject_id=123"), want{rpu: 60, unit: Minute}},
		{"example10_wildcard", ent("user=alice", "action=readfile", "resource=documents"), want{rpu: 100, unit: Minute}},
		{"example10_wildcard", ent("user=alice", "action=write", "resource=documents"), want{none: true}},
		// Example 11
		{"example11", ent("files=files/a.pdf"), want{rpu: 10, unit: Hour}},
		{"example11_metrics", ent("route=api/v1", "method=GET"), want{rpu: 60, unit: Minute}},
	}
	for _, tc := range cases {
		checkMatch(t, c, tc.domain, tc.es, tc.w)
	}
	// Example 8: detailed_metric names the request's entries.
	m := c.Match("example8", ent("key1=unspecified_value"))
	if l := labelsOf(m.Limit, "example8", ent("key1=unspecified_value")); l.descriptor != "key1_unspecified_value" {
		t.Errorf("detailed metric label %q", l.descriptor)
	}
}

// share_threshold: every value the wildcard matches shares one cell;
// without it each value has its own.
func TestShareThresholdSharesOneCell(t *testing.T) {
	c := mustLoad(t, "testdata/readme")
	name := func(domain string, es []Entry) string {
		m := c.Match(domain, es)
		if m.Limit == nil {
			t.Fatalf("%s %v: no limit", domain, es)
		}
		_, id, _ := cellName(domain, es, m.Shared, nil)
		return id
	}
	a, b := name("example11", ent("files=files/a.pdf")), name("example11", ent("files=files/b.csv"))
	if a != b {
		t.Errorf("shared wildcard: cells %q and %q differ", a, b)
	}
	a, b = name("example11", ent("files_no_share=files_no_share/a.pdf")), name("example11", ent("files_no_share=files_no_share/b.csv"))
	if a == b {
		t.Errorf("unshared wildcard: one cell %q", a)
	}
	// The literal pattern as a value is not the shared cell's name.
	if lit := name("example11", ent("files=files/*")); lit == name("example11", ent("files=files/x")) {
		t.Errorf("a value equal to the pattern names the shared cell %q", lit)
	}
	u := mustLoad(t, "testdata/upstream/share_threshold.yaml")
	m1 := u.Match("test-domain", ent("files=top/a", "files=nested/b"))
	m2 := u.Match("test-domain", ent("files=top/c", "files=nested/d"))
	if m1.Limit == nil || m1.Limit.RequestsPerUnit != 300 {
		t.Fatalf("nested shared: %+v", m1)
	}
	_, id1, _ := cellName("test-domain", ent("files=top/a", "files=nested/b"), m1.Shared, nil)
	_, id2, _ := cellName("test-domain", ent("files=top/c", "files=nested/d"), m2.Shared, nil)
	if id1 != id2 {
		t.Errorf("nested shared wildcards: %q and %q", id1, id2)
	}
	checkMatch(t, u, "test-domain", ent("file=test1"), want{rpu: 50, unit: Minute})
	checkMatch(t, u, "test-domain", ent("file=test2"), want{rpu: 100, unit: Minute})
}

// upstream's example service configuration (quota_mode, metadata,
// replaces, unlimited, shadow_mode) loads.
func TestUpstreamExampleServiceConfigLoads(t *testing.T) {
	c := mustLoad(t, "testdata/upstream/example_config.yaml")
	checkMatch(t, c, "rl", ent("foo=x", "baz=shady"), want{rpu: 3, unit: Minute, shadow: true})
	checkMatch(t, c, "rl", ent("foo=x", "bar=banned"), want{rpu: 0, unit: Minute, name: "banned_limit"})
	checkMatch(t, c, "rl", ent("foo=x", "bay=y"), want{unlimited: true})
	if m := c.Match("rl", ent("service=service_1")); m.Limit == nil || !m.Limit.QuotaMode {
		t.Errorf("quota_mode not loaded: %+v", m)
	}
}

// Invalid files, each from upstream's tests, are refused with an error that
// names the file and says what is wrong.
func TestInvalidConfigurationsAreRefused(t *testing.T) {
	cases := map[string]string{
		"bad_limit_unit.yaml":      `invalid rate limit unit "foo"`,
		"bad_yaml.yaml":            "invalid YAML",
		"duplicate_key.yaml":       "descriptor key1_value1 is defined twice",
		"empty_domain.yaml":        "no domain",
		"empty_key.yaml":           "descriptor has no key",
		"misspelled_key.yaml":      `unknown key "ratelimit"`,
		"misspelled_key2.yaml":     `unknown key "requestsperunit"`,
		"non_map_list.yaml":        "descriptor must be a mapping",
		"non_string_key.yaml":      `key "0.25" is not a string`,
		"replaces_empty.yaml":      "should not have an empty replaces entry",
		"replaces_self.yaml":       "replaces should not contain name of same descriptor",
		"unlimited_with_unit.yaml": "should not specify rate limit unit when unlimited",
	}
	for file, msg := range cases {
		_, err := Load(filepath.Join("testdata/bad", file))
		if err == nil || !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: error %v, want one naming the file and saying %q", file, err, msg)
		}
	}
}

func TestMoreInvalidConfigurations(t *testing.T) {
	cases := map[string]string{
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n":                                      "no requests_per_unit",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 3}\n":                              "no unit",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n":               "requests_per_unit must be an integer",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n":       "requests_per_unit must be an integer",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n":              "requests_per_unit must be an integer",
		"domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please\n":                                         "shadow_mode must be true or false",
		"domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n":                             "share_threshold needs a wildcard",
		"domain: d\ndescriptors:\n  - key: k\n    key: j\n":                                                          `key "key" given twice`,
		"domain: d\ndescriptors: {key: k}\n":                                                                         "descriptors must be a list",
		"domain: [d]\n":                                                                                              "domain must be a string",
		"domain: d\n---\ndomain: d\n":                                                                                `domain "d" is already defined`,
		"domain: d\ndescriptors:\n  - key: k\n  - key: k\n":                                                          "descriptor k is defined twice",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [x]}\n": "replaces entry must be a mapping",
	}
	for text, msg := range cases {
		_, err := Parse(File{Name: "f.yaml", Data: []byte(text)})
		if err == nil || !strings.Contains(err.Error(), msg) || !strings.HasPrefix(err.Error(), "f.yaml") {
			t.Errorf("%q: error %v, want one starting with the file and saying %q", text, err, msg)
		}
	}
}

// Every file of a directory is read whatever its name, and so are the
// files of its subdirectories, as upstream reads them; hidden ones are
// skipped. A file that is not a configuration refuses the whole load,
// named, and one domain may not be defined in two files.
func TestDirectoryLoading(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("b.yml", "domain: b\n")
	write("c.conf", "domain: c\n")
	write("sub/d", "domain: d\n")
	write(".hidden.yaml", "not yaml: [")
	write(".git/config", "not yaml: [")
	c := mustLoad(t, dir)
	if got := strings.Join(c.Domains(), ","); got != "a,b,c,d" {
		t.Fatalf("domains %s, want a,b,c,d", got)
	}
	write("notes.txt", "not yaml: [")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "notes.txt")) {
		t.Fatalf("a file that is not a configuration: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "notes.txt")); err != nil {
		t.Fatal(err)
	}
	write("e.yaml", "domain: a\n")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "already defined in") {
		t.Fatalf("a domain in two files: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing path loaded")
	}
}

func TestUnitLengthsAreUpstreams(t *testing.T) {
	want := map[Unit]int64{Second: 1, Minute: 60, Hour: 3600, Day: 86400, Week: 604800, Month: 2592000, Year: 31536000}
	for u, s := range want {
		if u.Millis() != s*1000 {
			t.Errorf("%s: %d ms, want %d s", u, u.Millis(), s)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, dir := range []string{"testdata/upstream", "testdata/readme", "testdata/bad"} {
		fs, _, _ := ReadFiles(dir)
		for _, file := range fs {
			f.Add(file.Data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(File{Name: "f", Data: data})
		if err == nil {
			for _, d := range c.Domains() {
				c.Match(d, ent("a=b", "c=d"))
			}
		}
	})
}

// window: calendar and calendar@<zone> load as a Calendar window of the
// rate_limit's unit in that zone (UTC without one), every unit a calendar
// has a period of, week to year included; sliding and fixed carry no zone.
func TestCalendarWindowsLoad(t *testing.T) {
	for _, c := range []struct {
		limit string
		unit  window.Unit
		zone  string
	}{
		{"{unit: minute, requests_per_unit: 1, window: calendar}", window.Minute, ""},
		{"{unit: hour, requests_per_unit: 1, window: calendar@Asia/Kolkata}", window.Hour, "Asia/Kolkata"},
		{"{unit: day, requests_per_unit: 1, window: calendar@America/New_York}", window.Day, "America/New_York"},
		{"{unit: WEEK, requests_per_unit: 1, window: calendar}", window.Week, ""},
		{"{unit: month, unit_multiplier: 1, requests_per_unit: 1, window: calendar@Europe/Berlin}", window.Month, "Europe/Berlin"},
		{"{unit: year, requests_per_unit: 1, window: calendar@UTC}", window.Year, "UTC"},
	} {
		conf, err := Parse(File{Name: "c.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + c.limit + "\n")})
		if err != nil {
			t.Fatalf("%s: %v", c.limit, err)
		}
		l := conf.Match("d", ent("k=v")).Limit
		want, err := window.Calendar(c.unit, c.zone)
		if err != nil {
			t.Fatal(err)
		}
		if l == nil || l.Window != Calendar || l.Zone != c.zone || l.calendar != want {
			t.Fatalf("%s: %+v; want a Calendar window in %q, code %d (%s)", c.limit, l, c.zone, want, window.CalendarName(want))
		}
	}
	for _, c := range []struct {
		s    string
		w    Window
		zone string
	}{
		{"sliding", Sliding, ""}, {"fixed", Fixed, ""}, {"calendar", Calendar, ""},
		{"calendar@Pacific/Kiritimati", Calendar, "Pacific/Kiritimati"},
	} {
		if w, zone, err := ParseWindow(c.s); w != c.w || zone != c.zone || err != nil {
			t.Errorf("ParseWindow(%q) = %v, %q, %v; want %v, %q", c.s, w, zone, err, c.w, c.zone)
		}
	}
	for _, bad := range []string{"", "Calendar", "calendar@", "calendar@Mars/Olympus", "day@Europe/Berlin", "sliding@UTC"} {
		if w, zone, err := ParseWindow(bad); err == nil {
			t.Errorf("ParseWindow(%q) = %v, %q; want an error", bad, w, zone)
		}
	}
}
