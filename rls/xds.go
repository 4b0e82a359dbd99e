package rls

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
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

// XDSTLS names the PEM files of TLS to the xDS management server, read
// again at every connection attempt, so rotated certificates apply from
// the next reconnection.
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
		var err error
		if c.RootCAs, err = certPool("xDS TLS CA", t.CA); err != nil {
			return nil, err
		}
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
	// configuration by it (Envoy Gateway's is "envoy-ratelimit"). Default
	// "default", as envoyproxy/ratelimit.
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
	// BackoffMin and BackoffMax bound the wait before a reconnection, which
	// doubles from BackoffMin to BackoffMax (each drawn between half and all
	// of it) and resets once a stream delivered a response. Defaults 500ms
	// and 30s.
	BackoffMin, BackoffMax time.Duration
	// Target is the server whose configuration the client keeps. Required.
	Target *Server
	// Metrics counts each configuration received as a load. Nil: none.
	Metrics *Metrics
	// Registerer, when set, gets the client's own metrics:
	// sluice_rls_xds_connected and sluice_rls_xds_updates_total{result}.
	Registerer prometheus.Registerer
	// Logger receives connection changes and each configuration accepted
	// or refused. Default: discard.
	Logger *slog.Logger
	// UserAgent names this process's build in the node's user_agent_version.
	UserAgent string
}

// XDS keeps a Server's configuration in step with an xDS management server
// over one aggregated (ADS) state-of-the-world stream subscribed to every
// RateLimitConfig. Each response is the whole configuration, parsed as
// ParseXDS does: if valid, it is swapped in at once (an empty one withdraws
// every domain) and ACKed; if not, it is NACKed with the parser's error,
// counted and logged, and the previous one stays. The same version sent
// again is NACKed again after a wait (from BackoffMin, doubling up to 5s),
// uncounted. A broken stream is opened again after a backoff; the
// configuration in use stays meanwhile.
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
	cfg.NodeID = cmp.Or(cfg.NodeID, "default")
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 16 << 20
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 500 * time.Millisecond
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(30*time.Second, cfg.BackoffMin)
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
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
			attempt = 0
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
	// The version last applied on this stream; the version last refused,
	// why, and how often it came back since.
	var accepted, refused, why string
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
			// go-control-plane's snapshot cache sends a refused version
			// again at once: refuse it unparsed and uncounted, after a wait
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
