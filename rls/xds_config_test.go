package rls

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// A RateLimitConfig is the configuration its YAML would be: the same
// limits matched by the same rules.
func TestXDSResourceIsTheSameConfigurationAsItsYAML(t *testing.T) {
	const yml = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: api_key
    descriptors:
      - key: path
        value: "/search/*"
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 1000, name: search}
      - key: path
        value: /free
        rate_limit: {unlimited: true}
  - key: plan
    value: gold
    shadow_mode: true
    rate_limit: {unit: month, requests_per_unit: 5, replaces: [{name: search}]}
  - key: quota
    quota_mode: true
    rate_limit: {unit: week, requests_per_unit: 3}
  - key: year
    rate_limit: {unit: year, requests_per_unit: 2}
`
	pb := &rlconfv3.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 10}},
		{Key: "remote_address", Value: "50.0.0.5", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_SECOND}},
		{Key: "api_key", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "path", Value: "/search/*", DetailedMetric: true,
				RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1000, Name: "search"}},
			{Key: "path", Value: "/free", RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true}},
		}},
		{Key: "plan", Value: "gold", ShadowMode: true, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"team": structpb.NewStringValue("x")}},
			RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_MONTH, RequestsPerUnit: 5,
				Replaces: []*rlconfv3.RateLimitReplace{{Name: "search"}}}},
		{Key: "quota", QuotaMode: true, RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_WEEK, RequestsPerUnit: 3}},
		{Key: "year", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_YEAR, RequestsPerUnit: 2}},
	}}
	fromYAML, err := Parse(File{Name: "edge.yaml", Data: []byte(yml)})
	if err != nil {
		t.Fatal(err)
	}
	fromXDS, err := ParseXDS(pb)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range [][]string{
		{"remote_address=10.0.0.1"}, {"remote_address=50.0.0.5"}, {"api_key=k", "path=/search/books"},
		{"api_key=k", "path=/free"}, {"api_key=k", "path=/other"}, {"plan=gold"}, {"plan=silver"},
		{"quota=q"}, {"year=y"}, {"api_key=k"},
	} {
		y, x := fromYAML.Match("edge", ent(d...)), fromXDS.Match("edge", ent(d...))
		if !reflect.DeepEqual(y, x) {
			t.Errorf("%v: YAML matches %+v, xDS %+v", d, y.Limit, x.Limit)
		}
	}
}

// A resource is refused for what its YAML would be refused for, and the
// error names the resource.
func TestXDSResourceRefusals(t *testing.T) {
	rl := func(u rlconfv3.RateLimitUnit, n uint32) *rlconfv3.RateLimitPolicy {
		return &rlconfv3.RateLimitPolicy{Unit: u, RequestsPerUnit: n}
	}
	cases := []struct {
		name string
		rcs  []*rlconfv3.RateLimitConfig
		msg  string
	}{
		{"empty domain", []*rlconfv3.RateLimitConfig{{Name: "r"}}, `xDS resource "r": domain is empty`},
		{"domain twice", []*rlconfv3.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "b", Domain: "d"}},
			`xDS resource "b": domain "d" is already defined in xDS resource "a"`},
		{"no key", []*rlconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{{Value: "v"}}}},
			"descriptor has no key"},
		{"no unit", []*rlconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: rl(rlconfv3.RateLimitUnit_UNKNOWN, 5)}}}}, "rate_limit has no unit"},
		{"unit out of range", []*rlconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: rl(rlconfv3.RateLimitUnit(9), 5)}}}}, `invalid rate limit unit "UNIT(9)"`},
		{"unlimited with a unit", []*rlconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true, Unit: rlconfv3.RateLimitUnit_SECOND}}}}},
			"should not specify rate limit unit when unlimited"},
		{"defined twice", []*rlconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "k", Value: "v", RateLimit: rl(rlconfv3.RateLimitUnit_SECOND, 1)}, {Key: "k", Value: "v"}}}},
			"descriptor k_v is defined twice at this level"},
		{"empty replaces", []*rlconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_SECOND, Replaces: []*rlconfv3.RateLimitReplace{{}}}}}}},
			"should not have an empty replaces entry"},
	}
	for _, tc := range cases {
		c, err := ParseXDS(tc.rcs...)
		if err == nil || !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), `xDS resource "`) || c != nil {
			t.Errorf("%s: %v, want an error naming the resource and saying %q", tc.name, err, tc.msg)
		}
	}
	if c, err := ParseXDS(); err != nil || len(c.Domains()) != 0 {
		t.Fatalf("no resources: %v %v, want an empty configuration", c, err)
	}
}

// Whatever an xDS server sends, ParseXDS either refuses it with an error or
// returns a configuration the YAML parser would accept: it never panics,
// and a configuration it accepts has every domain of its resources.
func FuzzParseXDS(f *testing.F) {
	seed := &rlconfv3.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlconfv3.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 10}},
		{Key: "api_key", Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "path", Value: "/search/*", DetailedMetric: true,
			RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1000, Name: "search"}}}},
		{Key: "plan", Value: "gold", ShadowMode: true, QuotaMode: true},
	}}
	b, err := proto.Marshal(seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r rlconfv3.RateLimitConfig
		if proto.Unmarshal(data, &r) != nil {
			return
		}
		c, err := ParseXDS(&r)
		if err != nil {
			return
		}
		if r.Domain != "" && !slices.Contains(c.Domains(), r.Domain) {
			t.Fatalf("accepted %v without its domain %q: %v", &r, r.Domain, c.Domains())
		}
	})
}
