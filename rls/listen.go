package rls

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// ServiceName is the gRPC service ShouldRateLimit belongs to, as health
// checks name it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// TLSFiles names the PEM files of the listener's TLS. With ClientCA set,
// every client must present a certificate signed by it.
type TLSFiles struct {
	Cert, Key, ClientCA string
}

// Enabled reports whether any TLS file is named.
func (f TLSFiles) Enabled() bool { return f.Cert != "" || f.Key != "" || f.ClientCA != "" }

// Config returns the TLS configuration of the files: a certificate and key
// (both required), and a client CA that makes client certificates required
// and verified; it speaks HTTP/2 (ALPN h2, which gRPC requires). A
// handshake after any file changed (size or modification time) reads them
// again, so certificates rotate without a restart; files that cannot be
// read (half-written) keep the previous configuration.
func (f TLSFiles) Config() (*tls.Config, error) {
	return f.ConfigFor("h2", tls.RequireAndVerifyClientCert)
}

// ConfigFor is Config speaking protocol (ALPN) instead, and, with a
// client CA, checking client certificates as auth says.
func (f TLSFiles) ConfigFor(protocol string, auth tls.ClientAuthType) (*tls.Config, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("rls TLS: both a certificate and a key are required")
	}
	r := &tlsReloader{files: f, protocol: protocol, auth: auth}
	c, err := r.load()
	if err != nil {
		return nil, err
	}
	r.conf, r.stamp = c, f.stamp()
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: r.get}, nil
}

// load reads the files into a server configuration.
func (r *tlsReloader) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(r.files.Cert, r.files.Key)
	if err != nil {
		return nil, fmt.Errorf("rls TLS: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{r.protocol}}
	if r.files.ClientCA != "" {
		if c.ClientCAs, err = certPool("rls TLS client CA", r.files.ClientCA); err != nil {
			return nil, err
		}
		c.ClientAuth = r.auth
	}
	return c, nil
}

// certPool reads the PEM certificates of file, which errors name as what.
func certPool(what, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", what, file)
	}
	return pool, nil
}

// stamp is the size and modification time of each file.
func (f TLSFiles) stamp() string {
	var b strings.Builder
	for _, p := range []string{f.Cert, f.Key, f.ClientCA} {
		if p == "" {
			continue
		}
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%d:%d;", st.Size(), st.ModTime().UnixNano())
		} else {
			b.WriteString("missing;")
		}
	}
	return b.String()
}

// tlsReloader holds the configuration of the files as last read, speaking
// protocol and checking client certificates as auth says.
type tlsReloader struct {
	files    TLSFiles
	protocol string
	auth     tls.ClientAuthType
	mu       sync.Mutex
	conf     *tls.Config
	stamp    string // of the files conf was read from, or last tried
}

func (r *tlsReloader) get(*tls.ClientHelloInfo) (*tls.Config, error) {
	st := r.files.stamp()
	r.mu.Lock()
	defer r.mu.Unlock()
	if st != r.stamp {
		r.stamp = st
		if c, err := r.load(); err == nil {
			r.conf = c
		}
	}
	return r.conf, nil
}

// GRPC is the gRPC server of the rate limit service: ShouldRateLimit,
// health checking (grpc.health.v1, for "" and ServiceName: SERVING while
// the Server is ready, Server.Ready, until Stop) and server reflection.
type GRPC struct {
	*grpc.Server
	Health *health.Server
}

// streamWorkers is the fewest goroutines the gRPC server runs calls on.
const streamWorkers = 256

// NewGRPC returns a gRPC server serving srv, over TLS when tc is not nil.
// It accepts keepalive pings as often as every 10s, with or without calls
// in flight, as Envoy's connection keepalive sends them (grpc-go's default
// closes such a connection). With maxAge above 0, a connection is closed
// gracefully once that old (calls in flight finish within 10s), spreading
// Envoy's long-lived connections over limiters added since.
func NewGRPC(srv *Server, tc *tls.Config, maxAge time.Duration) *GRPC {
	opts := []grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Calls run on long-lived workers, as many as a busy limiter holds
		// at once: a fresh goroutine would grow its stack through a call's
		// deep path to Redis every time. An idle worker costs a few KiB.
		grpc.NumStreamWorkers(uint32(max(streamWorkers, 16*runtime.GOMAXPROCS(0))))}
	if maxAge > 0 {
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: maxAge, MaxConnectionAgeGrace: 10 * time.Second}))
	}
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	g := &GRPC{Server: grpc.NewServer(opts...), Health: health.NewServer()}
	rlsv3.RegisterRateLimitServiceServer(g.Server, srv)
	healthpb.RegisterHealthServer(g.Server, g.Health)
	reflection.Register(g.Server)
	srv.watchReady(func(ready bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ready {
			st = healthpb.HealthCheckResponse_SERVING
		}
		g.Health.SetServingStatus("", st)
		g.Health.SetServingStatus(ServiceName, st)
	})
	return g
}

// Stop marks the service not serving, then stops taking calls and waits
// for those in flight until ctx ends, when it cuts them.
func (g *GRPC) Stop(ctx context.Context) {
	g.Health.Shutdown()
	done := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		g.Server.Stop()
		<-done
	}
}

// Reloader keeps a Server's configuration in step with files: every
// interval it reads them and, when their content changed, parses and swaps
// them in. An invalid configuration is refused with one log line and a
// metric, and the previous one stays. Skipped files (ReadFiles) are logged
// when they change and shown in the metrics; a configuration of no domain
// is logged when swapped in.
type Reloader struct {
	Path     string
	Server   *Server
	Metrics  *Metrics // nil: none
	Logger   *slog.Logger
	Interval time.Duration

	sum     [32]byte
	skipped []string
}

// Load reads and parses the files once and, if they are valid, installs
// them. The first call's error is the caller's to report (a process
// should not start on an invalid configuration).
func (r *Reloader) Load() error {
	_, _, err := r.load(true)
	return err
}

// load reads the files and, when always or when their content changed,
// parses and installs them. c is the configuration installed, if any;
// read is false when the files could not be read.
func (r *Reloader) load(always bool) (c *Config, read bool, err error) {
	fs, skipped, err := ReadFiles(r.Path)
	if err != nil {
		return nil, false, err
	}
	r.noteSkipped(skipped)
	sum := digest(fs)
	if sum == r.sum && !always {
		return nil, true, nil
	}
	r.sum = sum
	c, err = Parse(fs...)
	r.Metrics.ConfigLoaded(err == nil)
	if err != nil {
		return nil, true, err
	}
	r.Server.SetConfig(c)
	if len(c.domains) == 0 {
		r.Logger.Warn("rls configuration has no domain: every call is answered OK, and the service is not ready (unless told to be without domains)",
			"path", r.Path, "files", c.Files)
	}
	return c, true, nil
}

// noteSkipped names the files skipped when they are not those named last.
func (r *Reloader) noteSkipped(skipped []string) {
	if slices.Equal(skipped, r.skipped) {
		return
	}
	r.skipped = skipped
	r.Metrics.skippedFiles(skipped)
	if len(skipped) > 0 {
		r.Logger.Warn("rls configuration skips files: hidden, links to directories, or not files", "path", r.Path, "skipped", skipped)
	}
}

func digest(fs []File) [32]byte {
	h := sha256.New()
	for _, f := range fs {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
	}
	var s [32]byte
	h.Sum(s[:0])
	return s
}

// Run checks the files every Interval until ctx ends.
func (r *Reloader) Run(ctx context.Context) {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.check()
		}
	}
}

func (r *Reloader) check() {
	c, read, err := r.load(false)
	switch {
	case !read && r.sum != ([32]byte{}):
		r.Logger.Error("rls configuration unreadable; keeping the previous one", "path", r.Path, "error", err)
		r.Metrics.ConfigLoaded(false)
		r.sum = [32]byte{}
	case read && err != nil:
		r.Logger.Error("rls configuration refused; keeping the previous one", "path", r.Path, "error", err)
	case c != nil:
		r.Logger.Info("rls configuration reloaded", "path", r.Path, "files", len(c.Files), "domains", c.Domains())
	}
}
