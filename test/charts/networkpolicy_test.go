package charts

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The peers below are written out from what each gateway puts on its pods,
// not from the charts, so a template that drifts from them fails.

// gatewayPodsPeer: Istio and agentgateway label the Gateway pods they
// deploy with gateway.networking.k8s.io/gateway-name.
func gatewayPodsPeer() networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{},
		PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "gateway.networking.k8s.io/gateway-name", Operator: metav1.LabelSelectorOpExists},
		}},
	}
}

// envoyProxyPeer: Envoy Gateway v1.9's proxy pods (EnvoyAppLabel in its
// internal/infrastructure/kubernetes/proxy/resource.go).
func envoyProxyPeer() networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{},
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
			"app.kubernetes.io/name":       "envoy",
			"app.kubernetes.io/component":  "proxy",
			"app.kubernetes.io/managed-by": "envoy-gateway",
		}},
	}
}

// envoyGatewayControllerPeer: Envoy Gateway's controller pods, which call
// the extension server's hooks.
func envoyGatewayControllerPeer() networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"control-plane": "envoy-gateway"}},
	}
}

const npOn = `networkPolicy: {enabled: true}`

// customFrom is a networkPolicy.from value and the peers it must render
// as, unchanged.
const customFrom = `
networkPolicy:
  from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: gateways}}
      podSelector: {matchLabels: {app: my-gateway}}
    - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}
`

func customPeers() []networkingv1.NetworkPolicyPeer {
	return []networkingv1.NetworkPolicyPeer{
		{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "gateways"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "my-gateway"}},
		},
		{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}},
	}
}

const customMetricsFrom = `
networkPolicy:
  metricsFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
`

func customMetricsPeers() []networkingv1.NetworkPolicyPeer {
	return []networkingv1.NetworkPolicyPeer{
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}},
	}
}

// providerPeers are the default peers of the epp and payload charts; nil
// for none, which has no default.
func providerPeers(provider string) []networkingv1.NetworkPolicyPeer {
	switch provider {
	case "istio", "agentgateway":
		return []networkingv1.NetworkPolicyPeer{gatewayPodsPeer()}
	case "envoy-gateway":
		return []networkingv1.NetworkPolicyPeer{envoyProxyPeer()}
	}
	return nil
}

// npCase is one value set of a chart and the NetworkPolicy it must render.
type npCase struct {
	name string
	// values are value documents, merged in order.
	values []string
	// rendered: a NetworkPolicy is expected at all.
	rendered bool
	// from: peers of the gRPC rule. metricsFrom: peers of the metrics rule,
	// nil for any source.
	from, metricsFrom []networkingv1.NetworkPolicyPeer
}

// npChart is a chart under test: what it needs to render, its container,
// and whether it has a metrics port.
type npChart struct {
	dir, release, base, container string
	metrics                       bool
	cases                         []npCase
}

// gatewayCases are the cases of a chart with provider.name, whose values
// provider gives; otherPorts moves its ports, to show the rules follow the
// Deployment's ports rather than the defaults.
func gatewayCases(provider func(string) string, otherPorts string) []npCase {
	var cases []npCase
	for _, p := range providers {
		prov := provider(p)
		cases = append(cases,
			npCase{name: p + "/disabled", values: []string{prov}},
			npCase{name: p + "/custom from", values: []string{prov, npOn, customFrom}, rendered: true, from: customPeers()},
			npCase{name: p + "/metricsFrom", values: []string{prov, npOn, customFrom, customMetricsFrom}, rendered: true,
				from: customPeers(), metricsFrom: customMetricsPeers()},
		)
		// none has no default peers: TestNetworkPolicyBadValues.
		if p != "none" {
			cases = append(cases,
				npCase{name: p + "/defaults", values: []string{prov, npOn}, rendered: true, from: providerPeers(p)},
				npCase{name: p + "/other ports", values: []string{prov, npOn, otherPorts}, rendered: true, from: providerPeers(p)},
			)
		}
	}
	return cases
}

func npCharts() []npChart {
	egext := []npCase{
		{name: "disabled"},
		{name: "defaults", values: []string{npOn}, rendered: true, from: []networkingv1.NetworkPolicyPeer{envoyGatewayControllerPeer(), envoyProxyPeer()}},
		// Without EDS the proxies never call the extension.
		{name: "no EDS", values: []string{npOn, "egext: {eds: false}"}, rendered: true, from: []networkingv1.NetworkPolicyPeer{envoyGatewayControllerPeer()}},
		{name: "other port", values: []string{npOn, "egext: {port: 6006}"}, rendered: true, from: []networkingv1.NetworkPolicyPeer{envoyGatewayControllerPeer(), envoyProxyPeer()}},
		{name: "custom from", values: []string{npOn, customFrom}, rendered: true, from: customPeers()},
	}
	return []npChart{
		{dir: eppChartDir, release: "vllm-llama3", base: eppInstall, container: "epp", metrics: true,
			cases: gatewayCases(providerValues, "epp: {ports: {grpc: 9102, health: 9103, metrics: 9190}}")},
		{dir: payloadChartDir, release: "payload", container: "payload", metrics: true,
			cases: gatewayCases(payloadProvider, "payload: {ports: {grpc: 9104, health: 9105, metrics: 9191}}")},
		{dir: egextChartDir, release: "egext", container: "egext", cases: egext},
	}
}

// TestNetworkPolicy renders each chart's NetworkPolicy for every provider,
// lints it, dry-runs it against the API server, and checks it against the
// Deployment: the same pods, ingress only, the gRPC port from the gateway's
// pods (or networkPolicy.from), the metrics port from metricsFrom or
// anywhere, and nothing else.
func TestNetworkPolicy(t *testing.T) {
	for _, c := range npCharts() {
		ch := loadChart(t, c.dir)
		chartName := ch.Name()
		ns := namespace(t, "charts-np-"+strings.TrimPrefix(chartName, "infergate-"))
		for _, tc := range c.cases {
			t.Run(chartName+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				vals := values(t, append([]string{c.base}, tc.values...)...)
				objs := mustRender(t, ch, c.release, ns, vals)
				lintChart(t, c.dir, vals, ns)
				if !tc.rendered {
					if got := only(objs, "NetworkPolicy"); len(got) > 0 {
						t.Fatalf("rendered %d NetworkPolicies with networkPolicy.enabled false", len(got))
					}
					return
				}
				dryRun(t, ns, only(objs, "NetworkPolicy"))
				dep := one[appsv1.Deployment](t, objs, "Deployment")
				np := one[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy")
				checkNetworkPolicy(t, np, dep, c, tc)
			})
		}
	}
}

func checkNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy, dep *appsv1.Deployment, c npChart, tc npCase) {
	t.Helper()
	if len(tc.from) == 0 {
		t.Fatal("the case wants the gRPC port open to any source, which the charts never render")
	}
	if np.Name != dep.Name || np.Namespace != dep.Namespace {
		t.Errorf("NetworkPolicy %s/%s, want the chart's name %s/%s", np.Namespace, np.Name, dep.Namespace, dep.Name)
	}
	if !equality.Semantic.DeepEqual(np.Labels, dep.Labels) {
		t.Errorf("NetworkPolicy labels %v, want the chart's %v", np.Labels, dep.Labels)
	}
	want := metav1.LabelSelector{MatchLabels: dep.Spec.Selector.MatchLabels}
	if len(want.MatchLabels) == 0 || !equality.Semantic.DeepEqual(np.Spec.PodSelector, want) {
		t.Errorf("podSelector %s, want the Deployment's selector %s", toYAML(t, np.Spec.PodSelector), toYAML(t, want))
	}
	if got := np.Spec.PolicyTypes; len(got) != 1 || got[0] != networkingv1.PolicyTypeIngress {
		t.Errorf("policyTypes %v, want [Ingress] only: the pods must keep their egress", got)
	}

	ports := map[string]int32{}
	for _, p := range container(t, dep, c.container).Ports {
		ports[p.Name] = p.ContainerPort
	}
	tcp := func(name string) []networkingv1.NetworkPolicyPort {
		port, ok := ports[name]
		if !ok {
			t.Fatalf("container has no %s port: %v", name, ports)
		}
		proto := corev1.ProtocolTCP
		p := intstr.FromInt32(port)
		return []networkingv1.NetworkPolicyPort{{Protocol: &proto, Port: &p}}
	}
	wantRules := []networkingv1.NetworkPolicyIngressRule{{Ports: tcp("grpc"), From: tc.from}}
	if c.metrics {
		wantRules = append(wantRules, networkingv1.NetworkPolicyIngressRule{Ports: tcp("metrics"), From: tc.metricsFrom})
	}
	if !equality.Semantic.DeepEqual(np.Spec.Ingress, wantRules) {
		t.Errorf("ingress rules\n%s\nwant\n%s", toYAML(t, np.Spec.Ingress), toYAML(t, wantRules))
	}
}

func toYAML(t *testing.T, v any) string {
	t.Helper()
	out, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestNetworkPolicyBadValues: values the chart must refuse rather than
// render a policy that would cut the gateway off.
func TestNetworkPolicyBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, dir, base, values string
		want                    []string
	}{
		{"epp none without from", eppChartDir, eppInstall, `networkPolicy: {enabled: true}`, []string{"networkPolicy.from is required", "provider.name none"}},
		{"payload none without from", payloadChartDir, ``, `networkPolicy: {enabled: true}`, []string{"networkPolicy.from is required", "provider.name none"}},
		{"misspelt peer", eppChartDir, eppInstall, `networkPolicy: {enabled: true, from: [{podSelectors: {}}]}`, []string{"/networkPolicy/from/0", "podSelectors"}},
		{"empty peer", payloadChartDir, ``, `networkPolicy: {enabled: true, metricsFrom: [{}]}`, []string{"/networkPolicy/metricsFrom/0", "minProperties"}},
		{"ipBlock without cidr", eppChartDir, eppInstall, `networkPolicy: {enabled: true, from: [{ipBlock: {except: [10.1.0.0/16]}}]}`, []string{"/networkPolicy/from/0/ipBlock", "cidr"}},
		// The extension serves no metrics.
		{"egext metricsFrom", egextChartDir, ``, `networkPolicy: {enabled: true, metricsFrom: [{podSelector: {}}]}`, []string{"metricsFrom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := loadChart(t, tc.dir)
			ns := namespace(t, "charts-np-bad")
			wantError(t, ch, tc.dir, ns, values(t, tc.base, tc.values), tc.want)
		})
	}
}
