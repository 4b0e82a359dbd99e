package natsconn

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	server "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/sluicehq/sluice/internal/natstest"
)

// startServer runs an embedded nats-server configured by opts for the
// test and returns its client URL.
func startServer(t *testing.T, opts *server.Options) string {
	t.Helper()
	return natstest.StartSecuredServer(t, opts).ClientURL()
}

// writeFile writes content to a new file in dir and returns its path.
func writeFile(t *testing.T, dir, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// connectWith applies sec and connects to url; it returns the connection
// error, with the connection closed at t.Cleanup when there is one.
func connectWith(t *testing.T, url string, sec Security) error {
	t.Helper()
	opts, err := sec.Options(url)
	if err != nil {
		t.Fatalf("Options: %v", err)
	}
	c, err := Connect(url, "test", slog.New(slog.DiscardHandler), append(opts, nats.MaxReconnects(0))...)
	if err != nil {
		return err
	}
	t.Cleanup(c.Close)
	// A round trip proves the server let the client in, not just the dial.
	if err := c.Flush(); err != nil {
		t.Fatalf("flush on an authenticated connection: %v", err)
	}
	return nil
}

// wantRefused checks that err is the server's refusal of the credentials,
// said clearly, without the secret.
func wantRefused(t *testing.T, err error, secret string) {
	t.Helper()
	if err == nil {
		t.Fatal("connected with a wrong credential")
	}
	if !strings.Contains(err.Error(), "refused the credentials") {
		t.Errorf("error %q does not say the credentials were refused", err)
	}
	if secret != "" && strings.Contains(err.Error(), secret) {
		t.Errorf("error %q shows the secret", err)
	}
}

func TestUserAndPasswordFromAFileOrTheEnvironment(t *testing.T) {
	url := startServer(t, &server.Options{Username: "sluice", Password: "pw-s3cret"})
	dir := t.TempDir()
	file := writeFile(t, dir, "pw", []byte("pw-s3cret\n"))
	if err := connectWith(t, url, Security{User: "sluice", PasswordFile: file}); err != nil {
		t.Fatalf("password from a file: %v", err)
	}
	var env Security
	env.User = "sluice"
	env.ReadEnv(func(k string) string { return map[string]string{PasswordEnv: "pw-s3cret"}[k] })
	if err := connectWith(t, url, env); err != nil {
		t.Fatalf("password from %s: %v", PasswordEnv, err)
	}
	wrong := writeFile(t, dir, "wrong", []byte("not-the-pw"))
	wantRefused(t, connectWith(t, url, Security{User: "sluice", PasswordFile: wrong}), "not-the-pw")
	wantRefused(t, connectWith(t, url, Security{}), "")
}

func TestTokenFromAFileOrTheEnvironment(t *testing.T) {
	url := startServer(t, &server.Options{Authorization: "t0ken-s3cret"})
	dir := t.TempDir()
	if err := connectWith(t, url, Security{TokenFile: writeFile(t, dir, "tok", []byte("t0ken-s3cret\n"))}); err != nil {
		t.Fatalf("token from a file: %v", err)
	}
	if err := connectWith(t, url, Security{Token: "t0ken-s3cret"}); err != nil {
		t.Fatalf("token from %s: %v", TokenEnv, err)
	}
	wantRefused(t, connectWith(t, url, Security{Token: "t0ken-wrong"}), "t0ken-wrong")
}

func TestNkeySeedFile(t *testing.T) {
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	url := startServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	dir := t.TempDir()
	if err := connectWith(t, url, Security{NkeyFile: writeFile(t, dir, "user.nk", seed)}); err != nil {
		t.Fatalf("nkey seed file: %v", err)
	}
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	wantRefused(t, connectWith(t, url, Security{NkeyFile: writeFile(t, dir, "other.nk", otherSeed)}), string(otherSeed))
}

// A decentralized set-up as nsc makes it: an operator signs an account, the
// account signs a user; the server trusts only the operator and resolves
// accounts from memory; the client holds a credentials file.
func TestCredentialsFileAgainstAnOperatorAndAccount(t *testing.T) {
	operator, _ := nkeys.CreateOperator()
	opPub, _ := operator.PublicKey()
	opClaims := jwt.NewOperatorClaims(opPub)
	opClaims.Name = "sluice-test"
	opJWT, err := opClaims.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	opDecoded, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}
	account, _ := nkeys.CreateAccount()
	accPub, _ := account.PublicKey()
	accJWT, err := jwt.NewAccountClaims(accPub).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	if err := resolver.Store(accPub, accJWT); err != nil {
		t.Fatal(err)
	}
	url := startServer(t, &server.Options{TrustedOperators: []*jwt.OperatorClaims{opDecoded}, AccountResolver: resolver})

	creds := func(signer nkeys.KeyPair) []byte {
		user, _ := nkeys.CreateUser()
		userPub, _ := user.PublicKey()
		uc := jwt.NewUserClaims(userPub)
		uc.IssuerAccount = accPub
		userJWT, err := uc.Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := user.Seed()
		b, err := jwt.FormatUserConfig(userJWT, seed)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dir := t.TempDir()
	if err := connectWith(t, url, Security{CredsFile: writeFile(t, dir, "user.creds", creds(account))}); err != nil {
		t.Fatalf("credentials file: %v", err)
	}
	// A user signed by an account the operator never signed.
	stranger, _ := nkeys.CreateAccount()
	wantRefused(t, connectWith(t, url, Security{CredsFile: writeFile(t, dir, "stranger.creds", creds(stranger))}), "")
}

func TestTLSWithACAAndAClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, dir, "ca")
	serverCert, serverKey := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	tlsCfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: serverCert, KeyFile: serverKey, CaFile: ca.certFile, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	url := startServer(t, &server.Options{TLSConfig: tlsCfg, TLSVerify: true, TLSTimeout: 2})

	if err := connectWith(t, url, Security{TLSCA: ca.certFile, TLSCert: clientCert, TLSKey: clientKey}); err != nil {
		t.Fatalf("TLS with CA and client certificate: %v", err)
	}
	// No client certificate: the server, which verifies clients, refuses.
	if err := connectWith(t, url, Security{TLSCA: ca.certFile}); err == nil {
		t.Fatal("connected without the client certificate the server requires")
	}
	// A server certificate from a CA the client does not trust.
	other := newCA(t, dir, "other")
	err = connectWith(t, url, Security{TLSCA: other.certFile, TLSCert: clientCert, TLSKey: clientKey})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted server certificate: %v, want an error about the certificate", err)
	}
}

func TestSecurityOptionsRefuseBadInputSayingWhich(t *testing.T) {
	dir := t.TempDir()
	pw := writeFile(t, dir, "pw", []byte("pw"))
	empty := writeFile(t, dir, "empty", []byte("\n"))
	notPEM := writeFile(t, dir, "ca.pem", []byte("not a certificate"))
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct {
		name string
		sec  Security
		url  string
		want string
	}{
		{"two identities", Security{User: "u", PasswordFile: pw, Token: "t"}, "", "more than once"},
		{"a token in the URL and a user", Security{User: "u", PasswordFile: pw}, "nats://tok@h:4222", "--nats-url"},
		{"a password in the URL and a creds file", Security{CredsFile: pw}, "nats://h1:4222,nats://u:p@h2:4222", "--nats-url"},
		{"user without password", Security{User: "u"}, "", "no password"},
		{"password without user", Security{PasswordFile: pw}, "", "without --nats-user"},
		{"password from file and env", Security{User: "u", PasswordFile: pw, Password: "p"}, "", "given twice"},
		{"missing creds file", Security{CredsFile: missing}, "", "--nats-creds"},
		{"missing nkey file", Security{NkeyFile: missing}, "", "--nats-nkey"},
		{"empty token file", Security{TokenFile: empty}, "", "empty"},
		{"cert without key", Security{TLSCert: pw}, "", "go together"},
		{"CA without a certificate", Security{TLSCA: notPEM}, "", "no PEM certificate"},
		{"missing CA", Security{TLSCA: missing}, "", "--nats-tls-ca"},
		{"bad key pair", Security{TLSCert: pw, TLSKey: pw}, "", "--nats-tls-cert"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.sec.Options(c.url)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Options() = %v, want an error saying %q", err, c.want)
			}
		})
	}
	if opts, err := (&Security{}).Options("nats://u:p@h:4222"); err != nil || len(opts) != 0 {
		t.Fatalf("zero Security with credentials in the URL: %d options, %v; want none", len(opts), err)
	}
}

// testCA is a certificate authority made for one test.
type testCA struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	certFile string
}

// newCA makes a self-signed CA and writes its certificate to dir/name.pem.
func newCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	file := writeFile(t, dir, name+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return &testCA{cert: cert, key: key, certFile: file}
}

// issue makes a certificate for 127.0.0.1 with the given use, signed by ca,
// and returns the files of the certificate and its key.
func (ca *testCA) issue(t *testing.T, dir, name string, use x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{use},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = writeFile(t, dir, name+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	keyFile = writeFile(t, dir, name+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}
