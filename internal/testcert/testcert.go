// Package testcert makes certificates for tests that speak TLS on
// loopback: a certificate authority per test and the server or client
// certificates it signs.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial atomic.Int64
	// PEM is the CA certificate, for a CA file; Pool trusts it.
	PEM  []byte
	Pool *x509.CertPool
}

// NewCA makes a CA valid for the next hour.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.serial.Store(1)
	return ca
}

// Server issues a server certificate for 127.0.0.1.
func (ca *CA) Server(t testing.TB) tls.Certificate {
	t.Helper()
	return ca.issue(t, "127.0.0.1", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
}

// Client issues a client certificate named name.
func (ca *CA) Client(t testing.TB, name string) tls.Certificate {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageClientAuth)
}

// ClientPEM issues a client certificate named name as PEM files' contents:
// the certificate and its PKCS #8 key.
func (ca *CA) ClientPEM(t testing.TB, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	c := ca.Client(t, name)
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})
}

func (ca *CA) issue(t testing.TB, name string, usage x509.ExtKeyUsage, ips ...net.IP) tls.Certificate {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}
