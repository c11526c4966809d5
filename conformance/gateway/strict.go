package gateway

import (
	"context"
	"embed"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gie "sigs.k8s.io/gateway-api-inference-extension/conformance"
	"sigs.k8s.io/gateway-api-inference-extension/conformance/resources"
	giefeatures "sigs.k8s.io/gateway-api-inference-extension/conformance/utils/features"
	"sigs.k8s.io/gateway-api-inference-extension/conformance/utils/headers"
	k8sutils "sigs.k8s.io/gateway-api-inference-extension/conformance/utils/kubernetes"
	gwhttp "sigs.k8s.io/gateway-api/conformance/utils/http"
	"sigs.k8s.io/gateway-api/conformance/utils/roundtripper"
	confsuite "sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"

	"github.com/infergate/infergate/inference/wire"
)

// The stricter profile: upstream's tests plus infergate's, which close the
// gaps upstream's leave (its FailOpen test breaks a picker that does not
// serve the pool under test; nothing checks FailClose). Its tests carry
// StrictFeature, which upstream's profile lacks, so upstream's profile in
// the report stays comparable with published ones; the strict profile
// holds every test.
const (
	StrictProfileName confsuite.ConformanceProfileName = "Gateway-infergate"
	StrictFeature     features.FeatureName             = "InfergateStrict"
	strictManifestDir                                  = "infergate"
)

// StrictProfile is the stricter profile: upstream's features and
// infergate's, so that it holds every test.
var StrictProfile = confsuite.ConformanceProfile{
	Name:         StrictProfileName,
	CoreFeatures: gie.GatewayLayerProfile.CoreFeatures.Union(sets.New(StrictFeature)),
}

//go:embed strict/*.yaml
var strictManifests embed.FS

// Names of infergate's tests.
const (
	TestFailOpenOwnPicker = "InfergateFailOpenWhenItsOwnPickerIsDown"
	TestFailClose         = "InfergateFailCloseWhenItsPickerIsDown"
	TestScaleOut          = "InfergatePoolScaleOutReachesTheNewPod"
	TestRefusals          = "InfergatePickerRefusalsReachTheClient"
	TestPoolStatus        = "InfergatePoolStatusNamesItsGatewayWithReasons"
	TestFallback          = "InfergateFallbackListWalked"
)

// strictFeatures are what each of infergate's tests relies on.
func strictFeatures() []features.FeatureName {
	return []features.FeatureName{giefeatures.SupportInferencePool, features.SupportGateway, StrictFeature}
}

// strictTest is one of infergate's tests: its manifest (under strict/)
// and what it relies on are those of them all.
func strictTest(name, manifest, description string, test func(*testing.T, *confsuite.ConformanceTestSuite)) confsuite.ConformanceTest {
	return confsuite.ConformanceTest{ShortName: name, Description: description, Manifests: []string{strictManifestDir + "/" + manifest},
		Features: strictFeatures(), Test: test}
}

// StrictTests are infergate's tests of the stricter profile.
func StrictTests() []confsuite.ConformanceTest {
	return []confsuite.ConformanceTest{failOpenOwnPicker, failClose, scaleOut, refusals, poolStatus, fallback}
}

var failOpenOwnPicker = strictTest(TestFailOpenOwnPicker, "failopen.yaml",
	"A FailOpen pool whose own endpoint picker is down still serves its requests, from its own pods "+
		"(upstream's EppUnAvailableFailOpen breaks the primary pool's picker while it sends to the secondary pool)",
	func(t *testing.T, s *confsuite.ConformanceTestSuite) {
		const host, path = "secondary.example.com", "/infergate-failopen"
		addr, pods := poolRouted(t, s, "httproute-infergate-failopen", resources.SecondaryGatewayNN,
			resources.SecondaryInferencePoolNN, resources.SecondaryModelServerAppLabel)
		exp := toPod(host, path, &pods[0])
		t.Log("picker up: the request goes to the pod the picker picks")
		gwhttp.MakeRequestAndExpectEventuallyConsistentResponse(t, s.RoundTripper, s.TimeoutConfig, addr, exp)

		t.Logf("picker down: scaling %s, the picker of pool %s, to 0", resources.SecondaryEppDeploymentNN, resources.SecondaryInferencePoolNN)
		restore := scaleToZero(t, s, resources.SecondaryEppDeploymentNN, resources.SecondaryEppServiceNN)
		t.Cleanup(restore)
		// Any of the pool's pods may answer now: nobody picks.
		exp.Backend = resources.SecondaryModelServerAppLabel
		gwhttp.MakeRequestAndExpectEventuallyConsistentResponse(t, s.RoundTripper, s.TimeoutConfig, addr, exp)
	})

var failClose = strictTest(TestFailClose, "failclose.yaml",
	"A FailClose pool (failureMode unset, the default) whose endpoint picker is down answers 5xx, "+
		"and no request reaches its pods",
	func(t *testing.T, s *confsuite.ConformanceTestSuite) {
		const host, path = "primary.example.com", "/infergate-failclose"
		addr, pods := poolRouted(t, s, "httproute-infergate-failclose", resources.PrimaryGatewayNN,
			resources.PrimaryInferencePoolNN, resources.PrimaryModelServerAppLabel)
		exp := toPod(host, path, &pods[0])
		t.Log("picker up: the request goes to the pod the picker picks")
		gwhttp.MakeRequestAndExpectEventuallyConsistentResponse(t, s.RoundTripper, s.TimeoutConfig, addr, exp)

		t.Logf("picker down: scaling %s, the picker of pool %s, to 0", resources.PrimaryEppDeploymentNN, resources.PrimaryInferencePoolNN)
		restore := scaleToZero(t, s, resources.PrimaryEppDeploymentNN, resources.PrimaryEppServiceNN)
		t.Cleanup(restore)
		req := gwhttp.MakeRequest(t, &exp, addr, "HTTP", "http")
		// Held for failureDetection: a gateway that fails open once it has
		// taken the dead picker out must not pass on the 500s it answers
		// before (Envoy, with a streamed body, cannot fail open while the
		// picker is listed: a broken FailOpen looks like FailClose then).
		require.NoError(t, refusedByGateway(t, s, failureDetection, req, "a FailClose pool's request reached a pod while its picker was down",
			func(code int, _ http.Header) error {
				if code < 500 || code > 599 {
					return fmt.Errorf("status %d, want a 5xx: a FailClose pool whose picker is down must refuse its requests", code)
				}
				return nil
			}), "FailClose")
	})

var scaleOut = strictTest(TestScaleOut, "scaleout.yaml",
	"A pod added to a pool while the gateway runs is reached as soon as the picker picks it: "+
		"the gateway follows the pool's endpoints without a restart or a change to any Gateway API object",
	func(t *testing.T, s *confsuite.ConformanceTestSuite) {
		const host, path = "secondary.example.com", "/infergate-scaleout"
		addr, pods := poolRouted(t, s, "httproute-infergate-scaleout", resources.SecondaryGatewayNN,
			resources.SecondaryInferencePoolNN, resources.SecondaryModelServerAppLabel)
		deploy := types.NamespacedName{Name: resources.SecondaryModelServerDeploymentName, Namespace: resources.AppBackendNamespace}
		before := sets.New[string]()
		for _, p := range pods {
			before.Insert(p.Name)
		}
		ctx := context.Background()
		n := int32(len(pods))
		t.Logf("scaling %s from %d to %d replicas", deploy, n, n+1)
		require.NoError(t, setReplicas(ctx, s.Client, deploy, n+1))
		t.Cleanup(func() {
			t.Logf("scaling %s back to %d replicas", deploy, n)
			require.NoError(t, setReplicas(ctx, s.Client, deploy, n))
			require.NoError(t, waitFor(ctx, s.TimeoutConfig.DeleteTimeout+s.TimeoutConfig.MaxTimeToConsistency, func(ctx context.Context) (bool, error) {
				ps, err := poolPods(ctx, s.Client, resources.SecondaryModelServerAppLabel)
				return len(ps) == int(n), err
			}), "%s did not go back to %d pods", deploy, n)
		})
		var added corev1.Pod
		require.NoError(t, waitFor(ctx, s.TimeoutConfig.MaxTimeToConsistency, func(ctx context.Context) (bool, error) {
			ps, err := poolPods(ctx, s.Client, resources.SecondaryModelServerAppLabel)
			for _, p := range ps {
				if !before.Has(p.Name) && p.Status.PodIP != "" && podReady(&p) {
					added = p
					return true, nil
				}
			}
			return false, err
		}), "no new ready pod of %s", deploy)
		t.Logf("new pod %s at %s: asking the picker for it", added.Name, added.Status.PodIP)
		gwhttp.MakeRequestAndExpectEventuallyConsistentResponse(t, s.RoundTripper, s.TimeoutConfig, addr, toPod(host, path, &added))
	})

var refusals = strictTest(TestRefusals, "refusals.yaml",
	"The picker's refusals reach the client as it sent them, on a FailOpen pool: a request it sheds gets "+
		"429 with "+wire.DropReasonHeader+": rejected-saturated and Retry-After, a request it has no endpoint for gets 503 "+
		"with rejected-no-endpoints, and neither reaches a pod",
	func(t *testing.T, s *confsuite.ConformanceTestSuite) {
		const host, path = "secondary.example.com", "/infergate-refusals"
		addr, pods := poolRouted(t, s, "httproute-infergate-refusals", resources.SecondaryGatewayNN,
			resources.SecondaryInferencePoolNN, resources.SecondaryModelServerAppLabel)
		t.Log("the route works: the request goes to the pod the picker picks")
		gwhttp.MakeRequestAndExpectEventuallyConsistentResponse(t, s.RoundTripper, s.TimeoutConfig, addr, toPod(host, path, &pods[0]))
		cases := []struct {
			name       string
			headers    map[string]string
			status     int
			reason     string
			retryAfter bool
		}{{
			name: "shed", status: http.StatusTooManyRequests, reason: "rejected-saturated", retryAfter: true,
			headers: map[string]string{wire.ShedTestHeader: "true", headers.HeaderTestEppEndPointSelectionKey: pods[0].Status.PodIP},
		}, {
			// An address of RFC 5737's documentation range: in no pool.
			name: "no endpoint", status: http.StatusServiceUnavailable, reason: "rejected-no-endpoints",
			headers: map[string]string{headers.HeaderTestEppEndPointSelectionKey: "192.0.2.1"},
		}}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				exp := toPod(host, path, &pods[0])
				exp.Request.Headers = tc.headers
				req := gwhttp.MakeRequest(t, &exp, addr, "HTTP", "http")
				why := fmt.Sprintf("the picker refused the request (%d), the gateway sent it on", tc.status)
				require.NoError(t, refusedByGateway(t, s, 0, req, why, func(code int, h http.Header) error {
					switch {
					case code != tc.status:
						return fmt.Errorf("status %d, want the picker's %d", code, tc.status)
					case h.Get(wire.DropReasonHeader) != tc.reason:
						return fmt.Errorf("%s %q, want the picker's %q", wire.DropReasonHeader, h.Get(wire.DropReasonHeader), tc.reason)
					case tc.retryAfter && h.Get("Retry-After") == "":
						return fmt.Errorf("no Retry-After: the picker's was dropped")
					}
					return nil
				}), "the picker's %d", tc.status)
			})
		}
	})

var fallback = strictTest(TestFallback, "fallback.yaml",
	"When the endpoint the picker picked refuses the connection, the request goes to the next endpoint "+
		"of the picker's list, and the picker is told the endpoint that served ("+wire.ServedEndpointKey+")",
	func(t *testing.T, s *confsuite.ConformanceTestSuite) {
		const host, path = "primary.example.com", "/infergate-fallback"
		pool := types.NamespacedName{Name: "infergate-fallback-pool", Namespace: resources.AppBackendNamespace}
		addr, pods := poolRouted(t, s, "httproute-infergate-fallback", resources.PrimaryGatewayNN, pool, resources.PrimaryModelServerAppLabel)
		pod := &pods[0]
		// The pool's endpoints are each pod on 3000, where its echo server
		// listens, and on 3001, where nothing does.
		dead, live := net.JoinHostPort(pod.Status.PodIP, "3001"), net.JoinHostPort(pod.Status.PodIP, "3000")
		exp := toPod(host, path, pod)
		exp.Request.Headers[wire.FallbackTestHeader] = "true"
		exp.Request.Headers[headers.HeaderTestEppEndPointSelectionKey] = dead + "," + live
		exp.Response.Headers = map[string]string{headers.ConformanceTestResultHeader: live}
		t.Logf("the picker answers %s,%s: the first refuses connections, the second is %s's echo server", dead, live, pod.Name)
		gwhttp.MakeRequestAndExpectEventuallyConsistentResponse(t, s.RoundTripper, s.TimeoutConfig, addr, exp)
	})

// refusedByGateway waits (as consistently does, the answers holding for at
// least hold) for req to be answered by the gateway itself, never by a pod
// (a pod's echo names it; why says what reaching one means), with an
// answer check accepts.
func refusedByGateway(t *testing.T, s *confsuite.ConformanceTestSuite, hold time.Duration, req roundtripper.Request, why string, check func(status int, h http.Header) error) error {
	t.Helper()
	return consistently(t, s, hold, func() error {
		cReq, cRes, err := s.RoundTripper.CaptureRoundTrip(req)
		switch {
		case err != nil:
			return err
		case cReq.Pod != "":
			return fmt.Errorf("status %d from pod %s: %s", cRes.StatusCode, cReq.Pod, why)
		}
		return check(cRes.StatusCode, http.Header(cRes.Headers))
	})
}

// poolPods are the pods labelled app=appLabel in the app namespace that
// are not terminating.
func poolPods(ctx context.Context, c client.Client, appLabel string) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.InNamespace(resources.AppBackendNamespace), client.MatchingLabels{"app": appLabel}); err != nil {
		return nil, err
	}
	out := list.Items[:0]
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// poolRouted waits for the test's route (in the app namespace) to be
// Accepted and resolved by gw and the pool to be Accepted by it, and
// returns gw's address and the pool's pods (label app=appLabel).
func poolRouted(t *testing.T, s *confsuite.ConformanceTestSuite, route string, gw, pool types.NamespacedName, appLabel string) (string, []corev1.Pod) {
	t.Helper()
	routeNN := types.NamespacedName{Name: route, Namespace: resources.AppBackendNamespace}
	k8sutils.HTTPRouteMustBeAcceptedAndResolved(t, s.Client, s.TimeoutConfig, routeNN, gw)
	k8sutils.InferencePoolMustBeAcceptedByParent(t, s.Client, pool, gw)
	addr := k8sutils.GetGatewayEndpoint(t, s.Client, s.TimeoutConfig, gw)
	pods, err := k8sutils.GetPodsWithLabel(t, s.Client, resources.AppBackendNamespace, map[string]string{"app": appLabel}, s.TimeoutConfig)
	require.NoError(t, err)
	require.NotEmpty(t, pods)
	return addr, pods
}

// toPod is an inference request to host and path that asks the test
// picker for pod, and expects a 200 from it.
func toPod(host, path string, pod *corev1.Pod) gwhttp.ExpectedResponse {
	return gwhttp.ExpectedResponse{
		Request: gwhttp.Request{Host: host, Path: path, Method: http.MethodPost, Body: inferenceBody,
			Headers: map[string]string{headers.HeaderTestEppEndPointSelectionKey: pod.Status.PodIP}},
		Response:  gwhttp.Response{StatusCodes: []int{http.StatusOK}},
		Backend:   pod.Name,
		Namespace: resources.AppBackendNamespace,
	}
}

// inferenceBody is the request the tests send.
const inferenceBody = `{"model": "conformance-fake-model", "prompt": "Write as if you were a critic: San Francisco"}`

// failureDetection is how long a failure-mode answer must hold: longer
// than a gateway takes to notice a picker is gone. Envoy, health checking
// the picker as infergate renders its clusters (2 s apart, out after two
// missed checks), takes about 5 s.
const failureDetection = 10 * time.Second

// consistently waits (up to the suite's MaxTimeToConsistency, plus hold)
// for check to hold RequiredConsecutiveSuccesses times in a row and, with
// hold, for hold as well (checks half a second apart then), one second
// apart after a failure, and returns check's last error if it never does.
func consistently(t *testing.T, s *confsuite.ConformanceTestSuite, hold time.Duration, check func() error) error {
	t.Helper()
	deadline := time.Now().Add(s.TimeoutConfig.MaxTimeToConsistency + hold)
	need := max(s.TimeoutConfig.RequiredConsecutiveSuccesses, 3)
	ok := 0
	var since time.Time
	for {
		err := check()
		if err == nil {
			if ok++; ok == 1 {
				since = time.Now()
			}
			if ok >= need && time.Since(since) >= hold {
				return nil
			}
			if hold > 0 {
				time.Sleep(500 * time.Millisecond)
			}
			continue
		}
		ok = 0
		if time.Now().After(deadline) {
			return err
		}
		t.Logf("not yet: %v", err)
		time.Sleep(time.Second)
	}
}

// scaleToZero scales a picker's Deployment to no replicas and waits until
// its Service has no endpoint and no Pod of it is left (so no connection
// to it survives either), and returns what brings it back.
func scaleToZero(t *testing.T, s *confsuite.ConformanceTestSuite, deploy, svc types.NamespacedName) (restore func()) {
	t.Helper()
	ctx := context.Background()
	var d appsv1.Deployment
	require.NoError(t, s.Client.Get(ctx, deploy, &d))
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	require.NoError(t, setReplicas(ctx, s.Client, deploy, 0))
	wait := s.TimeoutConfig.DeleteTimeout + s.TimeoutConfig.MaxTimeToConsistency
	require.NoError(t, waitFor(ctx, wait, func(ctx context.Context) (bool, error) {
		n, err := readyEndpoints(ctx, s.Client, svc)
		if err != nil || n > 0 {
			return false, err
		}
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace(deploy.Namespace), client.MatchingLabels(d.Spec.Selector.MatchLabels)); err != nil {
			return false, err
		}
		return len(pods.Items) == 0, nil
	}), "%s scaled to 0 still has pods or %s endpoints", deploy, svc)
	return func() {
		t.Logf("restoring %s to %d replicas", deploy, replicas)
		require.NoError(t, setReplicas(ctx, s.Client, deploy, replicas))
		require.NoError(t, waitFor(ctx, wait, func(ctx context.Context) (bool, error) {
			n, err := readyEndpoints(ctx, s.Client, svc)
			return n >= int(replicas), err
		}), "%s has no ready endpoint again", svc)
	}
}

func setReplicas(ctx context.Context, c client.Client, deploy types.NamespacedName, n int32) error {
	var d appsv1.Deployment
	if err := c.Get(ctx, deploy, &d); err != nil {
		return err
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Replicas = &n
	return c.Patch(ctx, &d, patch)
}

// readyEndpoints counts a Service's ready endpoints over its EndpointSlices.
func readyEndpoints(ctx context.Context, c client.Client, svc types.NamespacedName) (int, error) {
	var slices discoveryv1.EndpointSliceList
	if err := c.List(ctx, &slices, client.InNamespace(svc.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: svc.Name}); err != nil {
		return 0, err
	}
	n := 0
	for _, sl := range slices.Items {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				n++
			}
		}
	}
	return n, nil
}

func waitFor(ctx context.Context, d time.Duration, cond func(context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, time.Second, d, true, cond)
}
