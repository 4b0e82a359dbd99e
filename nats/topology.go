package nats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	server "github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
)

const (
	// loopback is where test topologies listen.
	loopback = "127.0.0.1"
	// gatewaySolicitDelay replaces nats-server's default 1s delay before
	// gateways connect out.
	gatewaySolicitDelay = 10 * time.Millisecond
	// formTimeout caps how long StartSupercluster waits for the mesh and
	// for interest to propagate, even when the caller's context allows
	// longer.
	formTimeout = 15 * time.Second
	// pollInterval is how often the supercluster helpers re-check state.
	pollInterval = 10 * time.Millisecond
	// probeTimeout bounds one probe request across gateways.
	probeTimeout = 250 * time.Millisecond
)

// StartServer starts a single nats-server on a random loopback port, for
// tests, and returns once it is ready for connections. The caller must call
// Shutdown.
func StartServer(ctx context.Context) (*Embedded, error) {
	return StartEmbedded(ctx, loopback+":0")
}

// Supercluster is a set of regions, one nats-server each, joined by
// gateways, for tests. Each region is its own cluster; cluster and gateway
// are both named after the region. Its methods are safe for concurrent use.
type Supercluster struct {
	regions []string
	servers map[string]*Embedded
}

// StartSupercluster starts one nats-server per region on random loopback
// ports, joins them by gateways, and returns only once every server has an
// inbound and an outbound gateway to every other region and a queue request
// made from each region is answered by a queue subscriber in each other
// region. With no regions it starts "us", "eu" and "ap". Region names must
// be unique, non-empty and without spaces.
//
// Waiting ends when ctx is done or after 15s, whichever comes first. On
// error, every server started has been shut down. The caller must call
// Shutdown.
//
// StartSupercluster lowers nats-server's gateway solicit delay from 1s to
// 10ms with server.SetGatewaysSolicitDelay. That setting is process-wide:
// it also applies to any other gateway-enabled server started later in the
// same process. It is meant for tests.
func StartSupercluster(ctx context.Context, regions ...string) (*Supercluster, error) {
	if len(regions) == 0 {
		regions = []string{"us", "eu", "ap"}
	}
	sc := &Supercluster{
		regions: slices.Clone(regions),
		servers: make(map[string]*Embedded, len(regions)),
	}
	for _, r := range sc.regions {
		if r == "" || strings.ContainsAny(r, " \t\r\n") {
			return nil, fmt.Errorf("nats: start supercluster: invalid region name %q", r)
		}
		if _, dup := sc.servers[r]; dup {
			return nil, fmt.Errorf("nats: start supercluster: duplicate region %q", r)
		}
		sc.servers[r] = nil
	}

	ctx, cancel := context.WithTimeoutCause(ctx, formTimeout,
		fmt.Errorf("supercluster not formed within %v: %w", formTimeout, context.DeadlineExceeded))
	defer cancel()

	server.SetGatewaysSolicitDelay(gatewaySolicitDelay)

	// Each region is pointed at every region started before it; the earlier
	// ones learn of it from its inbound connection and connect back.
	var remotes []*server.RemoteGatewayOpts
	for _, r := range sc.regions {
		opts := &server.Options{
			ServerName: "sluice-" + r,
			Host:       loopback,
			Port:       server.RANDOM_PORT,
			NoLog:      true,
			NoSigs:     true,
			Cluster: server.ClusterOpts{
				Name: r,
				Host: loopback,
				Port: server.RANDOM_PORT,
			},
			Gateway: server.GatewayOpts{
				Name:     r,
				Host:     loopback,
				Port:     server.RANDOM_PORT,
				Gateways: cloneRemotes(remotes),
			},
		}
		e, err := start(ctx, opts)
		if err != nil {
			sc.Shutdown()
			return nil, fmt.Errorf("nats: start supercluster region %q: %w", r, err)
		}
		sc.servers[r] = e
		addr := e.srv.GatewayAddr()
		if addr == nil {
			sc.Shutdown()
			return nil, fmt.Errorf("nats: start supercluster region %q: gateway listener not bound", r)
		}
		remotes = append(remotes, &server.RemoteGatewayOpts{
			Name: r,
			URLs: []*url.URL{{Scheme: "nats", Host: addr.String()}},
		})
	}

	if err := sc.waitMesh(ctx); err != nil {
		sc.Shutdown()
		return nil, fmt.Errorf("nats: start supercluster: %w", err)
	}
	if err := sc.waitInterest(ctx); err != nil {
		sc.Shutdown()
		return nil, fmt.Errorf("nats: start supercluster: %w", err)
	}
	return sc, nil
}

// Regions returns the region names in the order they were given.
func (sc *Supercluster) Regions() []string { return slices.Clone(sc.regions) }

// Server returns the nats-server of region, or nil if the supercluster has
// no such region. After StopRegion it returns the stopped server.
func (sc *Supercluster) Server(region string) *server.Server {
	if e := sc.servers[region]; e != nil {
		return e.srv
	}
	return nil
}

// ClientURL returns the URL clients use to connect to region, or "" if the
// supercluster has no such region.
func (sc *Supercluster) ClientURL(region string) string {
	if e := sc.servers[region]; e != nil {
		return e.ClientURL()
	}
	return ""
}

// StopRegion shuts region's server down, disconnecting its clients, and
// returns once shutdown is complete; the other regions keep running and
// keep trying to reconnect to it. It does nothing for an unknown region and
// may be called more than once.
func (sc *Supercluster) StopRegion(region string) {
	if e := sc.servers[region]; e != nil {
		e.Shutdown()
	}
}

// Shutdown shuts every region's server down and returns once all have
// completed shutdown. It may be called more than once.
func (sc *Supercluster) Shutdown() {
	var wg sync.WaitGroup
	for _, e := range sc.servers {
		if e != nil {
			wg.Go(e.Shutdown)
		}
	}
	wg.Wait()
}

// waitMesh waits until every server has an outbound and an inbound gateway
// connection to every other region.
func (sc *Supercluster) waitMesh(ctx context.Context) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		missing, err := sc.missingGateway()
		if err != nil {
			return err
		}
		if missing == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gateway mesh incomplete (%s): %w", missing, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// missingGateway describes the first gateway connection not yet
// established, or returns "" when the mesh is complete.
func (sc *Supercluster) missingGateway() (string, error) {
	for _, r := range sc.regions {
		gz, err := sc.servers[r].srv.Gatewayz(nil)
		if err != nil {
			return "", fmt.Errorf("gatewayz of region %q: %w", r, err)
		}
		for _, o := range sc.regions {
			if o == r {
				continue
			}
			if gz.OutboundGateways[o] == nil {
				return fmt.Sprintf("no outbound gateway from %q to %q", r, o), nil
			}
			if len(gz.InboundGateways[o]) == 0 {
				return fmt.Sprintf("no inbound gateway to %q from %q", r, o), nil
			}
		}
	}
	return "", nil
}

// waitInterest waits until, for every ordered pair of regions, a request
// from a client of one is answered by a queue subscriber in the other. The
// connections and subscriptions it makes are closed before it returns.
func (sc *Supercluster) waitInterest(ctx context.Context) error {
	conns := make(map[string]*natsgo.Conn, len(sc.regions))
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	subjects := make(map[string]string, len(sc.regions))
	for _, r := range sc.regions {
		nc, err := natsgo.Connect(sc.ClientURL(r),
			natsgo.Name("sluice-supercluster-probe"), natsgo.NoReconnect())
		if err != nil {
			return fmt.Errorf("connect probe client to region %q: %w", r, err)
		}
		conns[r] = nc
		// The inbox token makes the subject unique to this probe.
		subj := "_SLUICE.probe." + strings.TrimPrefix(natsgo.NewInbox(), natsgo.InboxPrefix) + "." + r
		if _, err := nc.QueueSubscribe(subj, "probe", func(m *natsgo.Msg) {
			_ = m.Respond(nil)
		}); err != nil {
			return fmt.Errorf("subscribe probe in region %q: %w", r, err)
		}
		if err := nc.FlushWithContext(ctx); err != nil {
			return fmt.Errorf("flush probe subscription in region %q: %w", r, err)
		}
		subjects[r] = subj
	}

	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for _, to := range sc.regions {
		for _, from := range sc.regions {
			if from == to {
				continue
			}
			for {
				rctx, cancel := context.WithTimeout(ctx, probeTimeout)
				_, err := conns[from].RequestWithContext(rctx, subjects[to], nil)
				cancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return fmt.Errorf("queue request from %q to %q unanswered (last error: %v): %w",
						from, to, err, context.Cause(ctx))
				}
				if !errors.Is(err, natsgo.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("queue request from %q to %q: %w", from, to, err)
				}
				select {
				case <-ctx.Done():
				case <-tick.C:
				}
			}
		}
	}
	return nil
}

// cloneRemotes returns a copy of remotes, so that no two servers' options
// share a RemoteGatewayOpts.
func cloneRemotes(remotes []*server.RemoteGatewayOpts) []*server.RemoteGatewayOpts {
	out := make([]*server.RemoteGatewayOpts, len(remotes))
	for i, r := range remotes {
		out[i] = &server.RemoteGatewayOpts{Name: r.Name, URLs: slices.Clone(r.URLs)}
	}
	return out
}
