package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/window"
)

// Environment variables that carry a NATS secret itself. They are not
// flags: a command line is visible to every user of the host.
const (
	// PasswordEnv holds the password of --nats-user.
	PasswordEnv = "SLUICE_NATS_PASSWORD"
	// TokenEnv holds an authentication token.
	TokenEnv = "SLUICE_NATS_TOKEN"
)

// Security is how a process authenticates to NATS and secures its
// connection, as the --nats-* flags of every command give it. The zero value
// connects as before: plain TCP, with whatever the URL itself carries.
//
// At most one identity may be given: a credentials file (a user JWT and its
// nkey seed, for servers in operator/JWT mode), an nkey seed file, a user
// with a password (from a file or PasswordEnv), or a token (from a file or
// TokenEnv). TLS combines with any of them.
type Security struct {
	// CredsFile is a NATS credentials file (--nats-creds).
	CredsFile string
	// NkeyFile holds a user nkey seed, "SU...", (--nats-nkey).
	NkeyFile string
	// User is the user name (--nats-user); its password comes from
	// PasswordFile or Password.
	User string
	// PasswordFile holds the password (--nats-password-file).
	PasswordFile string
	// Password is the password itself (from PasswordEnv).
	Password string
	// TokenFile holds a token (--nats-token-file).
	TokenFile string
	// Token is the token itself (from TokenEnv).
	Token string
	// TLSCA is a PEM file of the CAs that sign the servers' certificates
	// (--nats-tls-ca); empty: the host's roots.
	TLSCA string
	// TLSCert and TLSKey are the PEM client certificate and its key
	// (--nats-tls-cert, --nats-tls-key), for servers that verify clients.
	TLSCert, TLSKey string
}

// RegisterFlags adds the --nats-* flags of s to fs.
func (s *Security) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.CredsFile, "nats-creds", "", "NATS credentials file (user JWT and nkey seed) for servers in operator/JWT mode")
	fs.StringVar(&s.NkeyFile, "nats-nkey", "", "file holding a NATS user nkey seed (SU...)")
	fs.StringVar(&s.User, "nats-user", "", "NATS user; the password comes from --nats-password-file or "+PasswordEnv)
	fs.StringVar(&s.PasswordFile, "nats-password-file", "", "file holding the password of --nats-user")
	fs.StringVar(&s.TokenFile, "nats-token-file", "", "file holding a NATS authentication token (or set "+TokenEnv+")")
	fs.StringVar(&s.TLSCA, "nats-tls-ca", "", "PEM file of the CAs that sign the NATS servers' certificates; setting any --nats-tls-* requires TLS")
	fs.StringVar(&s.TLSCert, "nats-tls-cert", "", "PEM client certificate for NATS servers that verify clients (with --nats-tls-key)")
	fs.StringVar(&s.TLSKey, "nats-tls-key", "", "PEM key of --nats-tls-cert")
}

// ServeFlags are the flags the limiter and the bridge take alike: the
// region they serve, the prefix of their subjects, their metrics listener,
// their log level, and how they authenticate to NATS and secure the
// connection (Security). --nats-url is each command's own: its default and
// its meaning differ.
type ServeFlags struct {
	// Region, Prefix, MetricsAddr and LogLevel hold --region,
	// --subject-prefix, --metrics-addr and --log-level as given.
	Region, Prefix, MetricsAddr, LogLevel string
	Security
}

// RegisterFlags adds --region, --subject-prefix, --metrics-addr,
// --log-level and Security's --nats-* flags to fs.
func (f *ServeFlags) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.Region, "region", "", "region name; empty: the connected NATS cluster's name, else \"local\"")
	fs.StringVar(&f.Prefix, "subject-prefix", wire.DefaultPrefix, "prefix of every subject")
	fs.StringVar(&f.MetricsAddr, "metrics-addr", "", "address to serve Prometheus /metrics on; empty: off")
	fs.StringVar(&f.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.Security.RegisterFlags(fs)
}

// Check refuses a --region that is not a subject token and a
// --subject-prefix that is not a prefix, reads Security's secrets from the
// environment, and returns the options that connect to url as Security
// asks and the logger of --log-level on w.
func (f *ServeFlags) Check(url string, w io.Writer) ([]nats.Option, *slog.Logger, error) {
	if f.Region != "" && !wire.ValidToken(f.Region) {
		return nil, nil, fmt.Errorf("--region %q: want %s", f.Region, window.TokenRule)
	}
	if err := wire.CheckPrefix(f.Prefix); err != nil {
		return nil, nil, fmt.Errorf("--subject-prefix: %w", err)
	}
	f.ReadEnv(os.Getenv)
	opts, err := f.Options(url)
	if err != nil {
		return nil, nil, err
	}
	log, err := NewLogger(w, f.LogLevel)
	return opts, log, err
}

// ReadEnv fills the secrets that come only from the environment
// (PasswordEnv, TokenEnv) through getenv, e.g. os.Getenv.
func (s *Security) ReadEnv(getenv func(string) string) {
	s.Password = getenv(PasswordEnv)
	s.Token = getenv(TokenEnv)
}

// Configured reports whether s asks for anything beyond the zero value.
func (s *Security) Configured() bool { return *s != Security{} }

// Options checks s for connecting to url and returns the nats.go options
// that apply it. It reads every file now, so a missing or malformed one is
// an error here, naming its flag, rather than at the first connect. An
// identity given both in url (user:password@ or token@) and in s is refused:
// nats.go would let the URL's win or fail at connect. It changes nothing on
// error.
func (s *Security) Options(url string) ([]nats.Option, error) {
	var opts []nats.Option
	var identities []string
	if s.CredsFile != "" {
		identities = append(identities, "--nats-creds")
		// nats.go reads the file at each connect; read it once now for a
		// clear error.
		if _, err := readSecret("--nats-creds", s.CredsFile); err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserCredentials(s.CredsFile))
	}
	if s.NkeyFile != "" {
		identities = append(identities, "--nats-nkey")
		opt, err := nats.NkeyOptionFromSeed(s.NkeyFile)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey %s: %w", s.NkeyFile, err)
		}
		opts = append(opts, opt)
	}
	password, err := oneSecret("the password", "--nats-password-file", s.PasswordFile, PasswordEnv, s.Password)
	if err != nil {
		return nil, err
	}
	switch {
	case s.User != "" && password == "":
		return nil, fmt.Errorf("--nats-user %s: no password: give --nats-password-file or %s", s.User, PasswordEnv)
	case s.User == "" && password != "":
		return nil, errors.New("a NATS password without --nats-user")
	case s.User != "":
		identities = append(identities, "--nats-user")
		opts = append(opts, nats.UserInfo(s.User, password))
	}
	token, err := oneSecret("the token", "--nats-token-file", s.TokenFile, TokenEnv, s.Token)
	if err != nil {
		return nil, err
	}
	if token != "" {
		identities = append(identities, "a token")
		opts = append(opts, nats.Token(token))
	}
	if len(redact.Secrets(url)) > 0 {
		identities = append(identities, "--nats-url")
	}
	if len(identities) > 1 {
		return nil, fmt.Errorf("NATS credentials given more than once (%s): give one", strings.Join(identities, ", "))
	}
	if s.TLSCA != "" || s.TLSCert != "" || s.TLSKey != "" {
		cfg, err := s.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(cfg))
	}
	return opts, nil
}

// tlsConfig loads the CA pool and the client certificate.
func (s *Security) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.TLSCA != "" {
		pem, err := os.ReadFile(s.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--nats-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--nats-tls-ca %s: no PEM certificate in the file", s.TLSCA)
		}
		cfg.RootCAs = pool
	}
	switch {
	case (s.TLSCert == "") != (s.TLSKey == ""):
		return nil, errors.New("--nats-tls-cert and --nats-tls-key go together: give both or neither")
	case s.TLSCert != "":
		cert, err := tls.LoadX509KeyPair(s.TLSCert, s.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--nats-tls-cert %s, --nats-tls-key %s: %w", s.TLSCert, s.TLSKey, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// oneSecret returns the secret given by file or by env var, refusing both.
func oneSecret(what, flagName, file, envName, value string) (string, error) {
	if file == "" {
		return value, nil
	}
	if value != "" {
		return "", fmt.Errorf("%s given twice, by %s and %s: give one", what, flagName, envName)
	}
	return readSecret(flagName, file)
}

// readSecret returns the content of file without a trailing line end,
// refusing an empty one. Its errors never show the content.
func readSecret(flagName, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return "", fmt.Errorf("%s %s: the file is empty", flagName, file)
	}
	return v, nil
}
