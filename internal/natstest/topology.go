package natstest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	server "github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/internal/tcpproxy"
	"github.com/sluicehq/sluice/nats/embedded"
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
	// maxPortAttempts bounds how many gateway ports a cuttable region
	// tries, should the one picked be taken before its server binds it.
	maxPortAttempts = 3
)

// StartServer starts a single nats-server on a random loopback port, for
// tests, and returns once it is ready for connections. The caller must call
// Shutdown.
func StartServer(ctx context.Context) (*embedded.Server, error) {
	return embedded.Start(ctx, loopback+":0")
}

// Supercluster is a set of regions, one nats-server each, joined by
// gateways, for tests. Each region is its own cluster; cluster and gateway
// are both named after the region. Its methods are safe for concurrent use.
type Supercluster struct {
	regions []string
	servers map[string]*embedded.Server
	// proxies holds, with CuttableGateways, the proxy in front of each
	// region's gateway listener; it is empty otherwise.
	proxies map[string]*tcpproxy.Proxy
}

// SuperclusterOptions configures StartSuperclusterWith.
type SuperclusterOptions struct {
	// Regions names the regions, one nats-server each. Empty means "us",
	// "eu" and "ap". Names must be unique, non-empty and without spaces.
	Regions []string

	// CuttableGateways puts each region's gateway listener behind its own
	// TCP proxy (see internal/tcpproxy), so that CutGateways and
	// HealGateways can partition the regions from each other and join them
	// again while every server keeps serving its own clients.
	//
	// The region advertises its proxy's address as its gateway address
	// (Options.Gateway.Advertise) and every other region is configured
	// with that address, so every gateway connection into a region passes
	// through that region's proxy: gossip between gateways (the INFO
	// GatewayURLs field and gateway gossip) only ever carries the
	// advertised address, never the real listener's. Advertising is what
	// makes this hold: without it a server's INFO carries its real gateway
	// address, which the regions it connects to add to the addresses they
	// know for it and gossip on, so gateways they learn of implicitly
	// connect straight to the listener, and configured ones fall back to
	// it once the proxy refuses them.
	CuttableGateways bool
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
//
// StartSupercluster(ctx, regions...) is StartSuperclusterWith with only
// Regions set.
func StartSupercluster(ctx context.Context, regions ...string) (*Supercluster, error) {
	return StartSuperclusterWith(ctx, SuperclusterOptions{Regions: regions})
}

// StartSuperclusterWith is StartSupercluster configured by opts; see
// SuperclusterOptions. With opts.CuttableGateways the supercluster also
// starts one TCP proxy per region, which Shutdown closes.
func StartSuperclusterWith(ctx context.Context, opts SuperclusterOptions) (*Supercluster, error) {
	regions := opts.Regions
	if len(regions) == 0 {
		regions = []string{"us", "eu", "ap"}
	}
	sc := &Supercluster{
		regions: slices.Clone(regions),
		servers: make(map[string]*embedded.Server, len(regions)),
		proxies: make(map[string]*tcpproxy.Proxy),
	}
	seen := make(map[string]bool, len(regions))
	for _, r := range sc.regions {
		if r == "" || strings.ContainsAny(r, " \t\r\n") {
			return nil, fmt.Errorf("natstest: start supercluster: invalid region name %q", r)
		}
		if seen[r] {
			return nil, fmt.Errorf("natstest: start supercluster: duplicate region %q", r)
		}
		seen[r] = true
	}

	ctx, cancel := context.WithTimeoutCause(ctx, formTimeout,
		fmt.Errorf("supercluster not formed within %v: %w", formTimeout, context.DeadlineExceeded))
	defer cancel()

	server.SetGatewaysSolicitDelay(gatewaySolicitDelay)

	// Each region is pointed at every region started before it; the earlier
	// ones learn of it from its inbound connection and connect back.
	var remotes []*server.RemoteGatewayOpts
	for _, r := range sc.regions {
		var (
			gwURL string
			err   error
		)
		if opts.CuttableGateways {
			gwURL, err = sc.startCuttableRegion(ctx, r, remotes)
		} else {
			gwURL, err = sc.startRegion(ctx, r, remotes)
		}
		if err != nil {
			sc.Shutdown()
			return nil, fmt.Errorf("natstest: start supercluster region %q: %w", r, err)
		}
		remotes = append(remotes, &server.RemoteGatewayOpts{
			Name: r,
			URLs: []*url.URL{{Scheme: "nats", Host: gwURL}},
		})
	}

	if err := sc.waitMesh(ctx); err != nil {
		sc.Shutdown()
		return nil, fmt.Errorf("natstest: start supercluster: %w", err)
	}
	return sc, nil
}

// regionOptions returns the options of region r's server: random loopback
// ports, and a gateway to each of remotes.
func regionOptions(r string, remotes []*server.RemoteGatewayOpts) *server.Options {
	return &server.Options{
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
}

// startRegion starts region r's server with gateways to remotes, records
// it, and returns the "host:port" other regions reach its gateway at.
func (sc *Supercluster) startRegion(ctx context.Context, r string, remotes []*server.RemoteGatewayOpts) (string, error) {
	e, err := embedded.StartOptions(ctx, regionOptions(r, remotes))
	if err != nil {
		return "", err
	}
	sc.servers[r] = e
	addr := e.Server().GatewayAddr()
	if addr == nil {
		return "", errors.New("gateway listener not bound")
	}
	return addr.String(), nil
}

// startCuttableRegion is startRegion with the region's gateway listener
// behind a proxy, whose address it returns.
//
// The proxy needs the listener's address before it starts, and the server
// needs the proxy's address (to advertise it) before it starts, so the
// listener's port is picked first: bound on a random port and released.
// Should another socket take the port in between, the server cannot listen
// and is retried on a new port.
func (sc *Supercluster) startCuttableRegion(ctx context.Context, r string, remotes []*server.RemoteGatewayOpts) (string, error) {
	for attempt := 1; ; attempt++ {
		gwAddr, err := freeLoopbackAddr()
		if err != nil {
			return "", err
		}
		p, err := tcpproxy.Start(gwAddr.String())
		if err != nil {
			return "", err
		}
		sc.proxies[r] = p
		opts := regionOptions(r, remotes)
		opts.Gateway.Port = gwAddr.Port
		opts.Gateway.Advertise = p.Addr()
		e, err := embedded.StartOptions(ctx, opts)
		if err == nil {
			sc.servers[r] = e
			return p.Addr(), nil
		}
		_ = p.Close()
		delete(sc.proxies, r)
		if attempt == maxPortAttempts || ctx.Err() != nil || portFree(gwAddr.String()) {
			return "", err
		}
		// The port is taken: the server could not listen on it. Retry.
	}
}

// portFree reports whether addr can be listened on now.
func portFree(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// freeLoopbackAddr returns a loopback TCP address that was free a moment
// ago.
func freeLoopbackAddr() (*net.TCPAddr, error) {
	l, err := net.Listen("tcp", loopback+":0")
	if err != nil {
		return nil, fmt.Errorf("pick a gateway port: %w", err)
	}
	addr := l.Addr().(*net.TCPAddr)
	if err := l.Close(); err != nil {
		return nil, fmt.Errorf("pick a gateway port: release %s: %w", addr, err)
	}
	return addr, nil
}

// Regions returns the region names in the order they were given.
func (sc *Supercluster) Regions() []string { return slices.Clone(sc.regions) }

// Server returns the nats-server of region, or nil if the supercluster has
// no such region. After StopRegion it returns the stopped server.
func (sc *Supercluster) Server(region string) *server.Server {
	if e := sc.servers[region]; e != nil {
		return e.Server()
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

// Shutdown shuts every region's server down, and with CuttableGateways
// closes the proxies, and returns once all have completed shutdown. It may
// be called more than once.
func (sc *Supercluster) Shutdown() {
	var wg sync.WaitGroup
	for _, e := range sc.servers {
		if e != nil {
			wg.Go(e.Shutdown)
		}
	}
	wg.Wait()
	for _, p := range sc.proxies {
		wg.Go(func() { _ = p.Close() })
	}
	wg.Wait()
}

// CutGateways partitions the regions from each other: with
// CuttableGateways, every region's gateway proxy is switched to Refuse, which
// resets the open gateway connections and every new one, so no region can
// reach another until HealGateways. Clients are not affected: each region's
// server keeps serving its own clients. Use WaitPartitioned to wait until
// every server has noticed. Without CuttableGateways it does nothing.
//
// While cut, the servers keep retrying: nats-server reconnects to a
// gateway it was configured with about every 1s (a fixed delay with no
// setting) and to a gateway it learned of within 100ms.
func (sc *Supercluster) CutGateways() {
	for _, p := range sc.proxies {
		p.SetMode(tcpproxy.Refuse)
	}
}

// HealGateways undoes CutGateways: every region's gateway proxy is switched
// back to Pass, and the servers' next reconnect attempts succeed. Use
// WaitMesh to wait until the mesh is whole again. That normally takes at
// most about 1.1s: nats-server retries a gateway it was configured with 1s
// plus up to 100ms after the last attempt, a delay it offers no setting
// for, so the heal takes from a few milliseconds to that long depending on
// when it falls in the cycle. Without CuttableGateways it does nothing.
func (sc *Supercluster) HealGateways() {
	for _, p := range sc.proxies {
		p.SetMode(tcpproxy.Pass)
	}
}

// WaitMesh waits until the mesh is whole: every server has an outbound and
// an inbound gateway connection to every other region, and a queue request
// made from each region is answered by a queue subscriber in each other
// region. StartSupercluster waits for the same before it returns; WaitMesh
// is for after HealGateways.
//
// Waiting ends when ctx is done or after 15s, whichever comes first. It
// fails at once if a region was stopped with StopRegion.
func (sc *Supercluster) WaitMesh(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, formTimeout,
		fmt.Errorf("mesh not formed within %v: %w", formTimeout, context.DeadlineExceeded))
	defer cancel()
	for _, r := range sc.regions {
		if !sc.servers[r].Server().Running() {
			return fmt.Errorf("natstest: wait for mesh: region %q is stopped", r)
		}
	}
	if err := sc.waitMesh(ctx); err != nil {
		return fmt.Errorf("natstest: wait for mesh: %w", err)
	}
	return nil
}

// WaitPartitioned waits until no server reports any outbound or inbound
// gateway connection, as after CutGateways once every server has noticed.
//
// Waiting ends when ctx is done or after 15s, whichever comes first.
func (sc *Supercluster) WaitPartitioned(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, formTimeout,
		fmt.Errorf("not partitioned within %v: %w", formTimeout, context.DeadlineExceeded))
	defer cancel()
	if err := sc.poll(ctx, sc.remainingGateway); err != nil {
		return fmt.Errorf("natstest: wait for partition: %w", err)
	}
	return nil
}

// waitMesh waits until the gateways are all connected, then until
// cross-region interest propagates.
func (sc *Supercluster) waitMesh(ctx context.Context) error {
	if err := sc.poll(ctx, sc.missingGateway); err != nil {
		return fmt.Errorf("gateway mesh incomplete: %w", err)
	}
	return sc.waitInterest(ctx)
}

// poll calls check every pollInterval until it reports nothing pending
// ("") or fails. When ctx ends first, the error joins what was last
// pending and the context's cause.
func (sc *Supercluster) poll(ctx context.Context, check func() (string, error)) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		pending, err := check()
		if err != nil {
			return err
		}
		if pending == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", pending, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// missingGateway describes the first gateway connection not yet
// established, or returns "" when the mesh is complete.
func (sc *Supercluster) missingGateway() (string, error) {
	for _, r := range sc.regions {
		gz, err := sc.servers[r].Server().Gatewayz(nil)
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

// remainingGateway describes the first gateway connection still
// established, or returns "" when there is none.
func (sc *Supercluster) remainingGateway() (string, error) {
	for _, r := range sc.regions {
		gz, err := sc.servers[r].Server().Gatewayz(nil)
		if err != nil {
			return "", fmt.Errorf("gatewayz of region %q: %w", r, err)
		}
		if len(gz.OutboundGateways) > 0 {
			return fmt.Sprintf("outbound gateways from %q to %q still connected",
				r, slices.Sorted(maps.Keys(gz.OutboundGateways))), nil
		}
		if len(gz.InboundGateways) > 0 {
			return fmt.Sprintf("inbound gateways to %q from %q still connected",
				r, slices.Sorted(maps.Keys(gz.InboundGateways))), nil
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
