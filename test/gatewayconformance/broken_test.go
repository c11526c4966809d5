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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/conformance/gateway"
	"github.com/infergate/infergate/gateways/envoygateway"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/livecluster"
	"github.com/infergate/infergate/test/loopback"
)

// TestStrictProfileCatchesABrokenExtension: an extension that gets the
// pool's failureMode backwards (infergate's, with failure_mode_allow
// inverted on every picker filter), turns the pickers' immediate responses
// off (disable_immediate_response), reads a pool's endpoints only when
// Envoy Gateway translates (no EDS), writes pool status with the wrong
// ResolvedRefs reasons and no observedGeneration and drops the pool
// routes' retry policy passes upstream's FailOpen test, and fails each of
// infergate's: the FailOpen pool refuses its
// requests when its own picker is down, the FailClose pool lets them
// through, a pod added to the pool is never reached, the picker's 429 and
// 503 never reach the client, the status test refuses the reasons, and a
// dead pick is never followed by its fallback.
func TestStrictProfileCatchesABrokenExtension(t *testing.T) {
	l := startLive(t, gatewaytest.EnvoyGatewayCRDs(t))
	// infergate's extension writes status for another controller's
	// Gateways (none): brokenPoolStatus writes it instead.
	ext := brokenExtension(t, startExtension(t, l, false, "example.com/not-envoy-gateway"))
	brokenPoolStatus(t, l)
	gatewaytest.StartEnvoyGateway(t, l.Cluster, gatewaytest.EnvoyGateway{Extension: ext, GatewayNamespaceMode: true})
	gatewayClassFor(t, l, gatewaytest.EnvoyGatewayController)
	stop := envoyGatewayProxies(t, l, true)
	defer stop()
	r := &run{Live: l, name: "envoy-gateway-broken-extension", version: "v1.9.1", withInfergate: true}
	o := r.options(t, 30*time.Second)
	o.ReportOutput = t.TempDir() + "/report.yaml"
	run := []string{"EppUnAvailableFailOpen", gateway.TestFailOpenOwnPicker, gateway.TestFailClose,
		gateway.TestScaleOut, gateway.TestRefusals, gateway.TestPoolStatus, gateway.TestFallback}
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
			want = []string{gateway.TestFailClose, gateway.TestFailOpenOwnPicker, gateway.TestFallback, gateway.TestRefusals,
				gateway.TestPoolStatus, gateway.TestScaleOut}
			slices.Sort(want)
		}
		got := slices.Sorted(slices.Values(pr.Core.FailedTests))
		if !slices.Equal(got, want) {
			t.Errorf("profile %s failed %v, want %v\n%s", pr.Name, got, want, failureOutput(out, got, want, 120))
		}
		t.Logf("profile %s: %d passed, failed %v", pr.Name, pr.Core.Passed, pr.Core.FailedTests)
	}
}

// brokenExtension serves Envoy Gateway's extension service in front of
// infergate's extension at addr, passing every hook through but dropping
// the pool routes' retry policy and, on each pool's picker filter in the
// translation, inverting failure_mode_allow and setting
// disable_immediate_response: a deliberately broken implementation for the
// suite to catch.
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

// PostRouteModify drops the retry policy infergate's extension gives a
// pool's route, so Envoy never walks the picker's fallback list.
func (b *brokenPickerFilters) PostRouteModify(ctx context.Context, req *pb.PostRouteModifyRequest) (*pb.PostRouteModifyResponse, error) {
	resp, err := b.next.PostRouteModify(ctx, req)
	if ra := resp.GetRoute().GetRoute(); ra != nil {
		ra.RetryPolicy = nil
	}
	return resp, err
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

// brokenPoolStatus writes InferencePool status for Envoy Gateway's
// Gateways, every half second until the test ends, as a careless
// implementation would: an entry per Gateway that accepted a route to the
// pool, naming it fully, Accepted/Accepted (what upstream's helpers
// check), but ResolvedRefs with reason Accepted when the picker Service
// exists and ServiceNotFound when it does not, and no observedGeneration.
func brokenPoolStatus(t *testing.T, l *livecluster.Live) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := writeBrokenPoolStatus(ctx, l.Client); err != nil && ctx.Err() == nil {
				t.Logf("broken pool status: %v", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
}

func writeBrokenPoolStatus(ctx context.Context, c client.Client) error {
	var routes gatewayv1.HTTPRouteList
	if err := c.List(ctx, &routes); err != nil {
		return err
	}
	parents := map[types.NamespacedName][]gatewayv1.ParentReference{} // pool → Gateways
	for _, r := range routes.Items {
		for _, ps := range r.Status.Parents {
			if string(ps.ControllerName) != gatewaytest.EnvoyGatewayController || !meta.IsStatusConditionTrue(ps.Conditions, string(gatewayv1.RouteConditionAccepted)) {
				continue
			}
			gw := ps.ParentRef
			if gw.Namespace == nil {
				gw.Namespace = ptr.To(gatewayv1.Namespace(r.Namespace))
			}
			for _, rule := range r.Spec.Rules {
				for _, b := range rule.BackendRefs {
					if b.Kind != nil && *b.Kind == "InferencePool" {
						pool := types.NamespacedName{Namespace: r.Namespace, Name: string(b.Name)}
						parents[pool] = append(parents[pool], gw)
					}
				}
			}
		}
	}
	var pools inferencev1.InferencePoolList
	if err := c.List(ctx, &pools); err != nil {
		return err
	}
	for i := range pools.Items {
		pool := &pools.Items[i]
		resolved := metav1.Condition{Type: string(inferencev1.InferencePoolConditionResolvedRefs), Status: metav1.ConditionTrue, Reason: "Accepted"}
		if ref := pool.Spec.EndpointPickerRef; ref == nil || c.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: string(ref.Name)}, &corev1.Service{}) != nil {
			resolved.Status, resolved.Reason = metav1.ConditionFalse, "ServiceNotFound"
		}
		var next []inferencev1.ParentStatus
		for _, gw := range parents[client.ObjectKeyFromObject(pool)] {
			ref := inferencev1.ParentReference{Group: ptr.To(inferencev1.Group(gatewayv1.GroupName)), Kind: "Gateway",
				Name: inferencev1.ObjectName(gw.Name), Namespace: inferencev1.Namespace(*gw.Namespace)}
			same := func(p inferencev1.ParentStatus) bool { return equality.Semantic.DeepEqual(p.ParentRef, ref) }
			if slices.ContainsFunc(next, same) {
				continue
			}
			st := inferencev1.ParentStatus{ParentRef: ref, ControllerName: gatewaytest.EnvoyGatewayController}
			for _, cond := range []metav1.Condition{
				{Type: string(inferencev1.InferencePoolConditionAccepted), Status: metav1.ConditionTrue, Reason: string(inferencev1.InferencePoolReasonAccepted)},
				resolved,
			} {
				cond.LastTransitionTime = metav1.Now()
				if i := slices.IndexFunc(pool.Status.Parents, same); i >= 0 {
					if was := meta.FindStatusCondition(pool.Status.Parents[i].Conditions, cond.Type); was != nil && was.Status == cond.Status && was.Reason == cond.Reason {
						cond.LastTransitionTime = was.LastTransitionTime
					}
				}
				st.Conditions = append(st.Conditions, cond)
			}
			next = append(next, st)
		}
		if equality.Semantic.DeepEqual(next, pool.Status.Parents) {
			continue
		}
		pool.Status.Parents = next
		if err := c.Status().Update(ctx, pool); err != nil && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}
