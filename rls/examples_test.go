package rls

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// yamlDocs returns the YAML documents of path as JSON.
func yamlDocs(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var v any
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return docs
		} else if err != nil {
			t.Fatal(err)
		}
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, j)
	}
}

// The shipped examples are valid: the rate limits load, the Envoy
// bootstrap is a valid Envoy v3 configuration (Envoy's own protos and
// validation rules), and the Istio patch's filter configuration is one.
func TestShippedExamplesAreValid(t *testing.T) {
	c := mustLoad(t, "../examples/envoy-rls/ratelimit.yaml")
	checkMatch(t, c, "edge", ent("remote_address=10.0.0.1"), want{rpu: 10, unit: Second})
	checkMatch(t, c, "edge", ent("api_key=k", "path=/search/books"), want{rpu: 1000, unit: Hour})
	checkMatch(t, c, "edge", ent("api_key=k", "path=/items"), want{rpu: 100, unit: Minute})

	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(yamlDocs(t, "../examples/envoy-rls/envoy.yaml")[0], &bs); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	docs := yamlDocs(t, "../examples/envoy-rls/istio.yaml")
	var filter struct {
		Spec struct {
			ConfigPatches []struct {
				Patch struct {
					Value struct {
						TypedConfig json.RawMessage `json:"typed_config"`
					}
				}
			} `json:"configPatches"`
		}
	}
	if err := json.Unmarshal(docs[1], &filter); err != nil {
		t.Fatal(err)
	}
	raw := filter.Spec.ConfigPatches[0].Patch.Value.TypedConfig
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "@type")
	raw, _ = json.Marshal(m)
	var rl ratelimitv3.RateLimit
	if err := protojson.Unmarshal(raw, &rl); err != nil {
		t.Fatalf("istio.yaml filter: %v", err)
	}
	if err := rl.ValidateAll(); err != nil || rl.Domain != "edge" {
		t.Fatalf("istio.yaml filter: %v (domain %q)", err, rl.Domain)
	}
}
