package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/envflag"
	"github.com/sluicehq/sluice/internal/natsconn"
)

// runEnvoyRatelimit is "limiter envoy-ratelimit" (also what the binary does
// when it is called ratelimit, as Envoy Gateway's deployment calls
// /bin/ratelimit): envoyproxy/ratelimit's environment, as Envoy Gateway
// sets it, translated into the flags of "limiter serve" (README, "Switch
// Envoy Gateway to Sluice"). Sluice's own settings come from SLUICE_*
// variables, which win over the variable they would be translated from;
// flags after the subcommand win over both.
func runEnvoyRatelimit(ctx context.Context, version string, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	translated, notes, err := envoyRatelimitArgs(getenv)
	if err != nil {
		fmt.Fprintln(stderr, "limiter envoy-ratelimit:", err)
		return 2
	}
	if log, err := natsconn.NewLogger(stderr, logLevel(translated, getenv)); err == nil {
		for _, n := range notes {
			log.Info("envoyproxy/ratelimit setting without effect", "variable", n[0], "why", n[1])
		}
	}
	return runServe(ctx, version, append(translated, args...), stdout, stderr)
}

// logLevel is the level of the limiter's log: --log-level's translated
// value, else SLUICE_LOG_LEVEL's, else info.
func logLevel(args []string, getenv func(string) string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--log-level="); ok {
			return v
		}
	}
	if v := getenv(envflag.Var("log-level")); v != "" {
		return v
	}
	return "info"
}

// envoyRatelimitIgnored are envoyproxy/ratelimit's variables that Sluice
// accepts and that have no effect, and why; a note is logged for each one
// set. The README's table lists them all (TestEnvoyRatelimitVariablesAreDocumented).
var envoyRatelimitIgnored = map[string]string{
	"RUNTIME_IGNOREDOTFILES": "files whose names start with a dot are always skipped",
	"RUNTIME_WATCH_ROOT":     "the configuration directory's files are polled every --rls-reload-interval",
	"LOG_FORMAT":             "Sluice logs text lines (log/slog)",
	"USE_STATSD":             "Sluice emits no statsd; its metrics are Prometheus, on --metrics-addr",
	"STATSD_HOST":            "no statsd",
	"STATSD_PORT":            "no statsd",
	"USE_DOG_STATSD":         "no statsd",
	"EXTRA_TAGS":             "no statsd",
	"STATS_FLUSH_INTERVAL":   "no statsd",
	"DISABLE_STATS":          "no statsd",
	"PROMETHEUS_MAPPER_YAML": "Sluice's metrics have names of their own (sluice_rls_*), not statsd's mapped",
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "Sluice's latency histogram is in seconds",
	"DEBUG_HOST":                    "no debug listener",
	"DEBUG_PORT":                    "no debug listener",
	"GRPC_MAX_CONNECTION_AGE_GRACE": "calls in flight on an aged connection get 10s",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "reconnections follow --rls-xds-backoff-min and --rls-xds-backoff-max",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR":              "each wait is drawn between half and all of its bound",
	"XDS_CLIENT_BACKOFF_JITTER":                     "each wait is drawn between half and all of its bound",
	"LIMIT_LIMIT_HEADER":                            "the response headers are RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset",
	"LIMIT_REMAINING_HEADER":                        "the response headers are RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset",
	"LIMIT_RESET_HEADER":                            "the response headers are RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset",
	"RESPONSE_DYNAMIC_METADATA":                     "responses carry no dynamic metadata",
	"NEAR_LIMIT_RATIO":                              "near-limit metrics use 0.8, upstream's default",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT":       "always so: a request over any limit counts nothing",
	"LOCAL_CACHE_SIZE_IN_BYTES":                     "limiters decide from their own cells and leases",
	"EXPIRATION_JITTER_MAX_SECONDS":                 "Sluice's keys expire with their windows",
	"CACHE_KEY_PREFIX":                              "Sluice's Redis keys start with --redis-prefix (SLUICE_REDIS_PREFIX)",
	"BACKEND_TYPE":                                  "counts are Sluice's: in the limiter, and in the region's Redis with --redis-url",
	"REDIS_SOCKET_TYPE":                             "tcp; unix sockets are refused",
	"REDIS_POOL_SIZE":                               "the Redis client sizes its own pool",
	"REDIS_PIPELINE_WINDOW":                         "Sluice batches its own Redis calls",
	"REDIS_PIPELINE_LIMIT":                          "Sluice batches its own Redis calls",
	"TRACING_ENABLED":                               "no tracing",
	"TRACING_SERVICE_NAME":                          "no tracing",
	"TRACING_SERVICE_NAMESPACE":                     "no tracing",
	"TRACING_SERVICE_INSTANCE_ID":                   "no tracing",
	"TRACING_SAMPLING_RATE":                         "no tracing",
	"TRACING_EXPORTER_PROTOCOL":                     "no tracing",
	"OTEL_EXPORTER_OTLP_ENDPOINT":                   "no tracing",
}

// envoyRatelimitMapped are the variables translated into flags, and
// envoyRatelimitRefused those refused when set as they read (each would
// change what is enforced or who may call, so ignoring it would not do).
var (
	envoyRatelimitMapped = []string{"CONFIG_TYPE", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY",
		"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
		"FORCE_START_WITHOUT_INITIAL_CONFIG", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
		"GRPC_HOST", "GRPC_PORT", "HOST", "PORT", "GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY",
		"GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT", "GRPC_MAX_CONNECTION_AGE", "LOG_LEVEL",
		"USE_PROMETHEUS", "PROMETHEUS_ADDR", "LIMIT_RESPONSE_HEADERS_ENABLED",
		"REDIS_URL", "REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_TLS", "REDIS_AUTH"}
	envoyRatelimitRefused = []string{"GRPC_UDS", "GRPC_CLIENT_TLS_SAN", "PROMETHEUS_PATH", "MERGE_DOMAIN_CONFIG",
		"GLOBAL_SHADOW_MODE", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT",
		"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"}
)

// envoyRatelimitArgs translates envoyproxy/ratelimit's variables, read
// with getenv, into flags of "limiter serve", with upstream's defaults
// where a variable is unset. A flag whose SLUICE_* variable is set is left
// to it. notes are the variables set that have no effect, with why.
func envoyRatelimitArgs(getenv func(string) string) (args []string, notes [][2]string, err error) {
	get := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var bad error
	boolean := func(name string, def bool) bool {
		v := getenv(name)
		if v == "" {
			return def
		}
		b, err := strconv.ParseBool(v)
		if err != nil && bad == nil {
			bad = fmt.Errorf("%s=%q: want true or false", name, v)
		}
		return b
	}
	set := func(flag, value string) {
		if getenv(envflag.Var(flag)) == "" {
			args = append(args, "--"+flag+"="+value)
		}
	}
	// setFrom translates variable name into flag when it is set; unset,
	// the flag keeps Sluice's default.
	setFrom := func(flag, name string) {
		if v := getenv(name); v != "" {
			set(flag, v)
		}
	}
	for _, name := range envoyRatelimitRefused {
		v := getenv(name)
		switch {
		case v == "":
			continue
		case name == "PROMETHEUS_PATH" && v == "/metrics",
			(name == "MERGE_DOMAIN_CONFIG" || name == "GLOBAL_SHADOW_MODE" || name == "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION") && v == "false":
			continue
		case strings.HasPrefix(name, "REDIS_") && getenv(envflag.Var("redis-url")) != "":
			continue // the Redis of SLUICE_REDIS_URL is used instead
		}
		return nil, nil, fmt.Errorf("%s=%q is not supported: %s", name, v, refusedWhy(name))
	}

	level := strings.ToLower(get("LOG_LEVEL", "warn"))
	switch level {
	case "trace":
		level = "debug"
	case "warning":
		level = "warn"
	case "fatal", "panic":
		level = "error"
	}
	set("log-level", level)

	set("rls-listen", net.JoinHostPort(get("GRPC_HOST", "0.0.0.0"), get("GRPC_PORT", "8081")))
	set("rls-health-listen", net.JoinHostPort(get("HOST", "0.0.0.0"), get("PORT", "8080")))
	if boolean("GRPC_SERVER_USE_TLS", false) {
		set("rls-tls-cert", getenv("GRPC_SERVER_TLS_CERT"))
		set("rls-tls-key", getenv("GRPC_SERVER_TLS_KEY"))
		// Upstream reads GRPC_CLIENT_TLS_CACERT; Envoy Gateway sets
		// GRPC_SERVER_TLS_CA_CERT, which upstream does not read. Either
		// makes client certificates required (Envoy Gateway's Envoys
		// present one its CA signed).
		if ca := get("GRPC_CLIENT_TLS_CACERT", getenv("GRPC_SERVER_TLS_CA_CERT")); ca != "" {
			set("rls-tls-client-ca", ca)
		}
	}
	setFrom("rls-max-connection-age", "GRPC_MAX_CONNECTION_AGE")
	if boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
		set("rls-response-headers", "true")
	}
	if boolean("USE_PROMETHEUS", false) {
		set("metrics-addr", get("PROMETHEUS_ADDR", ":9090"))
	}

	xds := false
	switch ct := get("CONFIG_TYPE", "FILE"); ct {
	case "FILE":
		set("rls-config", path.Join(get("RUNTIME_ROOT", "/srv/runtime_data/current"), getenv("RUNTIME_SUBDIRECTORY"),
			get("RUNTIME_APPDIRECTORY", "config")))
	case "GRPC_XDS_SOTW":
		xds = true
		set("rls-xds-server", get("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"))
		set("rls-xds-node-id", get("CONFIG_GRPC_XDS_NODE_ID", "default"))
		setFrom("rls-xds-node-metadata", "CONFIG_GRPC_XDS_NODE_METADATA")
		setFrom("rls-xds-headers", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")
		if boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false) {
			set("rls-xds-tls", "true")
			setFrom("rls-xds-tls-cert", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT")
			setFrom("rls-xds-tls-key", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY")
			setFrom("rls-xds-tls-ca", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
			setFrom("rls-xds-tls-server-name", "CONFIG_GRPC_XDS_SERVER_TLS_SAN")
		}
		setFrom("rls-xds-backoff-min", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
		setFrom("rls-xds-backoff-max", "XDS_CLIENT_BACKOFF_MAX_INTERVAL")
		setFrom("rls-xds-max-message-bytes", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
	default:
		return nil, nil, fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", ct)
	}
	// Upstream's health check waits for a configuration only with
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, or, over xDS, until the
	// first one unless FORCE_START_WITHOUT_INITIAL_CONFIG (Envoy Gateway
	// sets it: its policies may not exist yet).
	if !boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false) && (!xds || boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false)) {
		set("rls-ready-without-domains", "true")
	}

	if u := getenv("REDIS_URL"); u != "" {
		ru, err := redisURL(u, get("REDIS_TYPE", "SINGLE"), boolean("REDIS_TLS", false), getenv("REDIS_AUTH"), get("REDIS_SOCKET_TYPE", "unix"))
		if err != nil && getenv(envflag.Var("redis-url")) == "" {
			return nil, nil, err
		}
		if err == nil {
			set("redis-url", ru)
		}
	}
	if bad != nil {
		return nil, nil, bad
	}
	for name, why := range envoyRatelimitIgnored {
		if getenv(name) != "" {
			notes = append(notes, [2]string{name, why})
		}
	}
	return args, notes, nil
}

func refusedWhy(name string) string {
	switch name {
	case "GRPC_UDS":
		return "the rate limit service listens on TCP (GRPC_HOST, GRPC_PORT)"
	case "GRPC_CLIENT_TLS_SAN":
		return "client certificates are verified by their CA only; refused rather than accept clients upstream would refuse"
	case "PROMETHEUS_PATH":
		return "metrics are served at /metrics"
	case "MERGE_DOMAIN_CONFIG":
		return "a domain defined twice is an error"
	case "GLOBAL_SHADOW_MODE":
		return "shadow mode is per descriptor (shadow_mode) or per override; refused rather than enforce limits meant to be shadowed"
	}
	return "Sluice's Redis URL has no client certificate or hostname settings; set SLUICE_REDIS_URL instead"
}

// redisURL is upstream's Redis settings as a --redis-url: REDIS_URL is
// host:port (REDIS_TYPE CLUSTER: several, comma-separated), REDIS_AUTH is
// a password or user:password.
func redisURL(hosts, typ string, useTLS bool, auth, socket string) (string, error) {
	if socket != "tcp" {
		return "", fmt.Errorf("REDIS_SOCKET_TYPE=%q: only tcp is supported (or set SLUICE_REDIS_URL)", socket)
	}
	u := &url.URL{Scheme: "redis"}
	addrs := strings.Split(hosts, ",")
	switch strings.ToUpper(typ) {
	case "SINGLE":
		if len(addrs) != 1 {
			return "", fmt.Errorf("REDIS_URL=%q: one host:port for REDIS_TYPE SINGLE", hosts)
		}
	case "CLUSTER":
		u.Scheme = "redis+cluster"
		q := url.Values{}
		for _, a := range addrs[1:] {
			q.Add("addr", strings.TrimSpace(a))
		}
		u.RawQuery = q.Encode()
	default:
		return "", fmt.Errorf("REDIS_TYPE=%q: SINGLE or CLUSTER (or set SLUICE_REDIS_URL)", typ)
	}
	if useTLS {
		u.Scheme = strings.Replace(u.Scheme, "redis", "rediss", 1)
	}
	u.Host = strings.TrimSpace(addrs[0])
	if auth != "" {
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			u.User = url.UserPassword(user, pass)
		} else {
			u.User = url.UserPassword("", auth)
		}
	}
	return u.String(), nil
}
