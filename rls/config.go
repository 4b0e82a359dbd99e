// Package rls serves Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from a
// limiter's cell table: limits come from configuration in
// envoyproxy/ratelimit's YAML format, matched by its rules, and each matched
// limit is a check of package service, decided all or nothing per request.
package rls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/window"
)

// Unit is a rate limit unit as envoyproxy/ratelimit defines its length.
type Unit int32

// The units, numbered as Envoy's RateLimitResponse.RateLimit.Unit.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = map[string]Unit{"SECOND": Second, "MINUTE": Minute, "HOUR": Hour, "DAY": Day, "WEEK": Week, "MONTH": Month, "YEAR": Year}

// unitInfo is a unit's length in milliseconds as envoyproxy/ratelimit
// reckons it, and its calendar period (0: none).
type unitInfo struct {
	ms  int64
	cal window.Unit
}

const msPerDay = 24 * 3600 * 1000

var units = [...]unitInfo{
	Second: {1000, 0},
	Minute: {60 * 1000, window.Minute},
	Hour:   {3600 * 1000, window.Hour},
	Day:    {msPerDay, window.Day},
	Week:   {7 * msPerDay, window.Week},
	Month:  {30 * msPerDay, window.Month},
	Year:   {365 * msPerDay, window.Year},
}

// info returns u's unitInfo, zero for an unknown unit.
func (u Unit) info() unitInfo {
	if u < 0 || int(u) >= len(units) {
		return unitInfo{}
	}
	return units[u]
}

// Millis returns the unit's length in milliseconds as envoyproxy/ratelimit
// reckons it (a month is 30 days, a year 365), or 0 for an unknown unit.
func (u Unit) Millis() int64 { return u.info().ms }

// String returns the unit's name as the YAML spells it, upper case.
func (u Unit) String() string {
	for n, v := range unitNames {
		if v == u {
			return n
		}
	}
	return fmt.Sprintf("UNIT(%d)", int32(u))
}

// Limit is one configured rate_limit and the descriptor options that
// govern it. A Limit is never modified after loading.
type Limit struct {
	// Domain is the domain it belongs to.
	Domain string
	// Path is the descriptor path that holds it, as envoyproxy/ratelimit's
	// statistics name it: "key_value.key2" (a value only where configured).
	Path string
	// Name is rate_limit's name, which replaces entries refer to.
	Name string
	// RequestsPerUnit is the limit per window of UnitMultiplier Units.
	RequestsPerUnit uint32
	// Unit is the window's unit; UnitUnknown when Unlimited.
	Unit Unit
	// UnitMultiplier is how many Units the window lasts (YAML
	// unit_multiplier), 1 when the YAML gives none; at most 366 days.
	UnitMultiplier uint32
	// Window is the kind of window the limit counts in (YAML window, as
	// ParseWindow reads it); WindowDefault when the YAML gives none.
	Window Window
	// Zone is the IANA time zone of a Calendar window, as the YAML names
	// it after "calendar@"; "" is UTC, and so is every other kind.
	Zone string
	// calendar is the Duration of a Calendar window's checks: the code
	// (window.Calendar) of Unit in Zone; 0 for every other kind.
	calendar int64
	// Charge is how the limit charges hits (YAML charge: all, drain or
	// debit); nil when the YAML gives none: ServerConfig.Charge.
	Charge *window.Charge
	// Unlimited limits nothing: the status is OK with the most remaining.
	Unlimited bool
	// Replaces names the limits this one drops from a request it matches in.
	Replaces []string
	// ShadowMode answers OK even when over the limit, and counts it apart.
	ShadowMode bool
	// QuotaMode makes a request over the limit only if all its quota-mode
	// limits are.
	QuotaMode bool
	// DetailedMetric names the request's own entries in the metrics.
	DetailedMetric bool
}

// Window is the kind of window a limit counts in.
type Window uint8

// The kinds of window.
const (
	// WindowDefault is the server's kind (ServerConfig.Windows).
	WindowDefault Window = iota
	// Sliding weighs the window before by how much of it still overlaps the
	// last Duration, as every other check of Sluice does.
	Sliding
	// Fixed counts each window alone, aligned to the Unix epoch (a minute
	// from :00 to :59), as envoyproxy/ratelimit does: the whole limit comes
	// back when the window ends, and duration_until_reset is its end.
	Fixed
	// Calendar counts each period of the limit's unit (minute to year, ISO
	// weeks) in a time zone's calendar (window.Calendar): a daily limit
	// renews at the zone's midnight, a monthly one on the first. As Fixed,
	// the whole limit comes back at the period's end; a limit of seconds or
	// of several units is refused at load.
	Calendar
)

// windowRule is how a kind of window is written, as errors say.
const windowRule = "want sliding, fixed, calendar or calendar@<IANA zone> (calendar@Europe/Berlin)"

// ParseWindow returns the kind of window s names: "sliding", "fixed",
// "calendar" (UTC's) or "calendar@<zone>", the calendar of the IANA time
// zone it returns in zone ("" for every other). An unknown zone is an error.
func ParseWindow(s string) (w Window, zone string, err error) {
	if i := slices.Index(windowNames[:], s); i > 0 {
		return Window(i), "", nil
	}
	kind, zone, at := strings.Cut(s, "@")
	if !at || kind != "calendar" {
		return WindowDefault, "", fmt.Errorf("window %q: %s", s, windowRule)
	}
	if zone == "" {
		return WindowDefault, "", fmt.Errorf("window %q names no time zone after @: %s", s, windowRule)
	}
	if _, err := window.Calendar(window.Day, zone); err != nil {
		return WindowDefault, "", fmt.Errorf("window %q: %w", s, err)
	}
	return Calendar, zone, nil
}

// String returns the kind's name as the YAML spells it ("" for the
// default), without a Calendar window's zone.
func (w Window) String() string {
	if int(w) < len(windowNames) {
		return windowNames[w]
	}
	return ""
}

var windowNames = [...]string{Sliding: "sliding", Fixed: "fixed", Calendar: "calendar"}

// calendarCode returns the duration code of u's calendar period in zone,
// or an error saying why there is none: a calendar has no second, and no
// period of an unknown unit.
func calendarCode(u Unit, zone string) (int64, error) {
	cu := u.info().cal
	if cu == 0 {
		return 0, fmt.Errorf("a calendar has no period of a %s (no calendar second): use window: fixed, or a unit of minute, hour, day, week, month or year", strings.ToLower(u.String()))
	}
	return window.Calendar(cu, zone)
}

// Millis returns the length of l's window in milliseconds (0 when
// Unlimited).
func (l *Limit) Millis() int64 { return l.Unit.Millis() * int64(max(l.UnitMultiplier, 1)) }

// Config is a loaded configuration: domains and their descriptor trees. It
// is immutable and safe for simultaneous use.
type Config struct {
	domains map[string]level
	// Files are the files it was loaded from, in load order.
	Files []string
}

// level is one list of descriptors: the children of a node, by key.
type level map[string]*keyNodes

// keyNodes are the descriptors of one key at one level.
type keyNodes struct {
	exact map[string]*node // by value
	wild  []*node          // values containing '*', in file order
	bare  *node            // no value
}

// node is one configured descriptor.
type node struct {
	value    string
	parts    []string // value split on '*', for wildcards
	shared   bool     // share_threshold: every matching value shares one count
	limit    *Limit
	children level
}

// Domains returns the configured domains, sorted; none for a nil Config
// (a server before its first configuration).
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(c.domains))
}

// Entry is one key and value of a request's descriptor.
type Entry struct{ Key, Value string }

// Match is the outcome of matching one descriptor.
type Match struct {
	// Limit is the configured limit the descriptor ends on; nil when none
	// applies (unknown domain, no match, or a node without rate_limit).
	Limit *Limit
	// Shared marks the entries matched by a share_threshold wildcard, which
	// count under its pattern, not their own value. Nil when none.
	Shared []string
}

// Known reports whether domain is configured.
func (c *Config) Known(domain string) bool {
	return c != nil && c.domains[domain] != nil
}

// Match finds the limit of a descriptor of domain by envoyproxy/ratelimit's
// rules: at each level, the entry's key with its exact value, else the
// first wildcard value (in file order) that matches it, else the key with
// no value. A limit applies only where the last entry ends on a node with
// a rate_limit; a descriptor longer than the configured path, or empty,
// has none.
func (c *Config) Match(domain string, entries []Entry) Match {
	if c == nil {
		return Match{}
	}
	lvl := c.domains[domain]
	var n *node
	var shared []string
	for i, e := range entries {
		kn := lvl[e.Key] // nil past the configured path
		if kn == nil {
			return Match{}
		}
		n = kn.exact[e.Value]
		if n == nil {
			for _, w := range kn.wild {
				if wildcardMatch(w.parts, e.Value) {
					n = w
					break
				}
			}
			if n != nil && n.shared {
				if shared == nil {
					shared = make([]string, len(entries))
				}
				shared[i] = n.value
			}
		}
		if n == nil {
			n = kn.bare
		}
		if n == nil {
			return Match{}
		}
		lvl = n.children
	}
	if n == nil || n.limit == nil {
		return Match{}
	}
	return Match{Limit: n.limit, Shared: shared}
}

// wildcardMatch reports whether value matches the pattern split on '*'
// into parts: each '*' stands for any run of bytes, empty included.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if !strings.HasPrefix(value, first) {
		return false
	}
	value = value[len(first):]
	if !strings.HasSuffix(value, last) {
		return false
	}
	value = value[:len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(value, p)
		if i < 0 {
			return false
		}
		value = value[i+len(p):]
	}
	return true
}

// File is one configuration file's name (as errors name it) and content.
type File struct {
	Name string
	Data []byte
}

// ReadFiles reads the configuration at path: the file itself, or every
// file under the directory, whatever its name, sorted by path, as
// envoyproxy/ratelimit reads its runtime directory. Links to files are read
// through. Skipped, and returned in skipped: names starting with a dot (as
// RUNTIME_IGNOREDOTFILES: a Kubernetes ConfigMap mount holds its files
// twice), links to directories, and what is neither file nor directory.
// Names starting with ".." (a ConfigMap mount's own entries, whose files
// its visible links reach) are skipped silently.
func ReadFiles(path string) (files []File, skipped []string, err error) {
	st, err := os.Stat(path)
	switch {
	case err != nil:
	case st.IsDir():
		err = readDir(path, &files, &skipped)
	default:
		var b []byte
		b, err = os.ReadFile(path)
		files = []File{{Name: path, Data: b}}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("rls config: %w", err)
	}
	return files, skipped, nil
}

// readDir adds the files of dir and its subdirectories to files, and what
// it skips to skipped, as ReadFiles says.
func readDir(dir string, files *[]File, skipped *[]string) error {
	des, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return err
	}
	for _, de := range des {
		name := de.Name()
		p := filepath.Join(dir, name)
		switch {
		case strings.HasPrefix(name, ".."):
			continue
		case strings.HasPrefix(name, "."):
			*skipped = append(*skipped, p)
			continue
		case de.IsDir():
			if err := readDir(p, files, skipped); err != nil {
				return err
			}
			continue
		}
		mode := de.Type()
		if mode&fs.ModeSymlink != 0 {
			st, err := os.Stat(p) // a dangling link is an error, as an unreadable file
			if err != nil {
				return err
			}
			mode = st.Mode()
		}
		if !mode.IsRegular() {
			*skipped = append(*skipped, p)
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		*files = append(*files, File{Name: p, Data: b})
	}
	return nil
}

// Parse builds a Config from files in envoyproxy/ratelimit's YAML format.
// Each file holds one or more YAML documents, each one domain. A domain may
// be defined once in all files. Every error names the file and line and
// says what is wrong; on error no Config is returned.
func Parse(files ...File) (*Config, error) {
	c, where := &Config{domains: map[string]level{}}, map[string]string{}
	for _, f := range files {
		c.Files = append(c.Files, f.Name)
		dec := yaml.NewDecoder(bytes.NewReader(f.Data))
		for {
			var root yaml.Node
			err := dec.Decode(&root)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: invalid YAML: %w", f.Name, err)
			}
			if err := c.add(&parser{file: f.Name}, &root, where); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// add parses the document root with p and adds its domain (none for an
// empty document), refusing one that where says is defined already.
func (c *Config) add(p *parser, root *yaml.Node, where map[string]string) error {
	domain, lvl, err := p.document(root)
	if err != nil || lvl == nil {
		return err
	}
	at := p.at(root)
	if prev, dup := where[domain]; dup {
		return fmt.Errorf("%s: domain %q is already defined in %s", at, domain, prev)
	}
	where[domain] = at
	c.domains[domain] = lvl
	return nil
}

type parser struct {
	file   string
	domain string
}

func (p *parser) at(n *yaml.Node) string {
	if n.Line == 0 {
		return p.file
	}
	return fmt.Sprintf("%s:%d", p.file, n.Line)
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("%s: %s", p.at(n), fmt.Sprintf(format, args...))
}

// fields returns a mapping's values by key, refusing keys outside allowed,
// duplicate keys and keys that are not strings.
func (p *parser) fields(n *yaml.Node, what string, allowed ...string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, p.errorf(n, "%s must be a mapping, got %s", what, kindName(n))
	}
	m := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || (k.Tag != "!!str" && k.Tag != "") {
			return nil, p.errorf(k, "%s: key %q is not a string", what, k.Value)
		}
		if !slices.Contains(allowed, k.Value) {
			return nil, p.errorf(k, "%s: unknown key %q (known: %s)", what, k.Value, strings.Join(allowed, ", "))
		}
		if _, dup := m[k.Value]; dup {
			return nil, p.errorf(k, "%s: key %q given twice", what, k.Value)
		}
		m[k.Value] = v
	}
	return m, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "something else"
}

func (p *parser) str(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", p.errorf(n, "%s must be a string, got %s", what, kindName(n))
	}
	return n.Value, nil
}

// strField returns the string at key k of f, "" when there is none.
func (p *parser) strField(f map[string]*yaml.Node, k string) (string, error) {
	if n := f[k]; n != nil {
		return p.str(n, k)
	}
	return "", nil
}

// boolField returns the boolean at key k of f, false when there is none.
func (p *parser) boolField(f map[string]*yaml.Node, k string) (bool, error) {
	var b bool
	if n := f[k]; n != nil && (n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil) {
		return false, p.errorf(n, "%s must be true or false, got %s", k, kindName(n))
	}
	return b, nil
}

// option calls set with the string at key k of f, when there is one; set's
// error is refused at that key's line as the descriptor's at path.
func (p *parser) option(f map[string]*yaml.Node, k, path string, set func(string) error) error {
	n := f[k]
	if n == nil {
		return nil
	}
	s, err := p.str(n, k)
	if err != nil {
		return err
	}
	if err := set(s); err != nil {
		return p.errorf(n, "descriptor %s: %v", path, err)
	}
	return nil
}

// count returns the integer at key k of f, lo when there is none; one
// outside lo to MaxUint32 is refused as the descriptor's at path.
func (p *parser) count(f map[string]*yaml.Node, k, path string, lo uint64) (uint32, error) {
	x := lo
	if n := f[k]; n != nil && (n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&x) != nil || x < lo || x > math.MaxUint32) {
		return 0, p.errorf(n, "descriptor %s: %s must be an integer from %d to %d, got %s", path, k, lo, uint32(math.MaxUint32), kindName(n))
	}
	return uint32(x), nil
}

func (p *parser) document(root *yaml.Node) (string, level, error) {
	n := root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return "", nil, nil
		}
		n = n.Content[0]
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return "", nil, nil
	}
	f, err := p.fields(n, "the file", "domain", "descriptors")
	if err != nil {
		return "", nil, err
	}
	dn := f["domain"]
	if dn == nil {
		return "", nil, p.errorf(n, "the file has no domain")
	}
	if p.domain, err = p.str(dn, "domain"); err != nil {
		return "", nil, err
	}
	if p.domain == "" {
		return "", nil, p.errorf(dn, "domain is empty")
	}
	lvl := level{}
	if err := p.descriptors(f["descriptors"], "", lvl); err != nil {
		return "", nil, err
	}
	return p.domain, lvl, nil
}

var descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
	"detailed_metric", "value_to_metric", "share_threshold", "metadata"}

func (p *parser) descriptors(n *yaml.Node, parent string, lvl level) error {
	if n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return p.errorf(n, "descriptors must be a list, got %s", kindName(n))
	}
	for _, dn := range n.Content {
		if err := p.descriptor(dn, parent, lvl); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(n *yaml.Node, parent string, lvl level) error {
	f, err := p.fields(n, "descriptor", descriptorKeys...)
	if err != nil {
		return err
	}
	key, err := p.strField(f, "key")
	if err != nil {
		return err
	}
	if key == "" {
		return p.errorf(n, "descriptor has no key")
	}
	value, err := p.strField(f, "value")
	if err != nil {
		return err
	}
	path := key
	if value != "" {
		path += "_" + value
	}
	if parent != "" {
		path = parent + "." + path
	}
	flags := map[string]bool{}
	for _, k := range []string{"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"} {
		if flags[k], err = p.boolField(f, k); err != nil {
			return err
		}
	}
	nd := &node{value: value}
	if strings.Contains(value, "*") {
		nd.parts = strings.Split(value, "*")
	}
	if flags["share_threshold"] {
		if nd.parts == nil {
			return p.errorf(n, "descriptor %s: share_threshold needs a wildcard value (containing '*')", path)
		}
		nd.shared = true
	}
	if rn := f["rate_limit"]; rn != nil {
		if nd.limit, err = p.rateLimit(rn, path); err != nil {
			return err
		}
		nd.limit.ShadowMode = flags["shadow_mode"]
		nd.limit.QuotaMode = flags["quota_mode"]
		nd.limit.DetailedMetric = flags["detailed_metric"]
	}
	kn := lvl[key]
	if kn == nil {
		kn = &keyNodes{exact: map[string]*node{}}
		lvl[key] = kn
	}
	switch {
	case value == "" && kn.bare == nil:
		kn.bare = nd
	case value == "" || kn.exact[value] != nil:
		return p.errorf(n, "descriptor %s is defined twice at this level", path)
	default:
		kn.exact[value] = nd // a wildcard value also matches itself exactly, as upstream
		if nd.parts != nil {
			kn.wild = append(kn.wild, nd)
		}
	}
	if cn := f["descriptors"]; cn != nil {
		nd.children = level{}
		if err := p.descriptors(cn, path, nd.children); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) rateLimit(n *yaml.Node, path string) (*Limit, error) {
	f, err := p.fields(n, "rate_limit", "unit", "requests_per_unit", "unlimited", "name", "replaces", "unit_multiplier", "window", "charge")
	if err != nil {
		return nil, err
	}
	l := &Limit{Domain: p.domain, Path: path}
	if l.Unlimited, err = p.boolField(f, "unlimited"); err != nil {
		return nil, err
	}
	if l.Name, err = p.strField(f, "name"); err != nil {
		return nil, err
	}
	if err := p.option(f, "unit", path, func(s string) error {
		if l.Unit = unitNames[strings.ToUpper(s)]; l.Unit == UnitUnknown {
			return fmt.Errorf("invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", s)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if l.RequestsPerUnit, err = p.count(f, "requests_per_unit", path, 0); err != nil {
		return nil, err
	}
	if l.UnitMultiplier, err = p.count(f, "unit_multiplier", path, 1); err != nil {
		return nil, err
	}
	if err := p.option(f, "window", path, func(s string) (err error) {
		l.Window, l.Zone, err = ParseWindow(s)
		return err
	}); err != nil {
		return nil, err
	}
	if err := p.option(f, "charge", path, func(s string) error {
		c, err := window.ParseCharge(s)
		l.Charge = &c
		return err
	}); err != nil {
		return nil, err
	}
	switch {
	case l.Unlimited && (f["unit_multiplier"] != nil || f["window"] != nil || f["charge"] != nil):
		return nil, p.errorf(n, "descriptor %s: should not specify unit_multiplier, window or charge when unlimited", path)
	case !l.Unlimited && l.Unit != UnitUnknown && l.Millis() > window.MaxDuration:
		return nil, p.errorf(n, "descriptor %s: a window of %d × %s is over 366 days", path, l.UnitMultiplier, l.Unit)
	case l.Unlimited && l.Unit != UnitUnknown:
		return nil, p.errorf(n, "descriptor %s: should not specify rate limit unit when unlimited", path)
	case !l.Unlimited && l.Unit == UnitUnknown:
		return nil, p.errorf(n, "descriptor %s: rate_limit has no unit (second, minute, hour, day, week, month or year)", path)
	case !l.Unlimited && f["requests_per_unit"] == nil:
		return nil, p.errorf(n, "descriptor %s: rate_limit has no requests_per_unit", path)
	case l.Window == Calendar && l.UnitMultiplier > 1:
		return nil, p.errorf(f["unit_multiplier"], "descriptor %s: window %s counts one %s of the calendar: unit_multiplier %d needs window: fixed or sliding",
			path, f["window"].Value, strings.ToLower(l.Unit.String()), l.UnitMultiplier)
	}
	if l.Window == Calendar {
		if l.calendar, err = calendarCode(l.Unit, l.Zone); err != nil {
			return nil, p.errorf(f["window"], "descriptor %s: window %s: %v", path, f["window"].Value, err)
		}
	}
	if v := f["replaces"]; v != nil {
		if v.Kind != yaml.SequenceNode {
			return nil, p.errorf(v, "descriptor %s: replaces must be a list of {name: ...}, got %s", path, kindName(v))
		}
		for _, r := range v.Content {
			rf, err := p.fields(r, "replaces entry", "name")
			if err != nil {
				return nil, err
			}
			var name string
			if rn := rf["name"]; rn != nil && rn.Tag != "!!null" {
				if name, err = p.str(rn, "name"); err != nil {
					return nil, err
				}
			}
			if name == "" {
				return nil, p.errorf(r, "descriptor %s: should not have an empty replaces entry", path)
			}
			if name == l.Name {
				return nil, p.errorf(r, "descriptor %s: replaces should not contain name of same descriptor (%q)", path, name)
			}
			l.Replaces = append(l.Replaces, name)
		}
	}
	return l, nil
}
