package main

import (
	"cmp"
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
// value, else SLUICE_LOG_LEVEL's, which alone keeps the translation from
// giving one.
func logLevel(args []string, getenv func(string) string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--log-level="); ok {
			return v
		}
	}
	return getenv(envflag.Var("log-level"))
}

// envoyRatelimitIgnored are envoyproxy/ratelimit's variables that Sluice
// accepts and that have no effect, by why; a note is logged for each one
// set. The README's table lists them all (TestEnvoyRatelimitVariablesAreDocumented).
var envoyRatelimitIgnored = []struct {
	why   string
	names []string
}{
	{"files whose names start with a dot are always skipped", []string{"RUNTIME_IGNOREDOTFILES"}},
	{"the configuration directory's files are polled every --rls-reload-interval", []string{"RUNTIME_WATCH_ROOT"}},
	{"Sluice logs text lines (log/slog)", []string{"LOG_FORMAT"}},
	{"Sluice emits no statsd; its metrics are Prometheus, on --metrics-addr", []string{"USE_STATSD"}},
	{"no statsd", []string{"STATSD_HOST", "STATSD_PORT", "USE_DOG_STATSD", "EXTRA_TAGS", "STATS_FLUSH_INTERVAL", "DISABLE_STATS"}},
	{"Sluice's metrics have names of their own (sluice_rls_*), not statsd's mapped", []string{"PROMETHEUS_MAPPER_YAML"}},
	{"Sluice's latency histogram is in seconds", []string{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"}},
	{"no debug listener", []string{"DEBUG_HOST", "DEBUG_PORT"}},
	{"calls in flight on an aged connection get 10s", []string{"GRPC_MAX_CONNECTION_AGE_GRACE"}},
	{"reconnections follow --rls-xds-backoff-min and --rls-xds-backoff-max", []string{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"}},
	{"each wait is drawn between half and all of its bound", []string{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER"}},
	{"the response headers are RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset", []string{"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"}},
	{"responses carry no dynamic metadata", []string{"RESPONSE_DYNAMIC_METADATA"}},
	{"near-limit metrics use 0.8, upstream's default", []string{"NEAR_LIMIT_RATIO"}},
	{"always so: a request over any limit counts nothing", []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"}},
	{"limiters decide from their own cells and leases", []string{"LOCAL_CACHE_SIZE_IN_BYTES"}},
	{"Sluice's keys expire with their windows", []string{"EXPIRATION_JITTER_MAX_SECONDS"}},
	{"Sluice's Redis keys start with --redis-prefix (SLUICE_REDIS_PREFIX)", []string{"CACHE_KEY_PREFIX"}},
	{"counts are Sluice's: in the limiter, and in the region's Redis with --redis-url", []string{"BACKEND_TYPE"}},
	{"tcp; unix sockets are refused", []string{"REDIS_SOCKET_TYPE"}},
	{"the Redis client sizes its own pool", []string{"REDIS_POOL_SIZE"}},
	{"Sluice batches its own Redis calls", []string{"REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT"}},
	{"no tracing", []string{"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID", "TRACING_SAMPLING_RATE", "TRACING_EXPORTER_PROTOCOL", "OTEL_EXPORTER_OTLP_ENDPOINT"}},
}

// envoyRatelimitRefused are the variables refused when set, in the order
// they are checked, and why: each would change what is enforced or who may
// call, so ignoring it would not do. One set to its harmless value (ok,
// when there is one) passes, and so do the Redis ones when SLUICE_REDIS_URL
// replaces upstream's Redis.
var envoyRatelimitRefused = []struct{ name, ok, why string }{
	{"GRPC_UDS", "", "the rate limit service listens on TCP (GRPC_HOST, GRPC_PORT)"},
	{"GRPC_CLIENT_TLS_SAN", "", "client certificates are verified by their CA only; refused rather than accept clients upstream would refuse"},
	{"PROMETHEUS_PATH", "/metrics", "metrics are served at /metrics"},
	{"MERGE_DOMAIN_CONFIG", "false", "a domain defined twice is an error"},
	{"GLOBAL_SHADOW_MODE", "false", "shadow mode is per descriptor (shadow_mode) or per override; refused rather than enforce limits meant to be shadowed"},
	{"REDIS_TLS_CLIENT_CERT", "", redisRefusal},
	{"REDIS_TLS_CLIENT_KEY", "", redisRefusal},
	{"REDIS_TLS_CACERT", "", redisRefusal},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", redisRefusal},
}

const redisRefusal = "Sluice's Redis URL has no client certificate or hostname settings; set SLUICE_REDIS_URL instead"

// envoyRatelimitArgs translates envoyproxy/ratelimit's variables, read
// with getenv, into flags of "limiter serve", with upstream's defaults
// where a variable is unset. A flag whose SLUICE_* variable is set is left
// to it. notes are the variables set that have no effect, with why.
func envoyRatelimitArgs(getenv func(string) string) (args []string, notes [][2]string, err error) {
	get := func(name, def string) string { return cmp.Or(getenv(name), def) }
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
	for _, r := range envoyRatelimitRefused {
		v := getenv(r.name)
		if v != "" && v != r.ok && (r.why != redisRefusal || getenv(envflag.Var("redis-url")) == "") {
			return nil, nil, fmt.Errorf("%s=%q is not supported: %s", r.name, v, r.why)
		}
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
	for _, ig := range envoyRatelimitIgnored {
		for _, name := range ig.names {
			if getenv(name) != "" {
				notes = append(notes, [2]string{name, ig.why})
			}
		}
	}
	return args, notes, nil
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
