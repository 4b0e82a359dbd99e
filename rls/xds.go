package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// XDSTypeURL is the type of the resources an XDS client subscribes to:
// envoyproxy/ratelimit's RateLimitConfig, one domain each.
const XDSTypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// XDSTLS names the PEM files of TLS to the xDS management server. The
// files are read again at every connection attempt, so certificates
// rotated on disk apply from the next reconnection.
type XDSTLS struct {
	// Cert and Key are the client certificate the server may require
	// (mTLS); both or neither.
	Cert, Key string
	// CA verifies the server's certificate; empty: the system's roots.
	CA string
	// ServerName is the name the server's certificate must carry; empty:
	// the host of XDSConfig.Server.
	ServerName string
}

// Config reads the files into a client TLS configuration.
func (t XDSTLS) Config() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	switch {
	case t.Cert != "" && t.Key != "":
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("xDS TLS client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	case t.Cert != "" || t.Key != "":
		return nil, errors.New("xDS TLS: a client certificate needs both its certificate and its key")
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("xDS TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xDS TLS CA %s: no PEM certificate in it", t.CA)
		}
		c.RootCAs = pool
	}
	return c, nil
}

// XDSConfig holds what an XDS client needs; zero fields take the
// documented defaults.
type XDSConfig struct {
	// Server is the management server's address (host:port, or any gRPC
	// target). Required.
	Server string
	// NodeID identifies this process to the server, which keys the
	// configuration it serves by it (Envoy Gateway serves node
	// "envoy-ratelimit"). Default "default", as envoyproxy/ratelimit.
	NodeID string
	// NodeMetadata is sent as the node's metadata, string values.
	NodeMetadata map[string]string
	// Headers are added to the stream's gRPC metadata.
	Headers map[string]string
	// TLS, when set, is the TLS of the connection; nil: plaintext.
	TLS *XDSTLS
	// MaxMessageBytes bounds a response. Default 16 MiB (gRPC's 4 MiB
	// holds a few thousand routes' limits).
	MaxMessageBytes int
	// BackoffMin and BackoffMax bound the wait before a reconnection:
	// doubling from BackoffMin to BackoffMax, each wait drawn between half
	// and all of its bound; reset once a stream has delivered a response.
	// Defaults 500ms and 30s.
	BackoffMin, BackoffMax time.Duration
	// Target is the server whose configuration the client keeps. Required.
	Target *Server
	// Metrics counts each configuration received as a load, good or
	// refused. Nil counts nothing.
	Metrics *Metrics
	// Registerer, when set, gets the client's own metrics:
	// sluice_rls_xds_connected and sluice_rls_xds_updates_total{result}.
	Registerer prometheus.Registerer
	// Logger receives connection changes, and each configuration
	// accepted or refused. Default: discard.
	Logger *slog.Logger
	// UserAgent names this process's build in the node
	// (user_agent_version).
	UserAgent string
}

// XDS keeps a Server's configuration in step with an xDS management
// server: one aggregated (ADS) state-of-the-world stream subscribed to
// every RateLimitConfig resource (a wildcard subscription). Each response
// is the whole configuration: it is parsed as ParseXDS parses it and, if
// valid, swapped into the Server at once (an empty response withdraws
// every domain) and acknowledged (ACK); if invalid, it is refused with
// the parser's error (NACK), counted, logged, and the previous
// configuration stays; the same version sent again is refused again after
// a wait (from BackoffMin, doubling up to 5s), counted and logged once. A broken stream is opened again after a backoff;
// the configuration in use stays meanwhile.
type XDS struct {
	cfg       XDSConfig
	node      *corev3.Node
	connected prometheus.Gauge
	updates   *prometheus.CounterVec
}

// NewXDS returns a client; Run connects it.
func NewXDS(cfg XDSConfig) (*XDS, error) {
	if cfg.Server == "" {
		return nil, errors.New("rls xDS: XDSConfig.Server is required")
	}
	if cfg.Target == nil {
		return nil, errors.New("rls xDS: XDSConfig.Target is required")
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "default"
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 16 << 20
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 500 * time.Millisecond
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(30*time.Second, cfg.BackoffMin)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range cfg.NodeMetadata {
		md.Fields[k] = structpb.NewStringValue(v)
	}
	x := &XDS{cfg: cfg,
		node: &corev3.Node{Id: cfg.NodeID, Metadata: md, UserAgentName: "sluice-limiter",
			UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: cfg.UserAgent}},
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "rls", Name: "xds_connected",
			Help: "1 while the xDS stream to the management server is open and has delivered a response, else 0."}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "rls", Name: "xds_updates_total",
			Help: "Configurations received over xDS by result: ack (applied) or nack (refused, the previous one kept)."}, []string{"result"}),
	}
	x.updates.WithLabelValues("ack")
	x.updates.WithLabelValues("nack")
	if cfg.Registerer != nil {
		if err := errors.Join(cfg.Registerer.Register(x.connected), cfg.Registerer.Register(x.updates)); err != nil {
			return nil, fmt.Errorf("rls xDS metrics: %w", err)
		}
	}
	return x, nil
}

// Run keeps a stream to the management server until ctx ends, opening it
// again after each failure.
func (x *XDS) Run(ctx context.Context) {
	attempt := 0
	for {
		got, err := x.stream(ctx)
		x.connected.Set(0)
		if ctx.Err() != nil {
			return
		}
		if got {
			attempt = 0 // the server answered: start the backoff again
		}
		wait := x.backoff(attempt)
		attempt++
		x.cfg.Logger.Warn("rls xDS stream ended; reconnecting", "server", x.cfg.Server, "error", err, "in", wait.Round(time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// maxRefusalWait bounds the wait before refusing a version sent again:
// a new version the server has meanwhile is sent after it.
const maxRefusalWait = 5 * time.Second

// backoff is the wait before reconnection attempt n (from 0).
func (x *XDS) backoff(n int) time.Duration {
	d := x.cfg.BackoffMin
	for i := 0; i < n && d < x.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, x.cfg.BackoffMax)
	return d/2 + rand.N(d/2+1)
}

// stream runs one connection and stream until it fails or ctx ends; got
// says whether the server sent any response.
func (x *XDS) stream(ctx context.Context) (got bool, err error) {
	creds := insecure.NewCredentials()
	if x.cfg.TLS != nil {
		tc, err := x.cfg.TLS.Config()
		if err != nil {
			return false, err
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(x.cfg.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(x.cfg.MaxMessageBytes)))
	if err != nil {
		return false, fmt.Errorf("xDS server %s: %w", x.cfg.Server, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(x.cfg.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(x.cfg.Headers))
	}
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("xDS server %s: %w", x.cfg.Server, err)
	}
	// A new stream asks for the whole state: no version, every resource.
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: x.node, TypeUrl: XDSTypeURL}); err != nil {
		return false, fmt.Errorf("xDS server %s: %w", x.cfg.Server, err)
	}
	accepted := "" // the version last applied on this stream
	// The version last refused, why, and how often it came back since.
	var refused, why string
	repeats := 0
	for {
		resp, err := s.Recv()
		if err != nil {
			return got, fmt.Errorf("xDS server %s: %w", x.cfg.Server, err)
		}
		if !got {
			got = true
			x.connected.Set(1)
			x.cfg.Logger.Info("rls xDS stream open", "server", x.cfg.Server, "node", x.cfg.NodeID)
		}
		if resp.GetTypeUrl() != XDSTypeURL {
			// Not subscribed to: an answer would subscribe to it.
			x.cfg.Logger.Warn("rls xDS response of a type not asked for; ignored", "type", resp.GetTypeUrl())
			continue
		}
		req := &discoveryv3.DiscoveryRequest{TypeUrl: XDSTypeURL, ResponseNonce: resp.GetNonce(), VersionInfo: accepted}
		switch v := resp.GetVersionInfo(); {
		case v != "" && v == refused:
			// A server may send a refused version again at once, as
			// go-control-plane's snapshot cache does on a NACK: refuse it
			// again without parsing, counting or logging it, after a wait
			// that keeps the two from spinning.
			t := time.NewTimer(min(x.backoff(repeats), maxRefusalWait))
			repeats++
			select {
			case <-ctx.Done():
				t.Stop()
				return got, ctx.Err()
			case <-t.C:
			}
			req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: why}
		default:
			if err := x.apply(resp); err != nil {
				refused, why, repeats = v, err.Error(), 0
				req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: why}
			} else {
				accepted, refused = v, ""
				req.VersionInfo = accepted
			}
		}
		if err := s.Send(req); err != nil {
			return got, fmt.Errorf("xDS server %s: %w", x.cfg.Server, err)
		}
	}
}

// apply parses a response and swaps it in, or says why not.
func (x *XDS) apply(resp *discoveryv3.DiscoveryResponse) error {
	conf, err := decodeXDS(resp.GetResources())
	x.cfg.Metrics.ConfigLoaded(err == nil)
	if err != nil {
		x.updates.WithLabelValues("nack").Inc()
		x.cfg.Logger.Error("rls configuration refused over xDS; keeping the previous one", "version", resp.GetVersionInfo(), "error", err)
		return err
	}
	x.cfg.Target.SetConfig(conf)
	x.updates.WithLabelValues("ack").Inc()
	x.cfg.Logger.Info("rls configuration received over xDS", "version", resp.GetVersionInfo(), "domains", conf.Domains())
	return nil
}

func decodeXDS(as []*anypb.Any) (*Config, error) {
	rcs := make([]*rlconfv3.RateLimitConfig, len(as))
	for i, a := range as {
		if a.GetTypeUrl() != XDSTypeURL {
			return nil, fmt.Errorf("resource %d is a %s, not a RateLimitConfig", i, a.GetTypeUrl())
		}
		rcs[i] = &rlconfv3.RateLimitConfig{}
		if err := anypb.UnmarshalTo(a, rcs[i], proto.UnmarshalOptions{}); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
	}
	return ParseXDS(rcs...)
}
