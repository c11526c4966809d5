package charts

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	eppconfig "github.com/infergate/infergate/extproc/epp/config"
	"github.com/infergate/infergate/extproc/epp/kube"
)

// eppInstall are the values of the README's install command.
const eppInstall = `
inferencePool:
  targetPorts: [{number: 8000}]
  modelServers:
    matchLabels: {app: vllm-llama3}
`

// eppConfig is a custom EndpointPickerConfig: a label filter ahead of
// the scorers, and flow control on.
const eppConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: label-selector-filter
  parameters:
    matchLabels: {gpu: a100}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: label-selector-filter
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: max-score-picker
`

// eppWant is what a value set must render.
type eppWant struct {
	pool     string // InferencePool name and --pool-name
	replicas int32
	// leaderElection: several replicas active-passive; peersSecret: the
	// active-active replicas' key is mounted from this Secret.
	leaderElection bool
	peersSecret    string
	failureMode    inferencev1.EndpointPickerFailureMode
	targetPorts    []int32
	appProtocol    inferencev1.AppProtocol
	config         bool // ConfigMap, --config-file, mounted
	certs          bool // --cert-path and the Secret mounted
	plaintext      bool // --secure-serving=false
	podMonitor     bool
	moreArgs       []string // flags the value set adds
	serving        servingWant
}

var eppValueSets = []struct {
	name   string
	values string
	want   eppWant
}{
	{"defaults", ``, eppWant{replicas: 1}},
	{"replicas 3", `epp: {replicas: 3}`, eppWant{replicas: 3}},
	{"replicas 2 leader election", `epp: {replicas: 2, ha: {mode: leaderElection}}`, eppWant{replicas: 2, leaderElection: true}},
	{"replicas 2 encrypted", `epp: {replicas: 2, ha: {secretName: peers-key}}`, eppWant{replicas: 2, peersSecret: "peers-key"}},
	{"custom config", "epp:\n  config: |\n" + indent(eppConfig, "    "), eppWant{replicas: 1, config: true}},
	{"custom pool and picker", `
inferencePool:
  name: llama-pool
  targetPorts: [{number: 8000}, {number: 8001}, {number: 8002}]
  appProtocol: kubernetes.io/h2c
  failureMode: FailOpen
epp:
  tlsSecretName: epp-tls
  clientCASecretName: gw-ca
  refreshMetricsInterval: 100ms
  extraArgs: [--emit-endpoint-scores]
  env: [{name: GOGC, value: "200"}]
`, eppWant{pool: "llama-pool", replicas: 1, failureMode: inferencev1.EndpointPickerFailOpen, targetPorts: []int32{8000, 8001, 8002},
		appProtocol: inferencev1.AppProtocolH2C, certs: true, moreArgs: []string{"--emit-endpoint-scores", "--refresh-metrics-interval=100ms"},
		serving: servingWant{clientCA: "gw-ca"}}},
	{"mutual TLS", `epp: {clientCASecretName: gw-ca}`, eppWant{replicas: 1, serving: servingWant{clientCA: "gw-ca"}}},
	{"limits", `epp: {limits: {requestBufferBudgetBytes: 104857600, maxStreams: 500, maxStreamsPerConnection: 50, requestIdleTimeout: 2m30s, streamIdleTimeout: 1h}}`,
		eppWant{replicas: 1, serving: servingWant{budget: 104857600, maxStreams: "500", perConnection: "50", idleTimeout: "2m30s", streamIdle: "1h"}}},
	{"limits off", `epp: {limits: {maxStreams: 0, maxStreamsPerConnection: 0, requestIdleTimeout: 0, streamIdleTimeout: 0}}`, eppWant{replicas: 1, serving: servingWant{maxStreams: "0", perConnection: "0", idleTimeout: "0", streamIdle: "0"}}},
	{"grpc-go transport", `epp: {extprocTransport: grpc}`, eppWant{replicas: 1, serving: servingWant{transport: "grpc"}}},
	{"plaintext", `epp: {secureServing: false, tlsSecretName: ignored}`, eppWant{replicas: 1, plaintext: true}},
	{"podMonitor on", `podMonitor: {enabled: true, interval: 30s, labels: {release: prometheus}}`, eppWant{replicas: 1, podMonitor: true}},
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestEPPChart(t *testing.T) {
	ch := loadChart(t, eppChartDir)
	ns := namespace(t, "charts-epp")
	const release = "vllm-llama3"
	for _, provider := range providers {
		for _, vs := range eppValueSets {
			t.Run(provider+"/"+vs.name, func(t *testing.T) {
				t.Parallel()
				vals := values(t, eppInstall, vs.values, providerValues(provider))
				objs := mustRender(t, ch, release, ns, vals)
				want := vs.want
				if want.pool == "" {
					want.pool = release
				}
				if want.failureMode == "" {
					want.failureMode = inferencev1.EndpointPickerFailClose
				}
				if want.targetPorts == nil {
					want.targetPorts = []int32{8000}
				}
				if want.appProtocol == "" {
					want.appProtocol = inferencev1.AppProtocolHTTP
				}
				checkEPP(t, objs, ns, provider, want)
				lintChart(t, eppChartDir, vals, ns)
				dryRun(t, ns, objs)
			})
		}
	}
}

// TestEPPInstallCommand renders the README's install command, parsed by
// Helm's own --set parser, and checks the README still shows it.
func TestEPPInstallCommand(t *testing.T) {
	const command = "helm install vllm-llama3 charts/infergate-epp --set inferencePool.targetPorts[0].number=8000 --set inferencePool.modelServers.matchLabels.app=vllm-llama3"
	if block := readmeBlock(t, eppChartDir, "helm install vllm-llama3"); strings.TrimSpace(block) != command {
		t.Errorf("README install command is %q, want %q", strings.TrimSpace(block), command)
	}
	vals := map[string]any{}
	for _, set := range []string{"inferencePool.targetPorts[0].number=8000", "inferencePool.modelServers.matchLabels.app=vllm-llama3"} {
		if err := strvals.ParseInto(set, vals); err != nil {
			t.Fatalf("--set %s: %v", set, err)
		}
	}
	ch := loadChart(t, eppChartDir)
	ns := namespace(t, "charts-epp-install")
	objs := mustRender(t, ch, "vllm-llama3", ns, vals)
	pool := one[inferencev1.InferencePool](t, objs, "InferencePool")
	if pool.Name != "vllm-llama3" || pool.Spec.EndpointPickerRef.Name != "vllm-llama3-epp" {
		t.Errorf("pool %s picks with %s, want vllm-llama3 and vllm-llama3-epp", pool.Name, pool.Spec.EndpointPickerRef.Name)
	}
	if got := pool.Spec.Selector.MatchLabels; len(got) != 1 || got["app"] != "vllm-llama3" {
		t.Errorf("pool selector %v, want app=vllm-llama3", got)
	}
	lintChart(t, eppChartDir, vals, ns)
	dryRun(t, ns, objs)
}

func checkEPP(t *testing.T, objs []*unstructured.Unstructured, ns, provider string, want eppWant) {
	t.Helper()
	peers := want.replicas > 1 && !want.leaderElection
	wantKinds := []string{"Deployment", "InferencePool", "Role", "RoleBinding", "Service", "ServiceAccount"}
	if peers {
		wantKinds = append(wantKinds, "Service")
	}
	if want.config {
		wantKinds = append(wantKinds, "ConfigMap")
	}
	if provider == "istio" {
		wantKinds = append(wantKinds, "EnvoyFilter")
	}
	checkKinds(t, objs, wantKinds, want.podMonitor, provider == "istio" && !want.plaintext)

	dep := one[appsv1.Deployment](t, objs, "Deployment")
	svc := named[corev1.Service](t, objs, "Service", "vllm-llama3-epp")
	pool := one[inferencev1.InferencePool](t, objs, "InferencePool")
	sa := one[corev1.ServiceAccount](t, objs, "ServiceAccount")

	// The pool points at the picker's Service and its gRPC port.
	ref := pool.Spec.EndpointPickerRef
	grpcPort := servicePort(t, svc, "grpc")
	if ref == nil || ref.Name != inferencev1.ObjectName(svc.Name) || ref.Kind != "Service" || ref.Group != nil && *ref.Group != "" {
		t.Fatalf("endpointPickerRef %+v does not name Service %s", ref, svc.Name)
	}
	if ref.Port == nil || int32(ref.Port.Number) != grpcPort.Port {
		t.Errorf("endpointPickerRef port %+v, want the Service's grpc port %d", ref.Port, grpcPort.Port)
	}
	if ref.FailureMode != want.failureMode {
		t.Errorf("failureMode %q, want %q", ref.FailureMode, want.failureMode)
	}
	if pool.Name != want.pool {
		t.Errorf("pool name %s, want %s", pool.Name, want.pool)
	}
	var ports []int32
	for _, p := range pool.Spec.TargetPorts {
		ports = append(ports, int32(p.Number))
	}
	if !slices.Equal(ports, want.targetPorts) {
		t.Errorf("targetPorts %v, want %v", ports, want.targetPorts)
	}
	if pool.Spec.AppProtocol != want.appProtocol {
		t.Errorf("appProtocol %q, want %q", pool.Spec.AppProtocol, want.appProtocol)
	}
	if got := pool.Spec.Selector.MatchLabels; got["app"] != "vllm-llama3" {
		t.Errorf("pool selector %v, want app=vllm-llama3", got)
	}

	// The Service reaches the picker's pods: ClusterIP, gRPC as HTTP/2.
	if svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("Service type %s", svc.Spec.Type)
	}
	if grpcPort.AppProtocol == nil || *grpcPort.AppProtocol != "http2" || grpcPort.TargetPort.StrVal != "grpc" {
		t.Errorf("Service grpc port %+v, want appProtocol http2 to the grpc container port", grpcPort)
	}
	if m := servicePort(t, svc, "metrics"); m.TargetPort.StrVal != "metrics" {
		t.Errorf("Service metrics port %+v", m)
	}
	podLabels := labels.Set(dep.Spec.Template.Labels)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, podLabels)
	}
	if sel := dep.Spec.Selector.MatchLabels; !labels.SelectorFromSet(sel).Matches(podLabels) {
		t.Errorf("Deployment selector %v does not select its pods %v", sel, podLabels)
	}

	// The Deployment.
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != want.replicas {
		t.Errorf("replicas %v, want %d", dep.Spec.Replicas, want.replicas)
	}
	if dep.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("pods run as %q, the chart's ServiceAccount is %q", dep.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	c := container(t, dep, "epp")
	args := c.Args
	if len(args) == 0 || args[0] != "epp" {
		t.Fatalf("args %v do not start with the epp subcommand", args)
	}
	wantArgs := []string{
		"--pool-name=" + want.pool, "--pool-namespace=" + ns,
		"--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090",
		fmt.Sprintf("--secure-serving=%t", !want.plaintext),
		"--max-request-body-bytes=16777216", "--drain-timeout=30s", "--shutdown-delay=5s",
	}
	wantArgs = append(wantArgs, want.moreArgs...)
	for _, a := range wantArgs {
		if !slices.Contains(args, a) {
			t.Errorf("args %v lack %s", args, a)
		}
	}
	leader := want.replicas > 1 && want.leaderElection
	if got := slices.Contains(args, "--ha-enable-leader-election"); got != leader {
		t.Errorf("--ha-enable-leader-election passed: %t, want %t with %d replicas", got, leader, want.replicas)
	}
	if got := dep.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType; got != leader {
		t.Errorf("strategy %q with %d replicas; want Recreate exactly when leader election is on", dep.Spec.Strategy.Type, want.replicas)
	}
	checkPeers(t, objs, dep, c, ns, peers, want.peersSecret)
	if got := slices.Contains(args, "--config-file=/config/epp.yaml"); got != want.config {
		t.Errorf("--config-file passed: %t, want %t", got, want.config)
	}
	if got := slices.Contains(args, "--cert-path=/certs"); got != want.certs {
		t.Errorf("--cert-path passed: %t, want %t", got, want.certs)
	}
	if got := hasMount(c, "/config"); got != want.config {
		t.Errorf("/config mounted: %t, want %t", got, want.config)
	}
	if got := hasMount(c, "/certs"); got != want.certs {
		t.Errorf("/certs mounted: %t, want %t", got, want.certs)
	}
	checkServing(t, dep, c, want.serving)
	containerPorts := map[string]int32{"grpc": 9002, "health": 9003, "metrics": 9090}
	if peers {
		containerPorts["peers"], containerPorts["peers-udp"] = 7946, 7946
	}
	checkContainer(t, dep, c, containerPorts)
	if c.Resources.Requests.Cpu().Cmp(resource.MustParse("500m")) != 0 || c.Resources.Limits.Memory().Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("resources %+v, want the values' defaults", c.Resources)
	}
	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 50 {
		t.Errorf("terminationGracePeriodSeconds %v, want drain 30 + shutdown delay 5 + 15", g)
	}

	// RBAC: exactly what the code says it needs, bound to the pods' account.
	role := one[rbacv1.Role](t, objs, "Role")
	got, err := ruleSet(role.Rules)
	if err != nil {
		t.Errorf("Role: %v", err)
	}
	wantRules, err := ruleSet(kube.RoleRules())
	if err != nil {
		t.Fatalf("kube.RoleRules: %v", err)
	}
	if !reflect.DeepEqual(got, wantRules) {
		t.Errorf("Role grants %v\nkube.RoleRules() needs %v", keys(got), keys(wantRules))
	}
	checkBinding(t, one[rbacv1.RoleBinding](t, objs, "RoleBinding"), "Role", role.Name, sa.Name, ns)

	if want.config {
		cm := one[corev1.ConfigMap](t, objs, "ConfigMap")
		if !mountsConfigMap(dep, "/config", cm.Name) {
			t.Errorf("/config is not ConfigMap %s", cm.Name)
		}
		text := cm.Data["epp.yaml"]
		if strings.TrimSpace(text) != strings.TrimSpace(eppConfig) {
			t.Errorf("epp.yaml is\n%s\nwant the value\n%s", text, eppConfig)
		}
		// The picker's own loader accepts what the chart mounts.
		if _, err := eppconfig.Load([]byte(text)); err != nil {
			t.Errorf("rendered epp.yaml does not load: %v", err)
		}
		if dep.Spec.Template.Annotations["checksum/config"] == "" {
			t.Errorf("no checksum/config annotation: pods would not restart on a config change")
		}
	}
	if want.podMonitor {
		checkPodMonitor(t, objs, dep)
	}
	if provider == "istio" && !want.plaintext {
		checkDestinationRule(t, objs, svc.Name+"."+ns+".svc.cluster.local")
	}
	if provider == "istio" {
		checkInferenceFilter(t, objs, ns, "inference-gateway")
	}
}

// providerValues is the provider values of a test install: Istio needs
// the Gateway its EnvoyFilters go to (the picker's inference filter, the
// payload processor's filter).
func providerValues(name string) string {
	if name == "istio" {
		return "provider: {name: istio, istio: {gateway: {name: inference-gateway}}}"
	}
	return "provider: {name: " + name + "}"
}

// checkInferenceFilter: on the Gateway's pods, in namespace ns, the
// listener's envoy.filters.http.ext_proc is removed and put back as istiod
// builds it (pilot/pkg/xds/filters/filters.go InferencePoolExtProc) where
// istiod puts it, right before envoy.filters.http.grpc_stats and so ahead
// of fault, cors and telemetry (pilot/pkg/networking/core/
// listener_builder.go buildHTTPConnectionManager): dormant (cluster "dummy", headers skipped) until
// a route's override turns it on, failing open, with the envoy.lb
// metadata namespace received and forwarded. TestIstioInferenceFilter
// compares it with istiod's own, field by field.
func checkInferenceFilter(t *testing.T, objs []*unstructured.Unstructured, ns, gateway string) {
	t.Helper()
	ef := only(objs, "EnvoyFilter")[0]
	if ef.GetAPIVersion() != "networking.istio.io/v1alpha3" || ef.GetNamespace() != ns || !strings.HasSuffix(ef.GetName(), "-epp-inference-filter") {
		t.Errorf("EnvoyFilter %s %s/%s", ef.GetAPIVersion(), ef.GetNamespace(), ef.GetName())
	}
	if sel, _, _ := unstructured.NestedStringMap(ef.Object, "spec", "workloadSelector", "labels"); sel["gateway.networking.k8s.io/gateway-name"] != gateway || len(sel) != 1 {
		t.Errorf("workloadSelector %v, want the pods of Gateway %s", sel, gateway)
	}
	patches, _, _ := unstructured.NestedSlice(ef.Object, "spec", "configPatches")
	if len(patches) != 2 {
		t.Fatalf("configPatches %v, want a REMOVE and an INSERT_BEFORE", patches)
	}
	const hcm, filter = "envoy.filters.network.http_connection_manager", "envoy.filters.http.ext_proc"
	for _, c := range []struct {
		patch int
		path  []string
		want  any
	}{
		{0, []string{"applyTo"}, "HTTP_FILTER"},
		{0, []string{"match", "context"}, "GATEWAY"},
		{0, []string{"match", "listener", "filterChain", "filter", "name"}, hcm},
		{0, []string{"match", "listener", "filterChain", "filter", "subFilter", "name"}, filter},
		{0, []string{"patch", "operation"}, "REMOVE"},
		{1, []string{"applyTo"}, "HTTP_FILTER"},
		{1, []string{"match", "context"}, "GATEWAY"},
		{1, []string{"match", "listener", "filterChain", "filter", "name"}, hcm},
		{1, []string{"match", "listener", "filterChain", "filter", "subFilter", "name"}, "envoy.filters.http.grpc_stats"},
		{1, []string{"patch", "operation"}, "INSERT_BEFORE"},
		{1, []string{"patch", "value", "name"}, filter},
		{1, []string{"patch", "value", "typed_config", "grpc_service", "envoy_grpc", "cluster_name"}, "dummy"},
		{1, []string{"patch", "value", "typed_config", "failure_mode_allow"}, true},
		{1, []string{"patch", "value", "typed_config", "processing_mode", "request_header_mode"}, "SKIP"},
		{1, []string{"patch", "value", "typed_config", "processing_mode", "response_header_mode"}, "SKIP"},
	} {
		if got, _, _ := unstructured.NestedFieldNoCopy(patches[c.patch].(map[string]any), c.path...); got != c.want {
			t.Errorf("patch %d: %s = %v, want %v", c.patch, strings.Join(c.path, "."), got, c.want)
		}
	}
}

// TestEPPIstioInferenceFilter: the EnvoyFilter goes to the Gateway's
// namespace when it is named, and is not rendered (nor the Gateway
// required) with inferenceFilter off. TestEPPChart has the API server
// check it.
func TestEPPIstioInferenceFilter(t *testing.T) {
	ch := loadChart(t, eppChartDir)
	ns := namespace(t, "charts-epp-istio")
	gwNS := namespace(t, "charts-epp-istio-gw")
	objs := mustRender(t, ch, "llama", ns, values(t, eppInstall, "provider: {name: istio, istio: {gateway: {name: gw, namespace: "+gwNS+"}}}"))
	checkInferenceFilter(t, objs, gwNS, "gw")
	objs = mustRender(t, ch, "llama", ns, values(t, eppInstall, "provider: {name: istio, istio: {inferenceFilter: false}}"))
	if got := only(objs, "EnvoyFilter"); len(got) != 0 {
		t.Errorf("inferenceFilter false rendered %d EnvoyFilters", len(got))
	}
}

// TestEPPRoleGrantsAccount creates the RBAC objects for real and asks the
// API server's authorizer what the picker's ServiceAccount may do: every
// permission of kube.RoleRules() in its namespace, and nothing else.
func TestEPPRoleGrantsAccount(t *testing.T) {
	ch := loadChart(t, eppChartDir)
	ns := namespace(t, "charts-epp-rbac")
	other := namespace(t, "charts-epp-rbac-other")
	objs := mustRender(t, ch, "rbac", ns, values(t, eppInstall))
	apply(t, only(objs, "ServiceAccount", "Role", "RoleBinding"))
	sa := one[corev1.ServiceAccount](t, objs, "ServiceAccount")
	user := "system:serviceaccount:" + ns + ":" + sa.Name
	need, err := ruleSet(kube.RoleRules())
	if err != nil {
		t.Fatal(err)
	}
	for r := range need {
		if !eventuallyAllowed(t, user, ns, ns, r) {
			t.Errorf("%s may not %s", user, r)
		}
	}
	for _, r := range []access{
		{"", "pods", "delete"}, {"", "pods", "create"}, {"", "secrets", "get"}, {"", "configmaps", "list"},
		{"inference.networking.k8s.io", "inferencepools", "update"}, {"coordination.k8s.io", "leases", "delete"},
	} {
		if allowed(t, user, ns, ns, r) {
			t.Errorf("%s may %s, which the picker does not need", user, r)
		}
	}
	if allowed(t, user, ns, other, access{"", "pods", "list"}) {
		t.Errorf("%s may list pods in another namespace", user)
	}
}

func TestEPPBadValues(t *testing.T) {
	ch := loadChart(t, eppChartDir)
	ns := namespace(t, "charts-epp-bad")
	for _, tc := range []struct {
		name, values string
		want         []string
	}{
		{"unknown provider", `provider: {name: nginx}`, []string{"/provider/name", "must be one of"}},
		{"istio without its gateway", `provider: {name: istio}`, []string{"/provider/istio", "gateway"}},
		{"istio with an empty gateway name", `provider: {name: istio, istio: {gateway: {name: ""}}}`, []string{"/provider/istio/gateway/name"}},
		{"istio gateway name not a name", `provider: {name: istio, istio: {gateway: {name: "gw; x"}}}`, []string{"/provider/istio/gateway/name"}},
		{"negative replicas", `epp: {replicas: -1}`, []string{"/epp/replicas", "minimum"}},
		{"unknown ha mode", `epp: {ha: {mode: both}}`, []string{"/epp/ha/mode"}},
		{"failureMode Maybe", `inferencePool: {failureMode: Maybe}`, []string{"/inferencePool/failureMode", "must be one of"}},
		{"no pod selector", `inferencePool: {modelServers: {matchLabels: null}}`, []string{"/inferencePool/modelServers/matchLabels"}},
		{"duplicate target ports", `inferencePool: {targetPorts: [{number: 8000}, {number: 8000}]}`, []string{"/inferencePool/targetPorts", "are equal"}},
		{"nine target ports", `inferencePool: {targetPorts: [{number: 1}, {number: 2}, {number: 3}, {number: 4}, {number: 5}, {number: 6}, {number: 7}, {number: 8}, {number: 9}]}`,
			[]string{"/inferencePool/targetPorts", "maxItems"}},
		{"port out of range", `epp: {ports: {grpc: 70000}}`, []string{"/epp/ports/grpc", "maximum"}},
		{"unknown appProtocol", `inferencePool: {appProtocol: grpc}`, []string{"/inferencePool/appProtocol"}},
		{"misspelt value", `epp: {replica: 2}`, []string{"replica"}},
		{"unknown top-level value", `eppp: {replicas: 2}`, []string{"eppp"}},
		{"bad duration", `epp: {metricsStalenessThreshold: 2 seconds}`, []string{"/epp/metricsStalenessThreshold"}},
		{"config not YAML", "epp: {config: \"plugins: [\"}", []string{"epp.config is not valid YAML"}},
		{"config not an EndpointPickerConfig", "epp: {config: \"kind: Pod\"}", []string{"epp.config must be an EndpointPickerConfig"}},
		{"ports collide", `epp: {ports: {health: 9002}}`, []string{"epp.ports must be three different ports"}},
		{"client CA without TLS", `epp: {secureServing: false, clientCASecretName: gw-ca}`, []string{"epp.clientCASecretName", "epp.secureServing"}},
		{"negative maxStreams", `epp: {limits: {maxStreams: -1}}`, []string{"/epp/limits/maxStreams", "minimum"}},
		{"negative maxStreamsPerConnection", `epp: {limits: {maxStreamsPerConnection: -1}}`, []string{"/epp/limits/maxStreamsPerConnection", "minimum"}},
		{"stream idle timeout soon", `epp: {limits: {streamIdleTimeout: soon}}`, []string{"/epp/limits/streamIdleTimeout", "does not match pattern"}},
		{"unknown transport", `epp: {extprocTransport: quic}`, []string{"/epp/extprocTransport"}},
		{"negative buffer budget", `epp: {limits: {requestBufferBudgetBytes: -1}}`, []string{"/epp/limits/requestBufferBudgetBytes", "minimum"}},
		{"idle timeout soon", `epp: {limits: {requestIdleTimeout: soon}}`, []string{"/epp/limits/requestIdleTimeout", "does not match pattern"}},
		{"idle timeout without unit", `epp: {limits: {requestIdleTimeout: 30}}`, []string{"/epp/limits/requestIdleTimeout", "maximum"}},
		{"negative idle timeout", `epp: {limits: {requestIdleTimeout: -5s}}`, []string{"/epp/limits/requestIdleTimeout"}},
		{"misspelt limit", `epp: {limits: {maxStream: 5}}`, []string{"maxStream"}},
		{"limits dropped", `epp: {limits: null}`, []string{"/epp", "limits"}},
		{"no account", `serviceAccount: {create: false}`, []string{"/serviceAccount/name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wantError(t, ch, eppChartDir, ns, values(t, eppInstall, tc.values), tc.want)
		})
	}
}

func TestEPPReadmeValues(t *testing.T) { readmeValues(t, eppChartDir) }

// Helpers shared with the payload chart's tests.

func servicePort(t *testing.T, svc *corev1.Service, name string) corev1.ServicePort {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("Service %s has no port %s", svc.Name, name)
	return corev1.ServicePort{}
}

func container(t *testing.T, dep *appsv1.Deployment, name string) *corev1.Container {
	t.Helper()
	cs := dep.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != name {
		t.Fatalf("Deployment %s containers %v, want one named %s", dep.Name, cs, name)
	}
	return &cs[0]
}

func hasMount(c *corev1.Container, path string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return true
		}
	}
	return false
}

func mountsConfigMap(dep *appsv1.Deployment, path, configMap string) bool {
	c := dep.Spec.Template.Spec.Containers[0]
	for _, m := range c.VolumeMounts {
		if m.MountPath != path || m.SubPath != "" {
			continue
		}
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == configMap {
				return true
			}
		}
	}
	return false
}

// checkContainer checks what both charts' containers share: named ports,
// gRPC probes on the plain health port (readiness and liveness services),
// and a locked-down security context.
func checkContainer(t *testing.T, dep *appsv1.Deployment, c *corev1.Container, ports map[string]int32) {
	t.Helper()
	got := map[string]int32{}
	for _, p := range c.Ports {
		got[p.Name] = p.ContainerPort
	}
	if !reflect.DeepEqual(got, ports) {
		t.Errorf("container ports %v, want %v", got, ports)
	}
	for _, p := range []struct {
		name    string
		probe   *corev1.Probe
		service string
	}{{"readiness", c.ReadinessProbe, "readiness"}, {"liveness", c.LivenessProbe, "liveness"}} {
		if p.probe == nil || p.probe.GRPC == nil {
			t.Errorf("%s probe %+v is not gRPC", p.name, p.probe)
			continue
		}
		if p.probe.GRPC.Port != ports["health"] || p.probe.GRPC.Service == nil || *p.probe.GRPC.Service != p.service {
			t.Errorf("%s probe %+v, want gRPC service %q on port %d", p.name, p.probe.GRPC, p.service, ports["health"])
		}
	}
	sc := c.SecurityContext
	pod := dep.Spec.Template.Spec.SecurityContext
	switch {
	case sc == nil || pod == nil:
		t.Fatalf("no security context (pod %v, container %v)", pod, sc)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || pod.RunAsNonRoot == nil || !*pod.RunAsNonRoot:
		t.Errorf("not runAsNonRoot")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("root file system not read-only")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("privilege escalation allowed")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v, want drop ALL", sc.Capabilities)
	}
}

// servingWant is what both charts' ext_proc listener flags must be; the
// zero value is the defaults.
type servingWant struct {
	// clientCA is the Secret of clientCASecretName: --client-ca-file and
	// its ca.crt mounted read-only at /client-ca. Empty: neither.
	clientCA string
	// budget is --request-buffer-budget; 0: the flag left out.
	budget int64
	// maxStreams, perConnection, idleTimeout, streamIdle and transport
	// are --max-streams, --max-streams-per-connection,
	// --request-idle-timeout, --stream-idle-timeout and
	// --extproc-transport; empty: the defaults, 10000, 1000, 30s, 15m and
	// auto.
	maxStreams, perConnection, idleTimeout, streamIdle, transport string
}

// checkServing checks the mutual-TLS and limit flags, and that the client
// CA Secret is mounted where --client-ca-file points.
func checkServing(t *testing.T, dep *appsv1.Deployment, c *corev1.Container, want servingWant) {
	t.Helper()
	if want.maxStreams == "" {
		want.maxStreams = "10000"
	}
	if want.idleTimeout == "" {
		want.idleTimeout = "30s"
	}
	if want.perConnection == "" {
		want.perConnection = "1000"
	}
	if want.streamIdle == "" {
		want.streamIdle = "15m"
	}
	if want.transport == "" {
		want.transport = "auto"
	}
	for _, f := range []struct {
		flag string
		want []string // every value passed, in order
	}{
		{"--max-streams", []string{want.maxStreams}},
		{"--request-idle-timeout", []string{want.idleTimeout}},
		{"--max-streams-per-connection", []string{want.perConnection}},
		{"--stream-idle-timeout", []string{want.streamIdle}},
		{"--extproc-transport", []string{want.transport}},
		{"--request-buffer-budget", nonEmpty(want.budget != 0, fmt.Sprint(want.budget))},
		{"--client-ca-file", nonEmpty(want.clientCA != "", "/client-ca/ca.crt")},
	} {
		if got := flagValues(c.Args, f.flag); !slices.Equal(got, f.want) {
			t.Errorf("%s passed as %q, want %q (args %v)", f.flag, got, f.want, c.Args)
		}
	}

	var mounts []corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/client-ca" {
			mounts = append(mounts, m)
		}
	}
	if want.clientCA == "" {
		if len(mounts) > 0 {
			t.Errorf("/client-ca mounted without clientCASecretName: %+v", mounts)
		}
		return
	}
	if len(mounts) != 1 {
		t.Fatalf("/client-ca mounted %d times, want once from Secret %s", len(mounts), want.clientCA)
	}
	m := mounts[0]
	if !m.ReadOnly || m.SubPath != "" {
		t.Errorf("/client-ca mount %+v, want read-only, the whole volume", m)
	}
	var vol *corev1.Volume
	for i, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == m.Name {
			vol = &dep.Spec.Template.Spec.Volumes[i]
		}
	}
	switch {
	case vol == nil:
		t.Errorf("/client-ca mounts volume %s, which the pod does not have", m.Name)
	case vol.Secret == nil || vol.Secret.SecretName != want.clientCA:
		t.Errorf("/client-ca is volume %+v, want Secret %s", vol.VolumeSource, want.clientCA)
	case len(vol.Secret.Items) > 0 && !slices.Contains(vol.Secret.Items, corev1.KeyToPath{Key: "ca.crt", Path: "ca.crt"}):
		// Items, when listed, are all that is mounted: ca.crt must be
		// one of them, at the path --client-ca-file names.
		t.Errorf("Secret %s items %+v lack ca.crt at ca.crt", want.clientCA, vol.Secret.Items)
	}
}

// flagValues returns the values of every --flag=value in args.
func flagValues(args []string, flag string) []string {
	var out []string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// nonEmpty is []string{v} when ok, else nil.
func nonEmpty(ok bool, v string) []string {
	if !ok {
		return nil
	}
	return []string{v}
}

func checkBinding(t *testing.T, b *rbacv1.RoleBinding, roleKind, roleName, account, ns string) {
	t.Helper()
	if b.RoleRef.Kind != roleKind || b.RoleRef.Name != roleName {
		t.Errorf("%s binds %s %s, want %s %s", b.Name, b.RoleRef.Kind, b.RoleRef.Name, roleKind, roleName)
	}
	want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: account, Namespace: ns}}
	if !reflect.DeepEqual(b.Subjects, want) {
		t.Errorf("%s subjects %+v, want %+v", b.Name, b.Subjects, want)
	}
}

func checkPodMonitor(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment) {
	t.Helper()
	pm := only(objs, "PodMonitor")[0]
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	if len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("PodMonitor selector %v does not select the pods %v", sel, dep.Spec.Template.Labels)
	}
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "metrics" || eps[0].(map[string]any)["interval"] != "30s" {
		t.Errorf("PodMonitor endpoints %v, want the metrics port every 30s", eps)
	}
	if pm.GetLabels()["release"] != "prometheus" {
		t.Errorf("PodMonitor labels %v lack podMonitor.labels", pm.GetLabels())
	}
}

func checkDestinationRule(t *testing.T, objs []*unstructured.Unstructured, host string) {
	t.Helper()
	checkDestinationRuleTLS(t, objs, host, "SIMPLE", "")
}

// checkDestinationRuleTLS: the DestinationRule for host originates TLS in
// mode, presenting the credential named (MUTUAL) or none.
func checkDestinationRuleTLS(t *testing.T, objs []*unstructured.Unstructured, host, wantMode, wantCredential string) {
	t.Helper()
	dr := only(objs, "DestinationRule")[0]
	if dr.GetAPIVersion() != "networking.istio.io/v1" {
		t.Errorf("DestinationRule apiVersion %s", dr.GetAPIVersion())
	}
	got, _, _ := unstructured.NestedString(dr.Object, "spec", "host")
	mode, _, _ := unstructured.NestedString(dr.Object, "spec", "trafficPolicy", "tls", "mode")
	skip, _, _ := unstructured.NestedBool(dr.Object, "spec", "trafficPolicy", "tls", "insecureSkipVerify")
	cred, _, _ := unstructured.NestedString(dr.Object, "spec", "trafficPolicy", "tls", "credentialName")
	if got != host || mode != wantMode || !skip || cred != wantCredential {
		t.Errorf("DestinationRule host %q tls %q credentialName %q insecureSkipVerify %t; want %q, %s, %q, true",
			got, mode, cred, skip, host, wantMode, wantCredential)
	}
}

// access is one permission: API group, resource, verb.
type access struct{ group, resource, verb string }

func (a access) String() string {
	if a.group == "" {
		return a.verb + " " + a.resource
	}
	return a.verb + " " + a.resource + "." + a.group
}

// ruleSet expands rules into the permissions they grant, so that two rule
// lists compare equal when they grant the same, however they are split.
func ruleSet(rules []rbacv1.PolicyRule) (map[access]bool, error) {
	set := map[access]bool{}
	for i, r := range rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			return nil, fmt.Errorf("rule %d: resourceNames/nonResourceURLs are not expected", i)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if g == "*" || res == "*" || v == "*" {
						return nil, fmt.Errorf("rule %d: wildcard %q/%q/%q", i, g, res, v)
					}
					set[access{g, res, v}] = true
				}
			}
		}
	}
	return set, nil
}

func keys(set map[access]bool) []string {
	var out []string
	for a := range set {
		out = append(out, a.String())
	}
	sort.Strings(out)
	return out
}

// allowed asks the API server's authorizer whether user may do a in ns.
// eventuallyAllowed is allowed for a grant just created: the API server's
// authorizer sees new Roles and RoleBindings through an informer, a moment
// after they are stored, so a denial is asked again for up to 5 seconds.
// Denials that must hold are checked with allowed after a grant was seen.
func eventuallyAllowed(t *testing.T, user, userNS, ns string, a access) bool {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if allowed(t, user, userNS, ns, a) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// allowedExpecting asks with eventuallyAllowed when a grant is expected.
func allowedExpecting(t *testing.T, user, userNS, ns string, a access, want bool) bool {
	t.Helper()
	if want {
		return eventuallyAllowed(t, user, userNS, ns, a)
	}
	return allowed(t, user, userNS, ns, a)
}

func allowed(t *testing.T, user, userNS, ns string, a access) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + userNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Group: a.group, Resource: a.resource, Verb: a.verb,
		},
	}}
	if err := fx.client.Create(context.Background(), sar); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return sar.Status.Allowed
}

// checkPeers: active-active replicas find each other through a headless
// Service that lists every pod, ready or not, and bind, advertise and join
// on the peers port; without them nothing of this is rendered.
func checkPeers(t *testing.T, objs []*unstructured.Unstructured, dep *appsv1.Deployment, c *corev1.Container, ns string, peers bool, secret string) {
	t.Helper()
	wantArgs := []string{"--peers-bind-address=:7946", "--peers-advertise-address=$(POD_IP):7946",
		"--peers=vllm-llama3-epp-peers." + ns + ".svc:7946"}
	for _, a := range wantArgs {
		if slices.Contains(c.Args, a) != peers {
			t.Errorf("%s passed: %t, want %t", a, !peers, peers)
		}
	}
	if got := slices.Contains(c.Args, "--peers-secret-file=/peers-secret/key"); got != (secret != "") {
		t.Errorf("--peers-secret-file passed: %t, want %t", got, secret != "")
	}
	if got := hasMount(c, "/peers-secret"); got != (secret != "") {
		t.Errorf("/peers-secret mounted: %t, want %t", got, secret != "")
	}
	if !peers {
		return
	}
	podIP := false
	for _, e := range c.Env {
		podIP = podIP || e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
	}
	if !podIP {
		t.Errorf("env %v lacks POD_IP from status.podIP, which the advertised address reads", c.Env)
	}
	svc := named[corev1.Service](t, objs, "Service", "vllm-llama3-epp-peers")
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("peers Service: clusterIP %q, publishNotReadyAddresses %t; want a headless Service listing pods not yet ready", svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("peers Service selector %v does not select the pods", svc.Spec.Selector)
	}
	protocols := map[corev1.Protocol]bool{}
	for _, p := range svc.Spec.Ports {
		if p.Port == 7946 {
			protocols[p.Protocol] = true
		}
	}
	if !protocols[corev1.ProtocolTCP] || !protocols[corev1.ProtocolUDP] {
		t.Errorf("peers Service ports %+v, want 7946 over TCP and UDP (memberlist uses both)", svc.Spec.Ports)
	}
}
