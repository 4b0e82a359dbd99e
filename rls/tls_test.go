package rls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/service"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate for name signed by ca, as PEM certificate and key.
func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		KeyUsage: x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".new", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// Rotated certificate files apply to the next connection without a
// restart: the server's certificate, and the CA client certificates must
// be signed by; unreadable files keep the previous ones.
func TestTLSFilesRotateWithoutARestart(t *testing.T) {
	dir := t.TempDir()
	ca1, ca2 := newTestCA(t, "ca1"), newTestCA(t, "ca2")
	f := TLSFiles{Cert: filepath.Join(dir, "s.pem"), Key: filepath.Join(dir, "s-key.pem"), ClientCA: filepath.Join(dir, "ca.pem")}
	c, k := ca1.issue(t, "server-1", x509.ExtKeyUsageServerAuth)
	replaceFile(t, f.Cert, c)
	replaceFile(t, f.Key, k)
	replaceFile(t, f.ClientCA, ca1.pem)
	tc, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{})
	defer svc.Close(context.Background())
	srv, err := NewServer(ServerConfig{Service: svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPC(srv, tc, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	defer g.Stop(context.Background())

	roots := x509.NewCertPool()
	roots.AddCert(ca1.cert)
	roots.AddCert(ca2.cert)
	client := func(ca *testCA, name string) tls.Certificate {
		c, k := ca.issue(t, name, x509.ExtKeyUsageClientAuth)
		cert, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return cert
	}
	c1, c2 := client(ca1, "client-1"), client(ca2, "client-2")
	// served returns the server certificate's name, or the handshake's error.
	served := func(cert tls.Certificate) (string, error) {
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
		if err != nil {
			return "", err
		}
		defer conn.Close()
		// TLS 1.3 reports a refused client certificate at the first read.
		_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 1)); err != nil && !os.IsTimeout(err) {
			return "", err
		}
		if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
			t.Fatalf("ALPN %q, want h2", p)
		}
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
	}
	if name, err := served(c1); name != "server-1" || err != nil {
		t.Fatalf("before rotation: %q %v", name, err)
	}
	if _, err := served(c2); err == nil {
		t.Fatal("a client of another CA was served")
	}
	c, k = ca2.issue(t, "server-2", x509.ExtKeyUsageServerAuth)
	replaceFile(t, f.Cert, c)
	replaceFile(t, f.Key, k)
	replaceFile(t, f.ClientCA, ca2.pem)
	if name, err := served(c2); name != "server-2" || err != nil {
		t.Fatalf("after rotation: %q %v", name, err)
	}
	if _, err := served(c1); err == nil {
		t.Fatal("a client of the old CA was served after rotation")
	}
	replaceFile(t, f.Cert, []byte("half written"))
	if name, err := served(c2); name != "server-2" || err != nil {
		t.Fatalf("with an unreadable certificate file: %q %v, want the previous files kept", name, err)
	}
}
