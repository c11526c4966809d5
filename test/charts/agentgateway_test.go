package charts

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The AgentgatewayPolicy CRD these tests submit to is agentgateway's own
// (testdata/crds/agentgateway.dev_agentgatewaypolicies.yaml: v1.4.0, the
// chart's minimum release, trimmed to the parts the chart renders, CEL
// rules included), so the API server judges the policies as a cluster
// running that release would.

// agentgatewayWant is the traffic policy's extProc and frontend a value
// set must render; "" and nil for a field left out.
type agentgatewayWant struct {
	failureMode     string
	requestBodyMode string
	maxBufferSize   any
}

// TestAgentgatewayFailureMode: failOpen renders FailOpen with the Buffered
// request body mode (agentgateway cannot fail open once a streamed body
// has started towards the processor), and maxBufferSize the Gateway's
// buffer limit that bounds that body; the API server accepts each policy,
// and its defaults leave response bodies streamed.
func TestAgentgatewayFailureMode(t *testing.T) {
	ch := loadChart(t, payloadChartDir)
	ns := namespace(t, "charts-agw-failure")
	for _, tc := range []struct {
		name, values string
		want         agentgatewayWant
	}{
		{"fail closed (default)", ``, agentgatewayWant{}},
		{"fail open", `provider: {agentgateway: {failOpen: true}}`, agentgatewayWant{failureMode: "FailOpen", requestBodyMode: "Buffered"}},
		{"fail open, 1 MiB buffer", `provider: {agentgateway: {failOpen: true, maxBufferSize: 1048576}}`,
			agentgatewayWant{failureMode: "FailOpen", requestBodyMode: "Buffered", maxBufferSize: int64(1048576)}},
		{"fail open, largest buffer", `provider: {agentgateway: {failOpen: true, maxBufferSize: 4190208}}`,
			agentgatewayWant{failureMode: "FailOpen", requestBodyMode: "Buffered", maxBufferSize: int64(4190208)}},
		{"fail open, buffer 0 (agentgateway's default)", `provider: {agentgateway: {failOpen: true, maxBufferSize: 0}}`,
			agentgatewayWant{failureMode: "FailOpen", requestBodyMode: "Buffered"}},
		{"fail open, plaintext processor", `{provider: {agentgateway: {failOpen: true}}, payload: {secureServing: false}}`,
			agentgatewayWant{failureMode: "FailOpen", requestBodyMode: "Buffered"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vals := values(t, payloadProvider("agentgateway"), tc.values)
			lintChart(t, payloadChartDir, vals, ns)
			objs := mustRender(t, ch, "payload", ns, vals)
			traffic := trafficPolicy(t, objs)
			get := func(path ...string) any {
				v, _, _ := unstructured.NestedFieldNoCopy(traffic.Object, append([]string{"spec"}, path...)...)
				return v
			}
			got := agentgatewayWant{
				failureMode:     str(get("traffic", "extProc", "failureMode")),
				requestBodyMode: str(get("traffic", "extProc", "processingOptions", "requestBodyMode")),
				maxBufferSize:   get("frontend", "http", "maxBufferSize"),
			}
			if got != tc.want {
				t.Errorf("rendered %+v, want %+v", got, tc.want)
			}
			if tc.want.requestBodyMode != "" {
				if opts, _, _ := unstructured.NestedMap(traffic.Object, "spec", "traffic", "extProc", "processingOptions"); len(opts) != 1 {
					t.Errorf("processingOptions %v, want only requestBodyMode", opts)
				}
			}
			if tc.want.maxBufferSize != nil {
				if fe, _, _ := unstructured.NestedMap(traffic.Object, "spec", "frontend"); len(fe) != 1 || len(fe["http"].(map[string]any)) != 1 {
					t.Errorf("frontend %v, want only http.maxBufferSize", fe)
				}
			}
			dryRun(t, ns, objs)

			// What the API server stores: its defaults keep response bodies
			// streamed (usage metadata) beside the Buffered request body.
			stored := traffic.DeepCopy()
			if err := fx.client.Create(context.Background(), stored, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
				t.Fatalf("dry-run create: %v", err)
			}
			opts, _, _ := unstructured.NestedMap(stored.Object, "spec", "traffic", "extProc", "processingOptions")
			if tc.want.requestBodyMode == "" {
				if opts != nil {
					t.Errorf("stored processingOptions %v, want none (agentgateway's defaults)", opts)
				}
			} else if opts["requestBodyMode"] != "Buffered" || opts["responseBodyMode"] != "FullDuplexStreamed" {
				t.Errorf("stored processingOptions %v, want Buffered requests and FullDuplexStreamed responses", opts)
			}
		})
	}
}

// TestAgentgatewayPolicySchema: agentgateway's schema refuses what it does
// not have, which a hand-made stand-in could not show: fields it lacks
// (strict field validation), values outside its enums, and what its CEL
// rules forbid. Each case edits one rendered policy; the unedited ones
// are accepted.
func TestAgentgatewayPolicySchema(t *testing.T) {
	ns := namespace(t, "charts-agw-schema")
	objs := mustRender(t, loadChart(t, payloadChartDir), "payload", ns, values(t, payloadProvider("agentgateway"),
		`provider: {agentgateway: {failOpen: true, maxBufferSize: 3145728, clientCertificateSecretName: gateway-client-cert}}`))
	traffic := trafficPolicy(t, objs)
	var tls *unstructured.Unstructured
	for _, o := range only(objs, "AgentgatewayPolicy") {
		if o != traffic {
			tls = o
		}
	}
	if tls == nil {
		t.Fatal("no backend TLS policy rendered")
	}
	for _, tc := range []struct {
		name   string
		policy *unstructured.Unstructured
		path   []string
		value  any // nil removes the field
		want   string
	}{
		{"traffic policy as rendered", traffic, nil, nil, ""},
		{"TLS policy as rendered", tls, nil, nil, ""},
		{"extProc field it does not have", traffic, []string{"traffic", "extProc", "failOpen"}, true,
			`unknown field "spec.traffic.extProc.failOpen"`},
		{"processing option it does not have", traffic, []string{"traffic", "extProc", "processingOptions", "requestBodyLimit"}, "1Mi",
			`unknown field "spec.traffic.extProc.processingOptions.requestBodyLimit"`},
		{"traffic field it does not have", traffic, []string{"traffic", "extProcs"}, []any{},
			`unknown field "spec.traffic.extProcs"`},
		{"failureMode outside its enum", traffic, []string{"traffic", "extProc", "failureMode"}, "FailSafe",
			`Unsupported value: "FailSafe"`},
		{"requestBodyMode outside its enum", traffic, []string{"traffic", "extProc", "processingOptions", "requestBodyMode"}, "Streamed",
			`Unsupported value: "Streamed"`},
		{"phase outside its enum", traffic, []string{"traffic", "phase"}, "PreAuth", `Unsupported value: "PreAuth"`},
		{"Service backendRef without a port", traffic, []string{"traffic", "extProc", "backendRef", "port"}, nil,
			"Must have port for Service reference"},
		{"conditional beside backendRef", traffic, []string{"traffic", "extProc", "conditional"},
			[]any{map[string]any{"policy": map[string]any{"backendRef": map[string]any{"name": "other", "port": int64(9004)}}}},
			"conditional cannot be set with any other field"},
		{"PreRouting on an HTTPRoute", traffic, []string{"targetRefs"},
			[]any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "route"}},
			"the 'traffic.phase=PreRouting' field can only target a Gateway or ListenerSet"},
		{"frontend on a listener", traffic, []string{"targetRefs"},
			[]any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway", "sectionName": "http"}},
			"may only target a Gateway or port, not a listener (sectionName)"},
		{"targetRef without its group", traffic, []string{"targetRefs"}, []any{map[string]any{"kind": "Gateway", "name": "inference-gateway"}},
			"spec.targetRefs[0].group: Required value"},
		{"targetRefs and targetSelectors", traffic, []string{"targetSelectors"},
			[]any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "matchLabels": map[string]any{"app": "gw"}}},
			"exactly one of the fields in [targetRefs targetSelectors] must be set"},
		{"maxBufferSize zero", traffic, []string{"frontend", "http", "maxBufferSize"}, int64(0),
			"value must be at least 1 byte and fit within uint32"},
		{"frontend field it does not have", traffic, []string{"frontend", "http", "maxBodySize"}, "8Mi",
			`unknown field "spec.frontend.http.maxBodySize"`},
		{"backend TLS field it does not have", tls, []string{"backend", "tls", "skipVerify"}, true,
			`unknown field "spec.backend.tls.skipVerify"`},
		{"insecureSkipVerify outside its enum", tls, []string{"backend", "tls", "insecureSkipVerify"}, "Always",
			`Unsupported value: "Always"`},
		{"insecureSkipVerify with CA certificates", tls, []string{"backend", "tls", "caCertificateRefs"}, []any{map[string]any{"name": "ca"}},
			"insecureSkipVerify All and caCertificateRefs may not be set together"},
		{"two client certificates", tls, []string{"backend", "tls", "mtlsCertificateRef"},
			[]any{map[string]any{"name": "a"}, map[string]any{"name": "b"}}, "spec.backend.tls.mtlsCertificateRef: Too many"},
		{"traffic on a Service", tls, []string{"traffic"}, map[string]any{"extProc": map[string]any{"backendRef": map[string]any{"name": "x", "port": int64(1)}}},
			"the 'traffic' field can only target a Gateway, ListenerSet, GRPCRoute, HTTPRoute, or InferencePool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := tc.policy.DeepCopy()
			if tc.path != nil {
				path := append([]string{"spec"}, tc.path...)
				if tc.value == nil {
					unstructured.RemoveNestedField(o.Object, path...)
				} else if err := unstructured.SetNestedField(o.Object, tc.value, path...); err != nil {
					t.Fatal(err)
				}
			}
			err := fx.client.Create(context.Background(), o, client.DryRunAll, client.FieldValidation("Strict"))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted; want refused with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("refused with\n%v\nwant %q", err, tc.want)
			}
		})
	}
}

// trafficPolicy is the rendered AgentgatewayPolicy with spec.traffic.
func trafficPolicy(t *testing.T, objs []*unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	for _, o := range only(objs, "AgentgatewayPolicy") {
		if _, ok, _ := unstructured.NestedMap(o.Object, "spec", "traffic"); ok {
			return o
		}
	}
	t.Fatalf("no AgentgatewayPolicy with traffic (objects: %v)", kinds(objs))
	return nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
