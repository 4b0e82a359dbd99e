package natstest

import (
	"context"
	"fmt"
	"net/url"
	"time"

	server "github.com/nats-io/nats-server/v2/server"

	"github.com/sluicehq/sluice/nats/embedded"
)

// StartConfigs boots one server per nats-server configuration file — the
// shipped region configs, for tests — with every port rewritten to a free
// one (HTTP monitoring off) and each server's gateways pointed at the servers
// started before it, and returns once every server has an outbound gateway
// to each of the others. The options returned are those each server was
// started with (users, accounts and all), in the order of files. On error
// every server started is shut down. SetGatewaysSolicitDelay is lowered as
// in StartSupercluster (process-wide).
func StartConfigs(ctx context.Context, files ...string) ([]*server.Server, []*server.Options, error) {
	server.SetGatewaysSolicitDelay(10 * time.Millisecond)
	var started []*server.Server
	var all []*server.Options
	fail := func(err error) ([]*server.Server, []*server.Options, error) {
		for _, s := range started {
			s.Shutdown()
			s.WaitForShutdown()
		}
		return nil, nil, err
	}
	for _, f := range files {
		opts, err := server.ProcessConfigFile(f)
		if err != nil {
			return fail(fmt.Errorf("natstest: %s: %w", f, err))
		}
		opts.Port, opts.HTTPPort, opts.Cluster.Port, opts.Gateway.Port = server.RANDOM_PORT, 0, server.RANDOM_PORT, server.RANDOM_PORT
		opts.NoLog, opts.NoSigs = true, true
		var remotes []*server.RemoteGatewayOpts
		for _, s := range started {
			remotes = append(remotes, &server.RemoteGatewayOpts{Name: s.ClusterName(),
				URLs: []*url.URL{{Scheme: "nats", Host: s.GatewayAddr().String()}}})
		}
		opts.Gateway.Gateways = remotes
		e, err := embedded.StartOptions(ctx, opts)
		if err != nil {
			return fail(fmt.Errorf("natstest: %s: %w", f, err))
		}
		s := e.Server()
		started = append(started, s)
		all = append(all, opts)
	}
	for _, s := range started {
		for s.NumOutboundGateways() < len(started)-1 {
			select {
			case <-ctx.Done():
				return fail(fmt.Errorf("natstest: %s has %d outbound gateways of %d: %w",
					s.ClusterName(), s.NumOutboundGateways(), len(started)-1, ctx.Err()))
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return started, all, nil
}
