package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"os"
	"time"
)

// TLSOptions selects how the ext_proc listener is secured. Gateways that call
// an endpoint picker expect TLS and skip verification by default, so a
// self-signed certificate made at start-up is the default.
type TLSOptions struct {
	// Enabled turns TLS on; false serves plain text.
	Enabled bool
	// CertFile and KeyFile, when both set, are used instead of a
	// self-signed certificate.
	CertFile, KeyFile string
	// ClientCAFile, when set, turns on mutual TLS: a client must present
	// a certificate one of these PEM CAs signed, or its handshake fails.
	// Without it any client that reaches the port may call the processor,
	// so a NetworkPolicy is then the only fence.
	ClientCAFile string
}

func (o TLSOptions) config() (*tls.Config, error) {
	if !o.Enabled {
		if o.ClientCAFile != "" {
			return nil, fmt.Errorf("tls: a client CA file (%s) needs TLS on", o.ClientCAFile)
		}
		return nil, nil
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, fmt.Errorf("tls: cert file and key file must be given together (cert %q, key %q)", o.CertFile, o.KeyFile)
	}
	var cert tls.Certificate
	var err error
	if o.CertFile != "" {
		cert, err = tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: load %s / %s: %w", o.CertFile, o.KeyFile, err)
		}
	} else if cert, err = selfSigned(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if o.ClientCAFile != "" {
		pem, err := os.ReadFile(o.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: client CA %s: no PEM certificate in it", o.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// selfSigned makes a one-year ECDSA P-256 certificate.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls: generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"infergate"}, CommonName: "infergate-extproc"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls: create certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
