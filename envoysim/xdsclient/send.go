package xdsclient

import (
	"context"
	"fmt"
	"slices"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
)

// adsStream is the sending side of one ADS stream. Requests are queued by
// type URL and built only when sent, so that a request always carries the
// type's latest names, version and nonce (as Envoy's GrpcMux does) and a
// burst of Subscribe calls collapses into one request.
type adsStream struct {
	grpc discoveryStream
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

func newADSStream(g discoveryStream) *adsStream {
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
			// DiscoveryRequest.node on the first request of a stream only:
			// the protocol guarantees no more, so control planes must cope.
			// (Envoy repeats it on every request unless the config source
			// sets set_node_on_first_message_only.)
			req.Node = c.node
			s.nodeSent = true
		}
		s.announced[t] = true
		return req
	}
	return nil
}
