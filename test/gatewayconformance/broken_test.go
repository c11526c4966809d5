package gatewayconformance

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/gateway/proto/extension"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/infergate/infergate/conformance/gateway"
	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/loopback"
)

// TestStrictProfileCatchesABrokenExtension: an extension that gets the
// pool's failureMode backwards (infergate's, with failure_mode_allow
// inverted on every picker filter), turns the pickers' immediate responses
// off (disable_immediate_response) and reads a pool's endpoints only when
// Envoy Gateway translates (no EDS) passes upstream's FailOpen test, which
// breaks a picker that does not serve the pool under test, and fails each
// of infergate's: the FailOpen pool refuses its requests when its own
// picker is down, the FailClose pool lets them through, a pod added to the
// pool is never reached, and the picker's 429 and 503 never reach the
// client.
func TestStrictProfileCatchesABrokenExtension(t *testing.T) {
	l := startLive(t, gatewaytest.EnvoyGatewayCRDs(t))
	ext := brokenExtension(t, startExtension(t, l, false))
	gatewaytest.StartEnvoyGateway(t, l.Cluster, gatewaytest.EnvoyGateway{Extension: ext, GatewayNamespaceMode: true})
	gatewayClassFor(t, l, gatewaytest.EnvoyGatewayController)
	stop := envoyGatewayProxies(t, l, true)
	defer stop()
	r := &run{Live: l, name: "envoy-gateway-broken-extension", version: "v1.9.1", withInfergate: true}
	o := r.options(t, 30*time.Second)
	o.ReportOutput = t.TempDir() + "/report.yaml"
	run := []string{"EppUnAvailableFailOpen", gateway.TestFailOpenOwnPicker, gateway.TestFailClose, gateway.TestScaleOut, gateway.TestRefusals}
	for _, tc := range gateway.AllTests(o) {
		if !slices.Contains(run, tc.ShortName) {
			o.SkipTests = append(o.SkipTests, tc.ShortName)
		}
	}
	report, out, passed := r.command(t, o, 30*time.Second)
	if passed {
		t.Fatalf("the broken extension passed:\n%s", tail(out, 80))
	}
	for _, pr := range report.ProfileReports {
		var want []string
		if pr.Name == string(gateway.StrictProfileName) {
			want = []string{gateway.TestFailClose, gateway.TestFailOpenOwnPicker, gateway.TestRefusals, gateway.TestScaleOut}
		}
		got := slices.Sorted(slices.Values(pr.Core.FailedTests))
		if !slices.Equal(got, want) {
			t.Errorf("profile %s failed %v, want %v\n%s", pr.Name, got, want, tail(out, 120))
		}
		t.Logf("profile %s: %d passed, failed %v", pr.Name, pr.Core.Passed, pr.Core.FailedTests)
	}
}

// brokenExtension serves Envoy Gateway's extension service in front of
// infergate's extension at addr, passing every hook through but, on each
// pool's picker filter in the translation, inverting failure_mode_allow and
// setting disable_immediate_response: a deliberately broken implementation
// for the suite to catch.
func brokenExtension(t *testing.T, addr string) string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return loopback.Serve(t, func(ctx context.Context, ln net.Listener) error {
		g := grpc.NewServer()
		pb.RegisterEnvoyGatewayExtensionServer(g, &brokenPickerFilters{next: pb.NewEnvoyGatewayExtensionClient(conn)})
		go func() { <-ctx.Done(); g.Stop() }()
		return g.Serve(ln)
	})
}

type brokenPickerFilters struct {
	pb.UnimplementedEnvoyGatewayExtensionServer
	next pb.EnvoyGatewayExtensionClient
}

func (b *brokenPickerFilters) PostRouteModify(ctx context.Context, req *pb.PostRouteModifyRequest) (*pb.PostRouteModifyResponse, error) {
	return b.next.PostRouteModify(ctx, req)
}

func (b *brokenPickerFilters) PostClusterModify(ctx context.Context, req *pb.PostClusterModifyRequest) (*pb.PostClusterModifyResponse, error) {
	return b.next.PostClusterModify(ctx, req)
}

func (b *brokenPickerFilters) PostTranslateModify(ctx context.Context, req *pb.PostTranslateModifyRequest) (*pb.PostTranslateModifyResponse, error) {
	resp, err := b.next.PostTranslateModify(ctx, req)
	if err != nil {
		return nil, err
	}
	for _, l := range resp.GetListeners() {
		if err := breakPickers(l); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// breakPickers flips failure_mode_allow and sets disable_immediate_response
// on the pools' ext_proc filters of every HTTP connection manager of l
// (Envoy Gateway's HTTP listeners keep theirs in the default filter chain).
func breakPickers(l *listenerv3.Listener) error {
	chains := l.GetFilterChains()
	if l.GetDefaultFilterChain() != nil {
		chains = append(chains, l.GetDefaultFilterChain())
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
				continue
			}
			for _, hf := range hcm.GetHttpFilters() {
				if !strings.HasPrefix(hf.GetName(), envoygateway.FilterPrefix) || hf.GetName() == envoygateway.PayloadFilterName {
					continue
				}
				ep := &extprocv3.ExternalProcessor{}
				if err := hf.GetTypedConfig().UnmarshalTo(ep); err != nil {
					return err
				}
				ep.FailureModeAllow = !ep.FailureModeAllow
				ep.DisableImmediateResponse = true
				a, err := anypb.New(ep)
				if err != nil {
					return err
				}
				hf.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}
			}
			a, err := anypb.New(hcm)
			if err != nil {
				return err
			}
			f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
		}
	}
	return nil
}
