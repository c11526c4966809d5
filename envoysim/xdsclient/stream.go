package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Run connects to the ADS server and keeps a stream up until ctx ends,
// reconnecting with jittered exponential backoff. It returns nil when ctx
// ends, and an error only when the channel cannot be set up at all or Run
// is already running.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("xdsclient: Run is already running")
	}
	defer c.running.Store(false)

	conn, err := c.dial()
	if err != nil {
		return err
	}
	defer conn.Close() //nolint:errcheck // nothing to do about a close error on the way out
	open := c.opener(conn)

	delay := c.cfg.BackoffInitial
	for {
		received, err := c.runStream(ctx, open)
		if ctx.Err() != nil {
			return nil
		}
		if received {
			// As Envoy does: a stream that delivered something proves the
			// server healthy, so the next failure starts the backoff afresh.
			delay = c.cfg.BackoffInitial
		}
		wait := jitter(delay)
		c.log.Info(string(c.cfg.Service)+" stream ended, reconnecting", "error", err.Error(), "after", wait)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		delay = min(2*delay, c.cfg.BackoffMax)
	}
}

// jitter spreads reconnects over [d/2, d) so that many proxies restarted
// together do not hit the control plane in lockstep.
func jitter(d time.Duration) time.Duration {
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(half)
}

func (c *Client) dial() (*grpc.ClientConn, error) {
	target := c.cfg.Server
	if !strings.Contains(target, ":///") {
		// grpc.NewClient defaults to the dns resolver; an Envoy cluster
		// address is a plain host:port.
		target = "passthrough:///" + target
	}
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		creds = credentials.NewTLS(c.cfg.TLS)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.cfg.Token != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(c.cfg.Token)))
	}
	conn, err := grpc.NewClient(target, append(opts,
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseBytes)),
		// Keep grpc's own reconnect backoff within ours; its default
		// (1s growing to 120s) would dominate after a control plane restart.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  c.cfg.BackoffInitial,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   c.cfg.BackoffMax,
			},
			MinConnectTimeout: 5 * time.Second,
		}))...,
	)
	if err != nil {
		return nil, fmt.Errorf("xdsclient: channel to %s: %w", c.cfg.Server, err)
	}
	return conn, nil
}

// bearer sends Config.Token's token as the authorization header.
type bearer func(ctx context.Context) (string, error)

func (b bearer) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	tok, err := b(ctx)
	if err != nil {
		return nil, fmt.Errorf("xdsclient: token: %w", err)
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// discoveryStream is the client side of a state-of-the-world stream, ADS
// or single-type: the same messages either way.
type discoveryStream interface {
	Send(*discoveryv3.DiscoveryRequest) error
	Recv() (*discoveryv3.DiscoveryResponse, error)
}

// opener opens streams of the configured service on conn.
func (c *Client) opener(conn *grpc.ClientConn) func(context.Context) (discoveryStream, error) {
	if c.cfg.Service == EndpointService {
		eds := endpointv3.NewEndpointDiscoveryServiceClient(conn)
		return func(ctx context.Context) (discoveryStream, error) { return eds.StreamEndpoints(ctx) }
	}
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	return func(ctx context.Context) (discoveryStream, error) { return ads.StreamAggregatedResources(ctx) }
}

// runStream runs one ADS stream until it fails or ctx ends. received
// reports whether any response arrived.
func (c *Client) runStream(ctx context.Context, open func(context.Context) (discoveryStream, error)) (received bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, err := open(sctx)
	if err != nil {
		return false, fmt.Errorf("open %s stream: %w", c.cfg.Service, err)
	}
	s := newADSStream(g)
	c.attach(s)
	defer c.detach(s)
	c.log.Info(string(c.cfg.Service) + " stream open")

	sendDone := make(chan error, 1)
	go func() {
		err := c.sendLoop(sctx, s)
		cancel() // unblocks Recv when the send side failed
		sendDone <- err
	}()

	var recvErr error
	for {
		resp, err := g.Recv()
		if err != nil {
			recvErr = fmt.Errorf("receive: %w", err)
			break
		}
		received = true
		c.handle(ctx, sctx, s, resp)
	}
	cancel()
	if sendErr := <-sendDone; sendErr != nil && !errors.Is(sendErr, context.Canceled) {
		return received, sendErr
	}
	return received, recvErr
}

// attach makes s the current stream and queues every subscription: a new
// stream knows nothing, so each type is requested again with its last ACKed
// version_info and no response_nonce.
func (c *Client) attach(s *adsStream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stream = s
	for _, t := range c.order {
		c.subs[t].nonce = ""
		s.enqueue(t)
	}
}

func (c *Client) detach(s *adsStream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stream == s {
		c.stream = nil
	}
}
