package xdsclient

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/go-logr/logr/testr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// proxyState is what the test handler accepted: per type, resource name →
// the version it came with.
type proxyState map[string]map[string]string

// fakeProxy is the part of the Envoy stand-in a handler plays: it decodes
// what it is given, rejects what reject refuses, and follows listeners to
// their RDS route configs and EDS clusters to their endpoints by
// subscribing from inside Apply, as Envoy's listener and cluster managers do.
type fakeProxy struct {
	client *Client
	reject func(typeURL, name string) error

	mu    sync.Mutex
	state proxyState
	calls map[string]int // Apply calls per type
}

func (p *fakeProxy) Apply(_ context.Context, typeURL, version string, resources []*anypb.Any) error {
	p.mu.Lock()
	if p.calls == nil {
		p.calls = map[string]int{}
	}
	p.calls[typeURL]++
	p.mu.Unlock()
	names := map[string]string{}
	var follow []string
	for _, a := range resources {
		m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
		if err != nil {
			return fmt.Errorf("decode %s: %w", a.GetTypeUrl(), err)
		}
		name, deps, err := nameAndDeps(m)
		if err != nil {
			return err
		}
		if p.reject != nil {
			if err := p.reject(typeURL, name); err != nil {
				return err
			}
		}
		names[name] = version
		follow = append(follow, deps...)
	}
	switch typeURL {
	case ListenerType:
		p.client.Subscribe(RouteType, follow)
	case ClusterType:
		p.client.Subscribe(EndpointType, follow)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		p.state = proxyState{}
	}
	p.state[typeURL] = names
	return nil
}

func nameAndDeps(m proto.Message) (string, []string, error) {
	switch r := m.(type) {
	case *listenerv3.Listener:
		var routes []string
		for _, fc := range r.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					return "", nil, fmt.Errorf("listener %s: %w", r.GetName(), err)
				}
				if n := hcm.GetRds().GetRouteConfigName(); n != "" {
					routes = append(routes, n)
				}
			}
		}
		return r.GetName(), routes, nil
	case *clusterv3.Cluster:
		if r.GetType() != clusterv3.Cluster_EDS {
			return r.GetName(), nil, nil
		}
		svc := r.GetEdsClusterConfig().GetServiceName()
		if svc == "" {
			svc = r.GetName()
		}
		return r.GetName(), []string{svc}, nil
	case *routev3.RouteConfiguration:
		return r.GetName(), nil, nil
	case *endpointv3.ClusterLoadAssignment:
		return r.GetClusterName(), nil, nil
	}
	return "", nil, fmt.Errorf("unexpected resource %T", m)
}

func (p *fakeProxy) applyCalls(typeURL string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[typeURL]
}

// names returns the sorted resource names of typeURL the proxy holds.
func (p *fakeProxy) names(typeURL string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.state[typeURL]))
}

// runClient starts a client for addr subscribed to wildcard LDS and CDS and
// stops it (waiting for Run to return) when the test ends.
func runClient(t *testing.T, addr string, h Handler, tweak func(*Config)) *Client {
	t.Helper()
	cfg := Config{
		Server:      addr,
		NodeID:      testNode,
		NodeCluster: "devproxy",
		Logger:      testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := h.(*fakeProxy); ok {
		p.client = c
	}
	c.Subscribe(ListenerType, nil)
	c.Subscribe(ClusterType, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return c
}

// waitVersions waits until every xDS type has ACKed version.
func waitVersions(ctx context.Context, t *testing.T, c *Client, version string, typeURLs ...string) {
	t.Helper()
	if len(typeURLs) == 0 {
		typeURLs = []string{ListenerType, RouteType, ClusterType, EndpointType}
	}
	for _, typ := range typeURLs {
		if err := c.WaitVersion(ctx, typ, version); err != nil {
			t.Fatal(err)
		}
	}
}
