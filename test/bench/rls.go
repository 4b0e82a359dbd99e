package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/region"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/service"
)

// rlsOnly makes bench run only rlsBench.
var rlsOnly = flag.Bool("rls-only", false, "run only the rate limit service (gRPC) load")

// echoRLS answers every ShouldRateLimit with the same response, of the
// shape a limiter sends: the bare cost of a gRPC unary call with these
// messages.
type echoRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	resp *rlsv3.RateLimitResponse
}

func (e *echoRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return e.resp, nil
}

// rlsBench measures Envoy's rate limit service: ShouldRateLimit calls/s,
// p50 and p99 from 64 concurrent callers (one gRPC connection, as an Envoy
// worker holds), one descriptor per call over benchIDs warm identifiers far
// from their limit, against a bare gRPC unary echo of the same messages and
// against the service with the region's Redis as origin, slices
// interleaved as the other loads. It reports whether bench should stop
// after it (-rls-only).
func rlsBench(ctx context.Context, dur, slice time.Duration) (only bool, err error) {
	return *rlsOnly, runRLSBench(ctx, dur, slice)
}

func runRLSBench(ctx context.Context, dur, slice time.Duration) error {
	conf, err := rls.Parse(rls.File{Name: "bench.yaml", Data: []byte(
		"domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 4000000000}\n")})
	if err != nil {
		return err
	}
	serve := func(srv rlsv3.RateLimitServiceServer) (string, func(), error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		g := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(g, srv)
		go func() { _ = g.Serve(ln) }()
		return ln.Addr().String(), g.Stop, nil
	}
	svc := service.New(service.Config{})
	defer svc.Close(ctx)
	limSrv, err := rls.NewServer(rls.ServerConfig{Service: svc}, conf)
	if err != nil {
		return err
	}
	rd, err := region.NewRedis(region.RedisConfig{URL: redisURL(), KeyPrefix: fmt.Sprintf("sluicebench:rls:%d", time.Now().UnixNano())})
	if err != nil {
		return err
	}
	redisSvc := service.New(service.Config{Origin: region.NewBreaker(rd, region.BreakerConfig{})})
	defer redisSvc.Close(ctx)
	redisSrv, err := rls.NewServer(rls.ServerConfig{Service: redisSvc}, conf)
	if err != nil {
		return err
	}
	echo := &echoRLS{resp: &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 4000000000, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			LimitRemaining: 3999999999, DurationUntilReset: durationpb.New(30 * time.Second)}}}}
	type rlsTarget struct {
		name   string
		client rlsv3.RateLimitServiceClient
		settle time.Duration
	}
	var targets []rlsTarget
	for _, s := range []struct {
		name   string
		srv    rlsv3.RateLimitServiceServer
		settle time.Duration
	}{{"grpc echo", echo, 0}, {"rls", limSrv, 0}, {"rls+redis", redisSrv, 200 * time.Millisecond}} {
		addr, stop, err := serve(s.srv)
		if err != nil {
			return err
		}
		defer stop()
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		targets = append(targets, rlsTarget{s.name, rlsv3.NewRateLimitServiceClient(cc), s.settle})
	}
	reqs := make([]*rlsv3.RateLimitRequest, benchIDs)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "user_" + strconv.Itoa(100000+i)}}}}}
		for _, tg := range targets {
			if _, err := tg.client.ShouldRateLimit(ctx, reqs[i]); err != nil {
				return fmt.Errorf("rls warm-up: %w", err)
			}
		}
	}
	tallies := make([]tally, len(targets))
	for i := range max(1, int(dur/slice)) {
		for j := range targets {
			k := (i + j) % len(targets)
			cpu := processCPU()
			if err := rlsLoad(ctx, targets[k].client, reqs, slice, &tallies[k]); err != nil {
				return fmt.Errorf("%s: %w", targets[k].name, err)
			}
			tallies[k].cpu += processCPU() - cpu
			time.Sleep(targets[k].settle)
		}
	}
	fmt.Printf("\nEnvoy's rate limit service (gRPC ShouldRateLimit, one descriptor, 64 callers on one connection)\n")
	fmt.Printf("%-22s %-10s %12s %10s %10s %12s\n", "client", "target", "calls/s", "p50", "p99", "CPU/call")
	res := make([]result, len(targets))
	for k, tg := range targets {
		res[k] = tallies[k].result()
		fmt.Printf("%-22s %-10s %12.0f %10s %10s %12s\n", "grpc, 64 goroutines", tg.name, res[k].rate, res[k].p50, res[k].p99, res[k].cpu)
	}
	e, l, r := res[0], res[1], res[2]
	fmt.Printf("%-22s %-10s %11.2fx %10s %9.2fx   rls / grpc echo (target: calls/s >= 0.80x)\n", "grpc, 64 goroutines", "ratio",
		l.rate/e.rate, "", float64(l.p99)/float64(e.p99))
	fmt.Printf("%-22s %-10s %11.2fx %10s %9.2fx   rls with Redis origin / grpc echo\n", "grpc, 64 goroutines", "ratio",
		r.rate/e.rate, "", float64(r.p99)/float64(e.p99))
	return nil
}

// rlsLoad runs 64 goroutines, each making one ShouldRateLimit call at a
// time, for dur.
func rlsLoad(ctx context.Context, c rlsv3.RateLimitServiceClient, reqs []*rlsv3.RateLimitRequest, dur time.Duration, t *tally) error {
	return callers(64, dur, t, func(i int) error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := c.ShouldRateLimit(cctx, reqs[i%len(reqs)])
		if err != nil {
			return err
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining == math.MaxUint32 {
			return fmt.Errorf("unexpected response %v", resp)
		}
		return nil
	})
}
