package xdsclient

import (
	"context"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
)

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
	// Every later request of this type, ACK, NACK or subscription change,
	// answers this response: DiscoveryRequest.response_nonce =
	// DiscoveryResponse.nonce.
	sub.nonce = nonce
	if err == nil {
		// ACK: DiscoveryRequest.version_info = DiscoveryResponse.version_info.
		sub.version, sub.lastError, sub.repeats = version, "", 0
		sub.acks++
		delete(s.nack, t)
	} else {
		// NACK: version_info stays the last accepted one and
		// DiscoveryRequest.error_detail says why, as google.rpc.Status
		// code 3 (INVALID_ARGUMENT), what Envoy reports for rejected config.
		if sub.lastError != "" && sub.rejectedVersion == version {
			sub.repeats++
			pace = c.nackPace(sub.repeats)
		} else {
			sub.repeats = 0
		}
		sub.lastError, sub.rejectedVersion = err.Error(), version
		sub.nacks++
		s.nack[t] = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
	}
	c.notifyLocked()
	c.mu.Unlock()

	if err != nil {
		log.Info("NACK", "error", err.Error(), "keptVersion", kept, "delay", pace)
	}
	if pace > 0 {
		// Still holding: the server is waiting for this NACK anyway (a
		// snapshot cache re-sends the same version as soon as it arrives),
		// and only other goroutines' Subscribe calls wait with it.
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

// nackPace is the delay before the n-th consecutive NACK of one version:
// BackoffInitial doubling up to BackoffMax.
func (c *Client) nackPace(n int) time.Duration {
	d := c.cfg.BackoffInitial
	for i := 1; i < n && d < c.cfg.BackoffMax; i++ {
		d *= 2
	}
	return min(d, c.cfg.BackoffMax)
}
