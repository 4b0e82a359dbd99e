package rls

import (
	"context"
	"strconv"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/service"
)

// BenchmarkShouldRateLimit is the server's own cost per call, without gRPC:
// matching, naming the cell and a warm check, for one and for three
// descriptors (a batch).
func BenchmarkShouldRateLimit(b *testing.B) {
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	conf, err := Parse(File{Name: "b.yaml", Data: []byte(
		"domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 4000000000}\n" +
			"  - key: route\n    descriptors:\n      - key: method\n        rate_limit: {unit: hour, requests_per_unit: 4000000000}\n")})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Service: svc, Metrics: NewMetrics(prometheus.NewRegistry())}, conf)
	if err != nil {
		b.Fatal(err)
	}
	reqs := func(n int) []*rlsv3.RateLimitRequest {
		rs := make([]*rlsv3.RateLimitRequest, 1024)
		for i := range rs {
			r := &rlsv3.RateLimitRequest{Domain: "bench"}
			r.Descriptors = append(r.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u" + strconv.Itoa(i)}}})
			for j := 1; j < n; j++ {
				r.Descriptors = append(r.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
					{Key: "route", Value: "/r" + strconv.Itoa(j)}, {Key: "method", Value: "GET"}}})
			}
			rs[i] = r
		}
		return rs
	}
	for _, n := range []int{1, 3} {
		rs := reqs(n)
		for _, r := range rs {
			if _, err := srv.ShouldRateLimit(context.Background(), r); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(strconv.Itoa(n)+"-descriptors", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := srv.ShouldRateLimit(context.Background(), rs[i&1023]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
