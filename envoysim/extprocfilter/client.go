package extprocfilter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Client is one configured ext_proc filter and its gRPC channel, the
// counterpart of an Envoy filter plus its cluster. It is safe for concurrent
// use; each HTTP request gets its own Exchange.
type Client struct {
	cfg      FilterConfig
	conn     *grpc.ClientConn // the channel NewClient owns, nil otherwise
	ownsConn bool
	// start chooses the channel a new stream goes over, as Envoy's gRPC
	// async client asks its cluster's load balancer for a host when a
	// stream starts. An error is a start that fails at once (no cluster,
	// or no healthy host): see Exchange.
	start func() (*grpc.ClientConn, error)
}

// NewClient checks cfg the way Envoy checks a filter config and prepares the
// channel. It does not connect: a server that is down shows up as a stream
// error when an exchange opens, as in Envoy.
func NewClient(cfg FilterConfig) (*Client, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	conn, err := Dial(cfg.Target, cfg.TLS, cfg.ClientCert)
	if err != nil {
		return nil, fmt.Errorf("ext_proc filter %q: %w", cfg.Name, err)
	}
	return &Client{cfg: cfg, conn: conn, ownsConn: true, start: fixedConn(conn)}, nil
}

// NewClientConn is NewClient over a channel the caller owns and may share
// between filters (as Envoy shares a cluster's connections); Close leaves it
// open. cfg.Target, cfg.TLS and cfg.ClientCert only label the filter.
func NewClientConn(cfg FilterConfig, conn *grpc.ClientConn) (*Client, error) {
	if cfg.Target == "" {
		cfg.Target = conn.Target()
	}
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	return &Client{cfg: cfg, start: fixedConn(conn)}, nil
}

// NewClientStarting is NewClient whose streams go over the channel start
// returns when each stream starts; cfg.Target, cfg.TLS and cfg.ClientCert
// only label the filter. An error from start fails that stream's start at
// once, before any of the request reaches the filter, as Envoy's stream
// start fails synchronously when the filter's cluster is missing or has no
// healthy host (source/common/grpc/async_client_impl.cc
// AsyncStreamImpl::initialize: the HTTP async stream is reset before
// start returns). failure_mode_allow then always lets the request through.
func NewClientStarting(cfg FilterConfig, start func() (*grpc.ClientConn, error)) (*Client, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	return &Client{cfg: cfg, start: start}, nil
}

func fixedConn(conn *grpc.ClientConn) func() (*grpc.ClientConn, error) {
	return func() (*grpc.ClientConn, error) { return conn, nil }
}

// Dial prepares a gRPC channel to an ext_proc server the way an Envoy
// cluster of HTTP/2 connections behaves. It does not connect: a server that
// is down shows up as a stream error when an exchange opens. useTLS dials
// with TLSConfig(cert): cert (nil for none) is the client certificate
// presented in the handshake, as an Envoy cluster's
// common_tls_context.tls_certificates. A certificate without TLS is an
// error: there is no handshake to present it in.
func Dial(target string, useTLS bool, cert *tls.Certificate, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	switch {
	case useTLS:
		creds = credentials.NewTLS(TLSConfig(cert))
	case cert != nil:
		return nil, errors.New("a client certificate needs TLS")
	}
	return grpc.NewClient(target, append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Envoy's HTTP/2 defaults (initial_stream_window_size and
		// initial_connection_window_size, 256 MiB): the proxy never makes
		// the server wait for window updates. grpc-go's 64 KiB would let a
		// few large bodies on the shared connection hold up every other
		// stream's messages.
		grpc.WithInitialWindowSize(envoyWindow),
		grpc.WithInitialConnWindowSize(envoyWindow),
		// Short reconnect backoff so a server started after the proxy is used
		// within a second, not after grpc's default of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
	}, opts...)...)
}

// SocketOptions are what a cluster sets on its upstream sockets.
type SocketOptions struct {
	// Keepalive is the kernel's TCP keepalive; Enable false is none.
	Keepalive net.KeepAliveConfig
	// UserTimeout is TCP_USER_TIMEOUT: how long sent data may stay
	// unacknowledged before the kernel closes the connection; 0 leaves
	// the system's (none).
	UserTimeout time.Duration
}

// WithSocketOptions dials with o. Keepalive stays off unless o turns it on
// (Go would otherwise probe every 15 s; Envoy leaves it off unless a
// cluster's upstream_connection_options.tcp_keepalive asks for it).
func WithSocketOptions(o SocketOptions) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{KeepAliveConfig: o.Keepalive}
		if !o.Keepalive.Enable {
			d.KeepAlive = -1
		}
		if ms := o.UserTimeout.Milliseconds(); ms > 0 {
			d.Control = func(_, _ string, c syscall.RawConn) error {
				var serr error
				if err := c.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(ms))
				}); err != nil {
					return err
				}
				return serr
			}
		}
		return d.DialContext(ctx, "tcp", addr)
	})
}

// tcpUserTimeout is Linux's TCP_USER_TIMEOUT option name.
const tcpUserTimeout = 0x12

// TLSConfig is the TLS of an Envoy cluster whose UpstreamTlsContext has an
// empty validation context: any server certificate is accepted, since
// endpoint pickers serve self-signed certificates by default and gateways
// skip verification for them (e.g. Istio's DestinationRule
// insecureSkipVerify, agentgateway's INSECURE_ALL). cert, when not nil, is
// presented whenever the server asks for a client certificate (a processor
// run with --client-ca-file requires one), whatever CAs the server names,
// as Envoy presents its configured certificate.
func TLSConfig(cert *tls.Certificate) *tls.Config {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // see above
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return cfg
}

// envoyWindow is Envoy's default HTTP/2 flow-control window.
const envoyWindow = 256 << 20

// Config returns the filter configuration with defaults filled in.
func (c *Client) Config() FilterConfig { return c.cfg }

// Close closes the gRPC channel, unless the caller owns it (NewClientConn).
func (c *Client) Close() error {
	if !c.ownsConn {
		return nil
	}
	return c.conn.Close()
}

// Open starts the exchange for one HTTP request. ctx bounds the whole
// exchange, including reads of the bodies handed to it; the gRPC stream is
// opened when the first message is sent. Always Close the exchange.
func (c *Client) Open(ctx context.Context) *Exchange { return newExchange(ctx, c) }

// Run processes one request path on its own stream and closes it.
func (c *Client) Run(ctx context.Context, req Request) (*Result, error) {
	ex := c.Open(ctx)
	defer ex.Close()
	return ex.RunRequest(req)
}
