package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
)

// upstreamRatelimit is envoyproxy/ratelimit's server binary, run beside
// the limiter under the -rls-cold loads.
var upstreamRatelimit = flag.String("upstream-ratelimit", "",
	"with -rls-cold: envoyproxy/ratelimit's server binary (built from its src/service_cmd), run side by side with the limiter "+
		"on the same YAML and Redis, the two in turn")

// startUpstream starts envoyproxy/ratelimit's server bin on rlsColdYAML
// (written under dir, where it reads it: $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/
// config/) and the Redis at redisURL, over TCP, with its defaults
// otherwise: no local cache, no implicit pipelining (REDIS_PIPELINE_WINDOW
// and REDIS_PIPELINE_LIMIT unset), a pool of 10 connections. Its stats go
// to its logging sink, the one sink that needs no statsd, and the sink's
// lines are dropped from its stderr.
func startUpstream(bin, dir, redisURL string) (*coldSystem, error) {
	u, err := url.Parse(redisURL)
	if err != nil {
		return nil, fmt.Errorf("redis URL %s: %w", redisURL, err)
	}
	root := filepath.Join(dir, "upstream-runtime")
	if err := os.MkdirAll(filepath.Join(root, "ratelimit", "config"), 0o700); err != nil {
		return nil, fmt.Errorf("upstream's runtime directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, "ratelimit", "config", "bench.yaml"), []byte(rlsColdYAML), 0o600); err != nil {
		return nil, fmt.Errorf("upstream's rate limit configuration: %w", err)
	}
	port := func(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
	grpcAddr := freeAddr()
	env := []string{
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_TYPE=SINGLE",
		"REDIS_URL=" + u.Host,
		"LOCAL_CACHE_SIZE_IN_BYTES=0",
		"HOST=127.0.0.1",
		"PORT=" + port(freeAddr()),
		"DEBUG_HOST=127.0.0.1",
		"DEBUG_PORT=" + port(freeAddr()),
		"GRPC_HOST=127.0.0.1",
		"GRPC_PORT=" + port(grpcAddr),
		"LOG_LEVEL=warn",
	}
	// The Go runtime's settings reach it as they reach the limiter, which
	// inherits the whole environment.
	for _, k := range []string{"GOMAXPROCS", "GOGC", "GOMEMLIMIT", "GODEBUG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	cmd := exec.Command(bin)
	cmd.Env = env
	stderr := &dropLines{w: os.Stderr, drop: []byte(`"logger":"gostats.loggingsink"`)}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start upstream's ratelimit %s: %w", bin, err)
	}
	sys := &coldSystem{name: "upstream", pid: cmd.Process.Pid}
	stopCmd := func() { stopProcess(cmd) }
	closeConns, err := dialColdSystem(sys, grpcAddr)
	if err != nil {
		stopCmd()
		return nil, fmt.Errorf("upstream's ratelimit (env %q): %w", env, err)
	}
	sys.stop = func() { closeConns(); stopCmd() }
	return sys, nil
}

// dropLines writes to w the lines written to it, less those holding drop.
type dropLines struct {
	w    io.Writer
	drop []byte
	buf  []byte
}

// Write writes p's whole lines that lack drop to w and keeps p's last,
// unfinished line for the next Write.
func (d *dropLines) Write(p []byte) (int, error) {
	d.buf = append(d.buf, p...)
	for {
		i := bytes.IndexByte(d.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := d.buf[:i+1]
		if !bytes.Contains(line, d.drop) {
			if _, err := d.w.Write(line); err != nil {
				return len(p), err
			}
		}
		d.buf = d.buf[i+1:]
	}
}
