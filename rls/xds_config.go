package rls

import (
	"fmt"
	"strconv"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
)

// ParseXDS builds a Config from RateLimitConfig resources, as an xDS
// management server (Envoy Gateway's) delivers them: each resource is one
// domain, converted to the YAML tree of a file and parsed by the same
// rules. Errors name the resource ("xDS resource \"name\": ..."). A unit
// of UNKNOWN is no unit; metadata is ignored. On error no Config is returned.
func ParseXDS(resources ...*rlconfv3.RateLimitConfig) (*Config, error) {
	c, where := &Config{domains: map[string]level{}}, map[string]string{}
	for _, r := range resources {
		// The tree carries no lines: errors name the resource alone.
		if err := c.add(&parser{file: fmt.Sprintf("xDS resource %q", r.GetName())}, xdsDocument(r), where); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func yamlStr(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}

// setFlag adds key: true to mapping n when on.
func setFlag(n *yaml.Node, key string, on bool) {
	if on {
		n.Content = append(n.Content, yamlStr(key), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
	}
}

func yamlMap(kv ...*yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: kv}
}

// xdsDocument is the YAML tree of a RateLimitConfig: its domain, always
// (empty is refused by the parser), and its descriptors.
func xdsDocument(r *rlconfv3.RateLimitConfig) *yaml.Node {
	doc := yamlMap(yamlStr("domain"), yamlStr(r.GetDomain()))
	if len(r.GetDescriptors()) > 0 {
		doc.Content = append(doc.Content, yamlStr("descriptors"), xdsDescriptors(r.GetDescriptors()))
	}
	return doc
}

func xdsDescriptors(ds []*rlconfv3.RateLimitDescriptor) *yaml.Node {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, d := range ds {
		// A proto's key is always there: an empty one is refused as in a
		// file ("descriptor has no key").
		n := yamlMap(yamlStr("key"), yamlStr(d.GetKey()))
		if d.GetValue() != "" {
			n.Content = append(n.Content, yamlStr("value"), yamlStr(d.GetValue()))
		}
		if rl := d.GetRateLimit(); rl != nil {
			n.Content = append(n.Content, yamlStr("rate_limit"), xdsRateLimit(rl))
		}
		setFlag(n, "shadow_mode", d.GetShadowMode())
		setFlag(n, "quota_mode", d.GetQuotaMode())
		setFlag(n, "detailed_metric", d.GetDetailedMetric())
		if len(d.GetDescriptors()) > 0 {
			n.Content = append(n.Content, yamlStr("descriptors"), xdsDescriptors(d.GetDescriptors()))
		}
		seq.Content = append(seq.Content, n)
	}
	return seq
}

func xdsRateLimit(p *rlconfv3.RateLimitPolicy) *yaml.Node {
	n := yamlMap()
	setFlag(n, "unlimited", p.GetUnlimited())
	// The proto's units are numbered as Envoy's response units, as Unit is;
	// an unknown number is refused by name ("UNIT(9)").
	if u := Unit(p.GetUnit()); u != UnitUnknown {
		n.Content = append(n.Content, yamlStr("unit"), yamlStr(u.String()))
	}
	// requests_per_unit has no presence in proto3: unset is a limit of 0,
	// as upstream reads it, except in an unlimited policy.
	if !p.GetUnlimited() || p.GetRequestsPerUnit() != 0 {
		n.Content = append(n.Content, yamlStr("requests_per_unit"),
			&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(uint64(p.GetRequestsPerUnit()), 10)})
	}
	if p.GetName() != "" {
		n.Content = append(n.Content, yamlStr("name"), yamlStr(p.GetName()))
	}
	if len(p.GetReplaces()) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range p.GetReplaces() {
			seq.Content = append(seq.Content, yamlMap(yamlStr("name"), yamlStr(r.GetName())))
		}
		n.Content = append(n.Content, yamlStr("replaces"), seq)
	}
	return n
}
