package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// adsStream is the sending side of one ADS stream. Requests are queued by
// type URL and built only when sent, so that a request always carries the
// type's latest names, version and nonce (as Envoy's GrpcMux does) and a
// burst of Subscribe calls collapses into one request.
type adsStream struct {
	grpc discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	wake chan struct{} // capacity 1: "the queue may have work"

	// Guarded by Client.mu.
	pending []string // type URLs awaiting a request, in order, no duplicates
	// nack holds the error_detail for a type's next request.
	nack map[string]*statuspb.Status
	// announced marks types with a request sent on this stream; only their
	// responses are handled, and only they may send empty resource_names.
	announced map[string]bool
	nodeSent  bool
	// holding is set while a response is being applied, so that the
	// subscriptions its handler changes leave in one burst with the ACK.
	holding bool
}

func newADSStream(g discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) *adsStream {
	return &adsStream{
		grpc:      g,
		wake:      make(chan struct{}, 1),
		nack:      map[string]*statuspb.Status{},
		announced: map[string]bool{},
	}
}

// enqueue queues a request for typeURL. Callers hold Client.mu.
func (s *adsStream) enqueue(typeURL string) {
	if !slices.Contains(s.pending, typeURL) {
		s.pending = append(s.pending, typeURL)
	}
	if !s.holding {
		s.signal()
	}
}

func (s *adsStream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

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
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)

	delay := c.cfg.BackoffInitial
	for {
		received, err := c.runStream(ctx, ads)
		if ctx.Err() != nil {
			return nil
		}
		if received {
			// As Envoy does: a stream that delivered something proves the
			// server healthy, so the next failure starts the backoff afresh.
			delay = c.cfg.BackoffInitial
		}
		wait := jitter(delay)
		c.log.Info("ADS stream ended, reconnecting", "error", err.Error(), "after", wait)
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
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(creds),
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
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("xdsclient: channel to %s: %w", c.cfg.Server, err)
	}
	return conn, nil
}

// runStream runs one ADS stream until it fails or ctx ends. received
// reports whether any response arrived.
func (c *Client) runStream(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) (received bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, err := ads.StreamAggregatedResources(sctx)
	if err != nil {
		return false, fmt.Errorf("open ADS stream: %w", err)
	}
	s := newADSStream(g)
	c.attach(s)
	defer c.detach(s)
	c.log.Info("ADS stream open")

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

// sendLoop is the stream's only sender.
func (c *Client) sendLoop(ctx context.Context, s *adsStream) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.wake:
		}
		for {
			req := c.nextRequest(s)
			if req == nil {
				break
			}
			c.log.V(1).Info("send DiscoveryRequest", "typeURL", req.GetTypeUrl(),
				"version", req.GetVersionInfo(), "nonce", req.GetResponseNonce(),
				"names", req.GetResourceNames(), "nack", req.GetErrorDetail().GetMessage())
			if err := s.grpc.Send(req); err != nil {
				return fmt.Errorf("send %s request: %w", req.GetTypeUrl(), err)
			}
		}
	}
}

// nextRequest pops the next queued type and builds its request from the
// current state, or returns nil when nothing can be sent now.
func (c *Client) nextRequest(s *adsStream) *discoveryv3.DiscoveryRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	for !s.holding && len(s.pending) > 0 {
		t := s.pending[0]
		s.pending = s.pending[1:]
		sub := c.subs[t]
		if !sub.wildcard && len(sub.names) == 0 && !s.announced[t] {
			// Nothing wanted yet, and a first empty request would read as
			// wildcard on servers that keep the legacy rule.
			continue
		}
		req := &discoveryv3.DiscoveryRequest{
			TypeUrl: t,
			// version_info: the last version this node accepted; also what
			// a NACK carries, since a rejected version is never adopted.
			VersionInfo: sub.version,
			// response_nonce ties the request to the response it answers;
			// servers ignore requests with a stale nonce.
			ResponseNonce: sub.nonce,
			ResourceNames: slices.Clone(sub.names),
			ErrorDetail:   s.nack[t],
		}
		delete(s.nack, t)
		if !s.nodeSent {
			// Node on the first request of a stream only, as Envoy does
			// unless set_node_on_first_message_only is false.
			req.Node = c.node
			s.nodeSent = true
		}
		s.announced[t] = true
		return req
	}
	return nil
}

// handle applies one response and queues its ACK or NACK. It runs on the
// receiving goroutine, so responses are applied one at a time, in order.
func (c *Client) handle(ctx, streamCtx context.Context, s *adsStream, resp *discoveryv3.DiscoveryResponse) {
	t, version, nonce := resp.GetTypeUrl(), resp.GetVersionInfo(), resp.GetNonce()
	log := c.log.WithValues("typeURL", t, "version", version, "nonce", nonce)
	log.V(1).Info("received DiscoveryResponse", "resources", len(resp.GetResources()))

	c.mu.Lock()
	sub := c.subs[t]
	if sub == nil || !s.announced[t] {
		c.mu.Unlock()
		// Envoy ignores (with a warning) responses it did not ask for:
		// neither ACK nor NACK, the server's view of that type is not ours.
		log.Info("ignoring DiscoveryResponse for a type not subscribed")
		return
	}
	s.holding = true
	c.mu.Unlock()

	resources, heartbeats, err := decodeResources(t, resp.GetResources())
	switch {
	case err != nil:
	case heartbeats > 0 && len(resources) == 0:
		// TTL refresh only: the resources stay as they are.
		log.V(1).Info("heartbeat", "resources", heartbeats)
	default:
		err = c.handler.Apply(ctx, t, version, resources)
	}

	c.mu.Lock()
	var pace time.Duration
	kept := sub.version
	sub.nonce = nonce
	if err == nil {
		sub.version, sub.lastError, sub.repeats = version, "", 0
		sub.acks++
		delete(s.nack, t)
	} else {
		if sub.lastError != "" && sub.rejectedVersion == version {
			sub.repeats++
			pace = min(c.cfg.BackoffInitial<<min(sub.repeats-1, 30), c.cfg.BackoffMax)
		} else {
			sub.repeats = 0
		}
		sub.lastError, sub.rejectedVersion = err.Error(), version
		sub.nacks++
		// google.rpc.Status code 3 is INVALID_ARGUMENT, what Envoy reports
		// for a config it rejects.
		s.nack[t] = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
	}
	c.notifyLocked()
	c.mu.Unlock()

	if err != nil {
		log.Info("NACK", "error", err.Error(), "keptVersion", kept, "delay", pace)
	}
	if pace > 0 {
		timer := time.NewTimer(pace)
		select {
		case <-timer.C:
		case <-streamCtx.Done():
			timer.Stop()
		}
	}

	c.mu.Lock()
	s.holding = false
	s.enqueue(t)
	s.signal() // requests queued while holding
	c.mu.Unlock()
}
