package charts

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/inference/policy"
)

// payloadPolicy is a policy touching every section.
const payloadPolicy = `
payload:
  config:
    models:
      bases:
        - name: meta-llama/Llama-3.1-8B-Instruct
          adapters: [sql-lora, food-review]
      unknown: reject
      allow: [meta-llama/*, sql-lora, food-review]
    limits:
      maxBodyBytes: 1048576
      maxPromptTokens: 32000
      maxTokens: 4096
      maxTokensAction: clamp
    pii:
      - {name: email, detector: email, action: mask}
      - {name: ssn, detector: ssn, action: reject}
      - {name: employee-id, pattern: 'EMP-[0-9]{6}', action: mask, replacement: EMP-XXXXXX}
    deny:
      - name: prompt-injection
        contains: ["ignore previous instructions"]
        regex: '(?i)\byou are now DAN\b'
        message: this request was refused
`

// payloadWant is what a value set must render.
type payloadWant struct {
	replicas int32
	// configMapNS is --configmap-namespace ("" for none); "<ns>" stands
	// for the release namespace.
	configMapNS string
	// roleKind is Role, ClusterRole or "" (no RBAC).
	roleKind   string
	policy     bool // the ConfigMap holds payloadPolicy
	podMonitor bool
	plaintext  bool
	certs      bool // --cert-path and the TLS Secret mounted at /certs
	serving    servingWant
}

var payloadValueSets = []struct {
	name   string
	values string
	want   payloadWant
}{
	{"defaults", ``, payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role"}},
	{"replicas 3", `payload: {replicas: 3}`, payloadWant{replicas: 3, configMapNS: "<ns>", roleKind: "Role"}},
	{"custom config", payloadPolicy, payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role", policy: true}},
	{"multiNamespace", `payload: {adapterConfigMaps: {multiNamespace: true}}`, payloadWant{replicas: 1, configMapNS: "*", roleKind: "ClusterRole"}},
	{"adapter ConfigMaps off", `payload: {adapterConfigMaps: {enabled: false}}`, payloadWant{replicas: 1}},
	{"plaintext", `payload: {secureServing: false}`, payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role", plaintext: true}},
	{"podMonitor on", `podMonitor: {enabled: true, interval: 30s, labels: {release: prometheus}}`, payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role", podMonitor: true}},
	{"mutual TLS", `payload: {clientCASecretName: gw-ca}`, payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role", serving: servingWant{clientCA: "gw-ca"}}},
	{"mutual TLS with own certificate", `payload: {tlsSecretName: payload-tls, clientCASecretName: gw-ca}`,
		payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role", certs: true, serving: servingWant{clientCA: "gw-ca"}}},
	{"limits", `payload: {limits: {requestBufferBudgetBytes: 104857600, maxStreams: 500, maxStreamsPerConnection: 50, requestIdleTimeout: 2m30s, streamIdleTimeout: 1h}}`,
		payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role", serving: servingWant{budget: 104857600, maxStreams: "500", perConnection: "50", idleTimeout: "2m30s", streamIdle: "1h"}}},
	{"limits off", `payload: {limits: {maxStreams: 0, maxStreamsPerConnection: 0, requestIdleTimeout: 0, streamIdleTimeout: 0}}`,
		payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role", serving: servingWant{maxStreams: "0", perConnection: "0", idleTimeout: "0", streamIdle: "0"}}},
	{"h2 transport", `payload: {extprocTransport: h2}`, payloadWant{replicas: 1, configMapNS: "<ns>", roleKind: "Role", serving: servingWant{transport: "h2"}}},
}

func TestPayloadChart(t *testing.T) {
	ch := loadChart(t, payloadChartDir)
	ns := namespace(t, "charts-payload")
	for _, provider := range providers {
		for _, vs := range payloadValueSets {
			t.Run(provider+"/"+vs.name, func(t *testing.T) {
				t.Parallel()
				vals := values(t, vs.values, payloadProvider(provider))
				objs := mustRender(t, ch, "payload", ns, vals)
				checkPayload(t, objs, ns, provider, vs.want)
				lintChart(t, payloadChartDir, vals, ns)
				dryRun(t, ns, objs)
			})
		}
	}
}

func checkPayload(t *testing.T, objs []*unstructured.Unstructured, ns, provider string, want payloadWant) {
	t.Helper()
	wantKinds := []string{"ConfigMap", "Deployment", "Service", "ServiceAccount"}
	if want.roleKind != "" {
		wantKinds = append(wantKinds, want.roleKind, want.roleKind+"Binding")
	}
	switch provider {
	case "istio":
		wantKinds = append(wantKinds, "EnvoyFilter")
	case "agentgateway":
		wantKinds = append(wantKinds, "AgentgatewayPolicy")
		if !want.plaintext {
			wantKinds = append(wantKinds, "AgentgatewayPolicy")
		}
	}
	checkKinds(t, objs, wantKinds, want.podMonitor, provider == "istio" && !want.plaintext)

	dep := one[appsv1.Deployment](t, objs, "Deployment")
	svc := one[corev1.Service](t, objs, "Service")
	sa := one[corev1.ServiceAccount](t, objs, "ServiceAccount")
	cm := one[corev1.ConfigMap](t, objs, "ConfigMap")
	switch provider {
	case "istio":
		checkEnvoyFilter(t, objs, ns, svc.Name+"."+ns+".svc.cluster.local", int(servicePort(t, svc, "grpc").Port))
	case "agentgateway":
		checkAgentgatewayPolicies(t, objs, ns, svc.Name, servicePort(t, svc, "grpc").Port, !want.plaintext)
	}

	if g := servicePort(t, svc, "grpc"); g.Port != 9004 || g.AppProtocol == nil || *g.AppProtocol != "http2" || g.TargetPort.StrVal != "grpc" {
		t.Errorf("Service grpc port %+v, want 9004 with appProtocol http2", g)
	}
	if m := servicePort(t, svc, "metrics"); m.Port != 9090 {
		t.Errorf("Service metrics port %+v", m)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, dep.Spec.Template.Labels)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != want.replicas {
		t.Errorf("replicas %v, want %d", dep.Spec.Replicas, want.replicas)
	}
	if dep.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("pods run as %q, the chart's ServiceAccount is %q", dep.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	c := container(t, dep, "payload")
	if len(c.Args) == 0 || c.Args[0] != "payload" {
		t.Fatalf("args %v do not start with the payload subcommand", c.Args)
	}
	for _, a := range []string{"--config-file=/config/payload.yaml", "--grpc-port=9004", "--grpc-health-port=9005", "--metrics-port=9090", "--drain-timeout=30s", "--shutdown-delay=5s"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("args %v lack %s", c.Args, a)
		}
	}
	if !slices.Contains(c.Args, "--secure-serving="+map[bool]string{true: "false", false: "true"}[want.plaintext]) {
		t.Errorf("args %v: --secure-serving should be %t", c.Args, !want.plaintext)
	}
	var cmNS []string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--configmap-namespace="); ok {
			cmNS = append(cmNS, v)
		}
	}
	switch wantNS := strings.ReplaceAll(want.configMapNS, "<ns>", ns); {
	case wantNS == "" && len(cmNS) > 0:
		t.Errorf("--configmap-namespace=%v passed with adapter ConfigMaps off", cmNS)
	case wantNS != "" && !slices.Equal(cmNS, []string{wantNS}):
		t.Errorf("--configmap-namespace %v, want %s", cmNS, wantNS)
	}
	token := dep.Spec.Template.Spec.AutomountServiceAccountToken
	if tokenless := token != nil && !*token; tokenless != (want.roleKind == "") {
		t.Errorf("automountServiceAccountToken %v; want false exactly when the processor needs no API access", token)
	}
	if got := slices.Contains(c.Args, "--cert-path=/certs"); got != want.certs {
		t.Errorf("--cert-path passed: %t, want %t", got, want.certs)
	}
	if got := hasMount(c, "/certs"); got != want.certs {
		t.Errorf("/certs mounted: %t, want %t", got, want.certs)
	}
	checkServing(t, dep, c, want.serving)
	checkContainer(t, dep, c, map[string]int32{"grpc": 9004, "health": 9005, "metrics": 9090})

	// The policy: mounted as a directory (so edits reach the running
	// processor), equal to the value, and accepted by the processor's own
	// validation.
	if !mountsConfigMap(dep, "/config", cm.Name) {
		t.Errorf("/config is not ConfigMap %s as a directory", cm.Name)
	}
	cfg := loadPolicy(t, cm.Data["payload.yaml"])
	// The chart's default limits, under every policy that does not set
	// its own.
	defaults := policy.Limits{MaxBodyBytes: 8 << 20, MaxPromptBytes: 2 << 20}
	if want.policy {
		wantCfg := loadPolicy(t, policyValue(t, payloadPolicy))
		wantCfg.Limits.MaxPromptBytes = defaults.MaxPromptBytes // merged in: the policy sets the others
		if !reflect.DeepEqual(cfg, wantCfg) {
			t.Errorf("payload.yaml is %+v, want %+v", cfg, wantCfg)
		}
		if len(cfg.PII) != 3 || cfg.Models.Unknown != "reject" {
			t.Errorf("payload.yaml lost parts of the policy: %+v", cfg)
		}
	} else if !reflect.DeepEqual(*cfg, policy.Config{Limits: defaults}) {
		t.Errorf("default payload.yaml is %+v, want the chart's default limits only", cfg)
	}

	// RBAC: ConfigMaps read access, in the release namespace or everywhere.
	switch want.roleKind {
	case "Role":
		role := one[rbacv1.Role](t, objs, "Role")
		checkConfigMapRules(t, role.Rules)
		checkBinding(t, one[rbacv1.RoleBinding](t, objs, "RoleBinding"), "Role", role.Name, sa.Name, ns)
	case "ClusterRole":
		role := one[rbacv1.ClusterRole](t, objs, "ClusterRole")
		checkConfigMapRules(t, role.Rules)
		if !strings.HasPrefix(role.Name, ns+"-") {
			t.Errorf("ClusterRole %s does not carry the release namespace", role.Name)
		}
		b := one[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding")
		rb := &rbacv1.RoleBinding{ObjectMeta: b.ObjectMeta, Subjects: b.Subjects, RoleRef: b.RoleRef}
		checkBinding(t, rb, "ClusterRole", role.Name, sa.Name, ns)
	}
	if want.podMonitor {
		checkPodMonitor(t, objs, dep)
	}
	if provider == "istio" && !want.plaintext {
		checkDestinationRule(t, objs, svc.Name+"."+ns+".svc.cluster.local")
	}
}

func checkConfigMapRules(t *testing.T, rules []rbacv1.PolicyRule) {
	t.Helper()
	got, err := ruleSet(rules)
	if err != nil {
		t.Error(err)
	}
	want := map[access]bool{{"", "configmaps", "get"}: true, {"", "configmaps", "list"}: true, {"", "configmaps", "watch"}: true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rules grant %v, want %v", keys(got), keys(want))
	}
}

// loadPolicy reads payload.yaml as the processor does (YAML to JSON,
// strict decoding, compiling every rule).
func loadPolicy(t *testing.T, text string) *policy.Config {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		t.Fatalf("payload.yaml: %v\n%s", err, text)
	}
	if string(js) == "null" {
		js = nil
	}
	cfg, err := policy.DecodeJSON(js)
	if err != nil {
		t.Fatalf("payload.yaml: %v\n%s", err, text)
	}
	if _, err := policy.Compile(cfg); err != nil {
		t.Fatalf("payload.yaml does not compile: %v\n%s", err, text)
	}
	return cfg
}

// policyValue is payload.config of a values document, as YAML.
func policyValue(t *testing.T, doc string) string {
	t.Helper()
	v := values(t, doc)
	out, err := yaml.Marshal(v["payload"].(map[string]any)["config"])
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestPayloadReadmeExample renders the README's values file.
func TestPayloadReadmeExample(t *testing.T) {
	if block := readmeBlock(t, payloadChartDir, "helm install payload charts/infergate-payload\n"); strings.TrimSpace(block) != "helm install payload charts/infergate-payload" {
		t.Errorf("README install command is %q", block)
	}
	ch := loadChart(t, payloadChartDir)
	ns := namespace(t, "charts-payload-readme")
	vals := values(t, readmeBlock(t, payloadChartDir, "# payload-values.yaml"))
	objs := mustRender(t, ch, "payload", ns, vals)
	cfg := loadPolicy(t, one[corev1.ConfigMap](t, objs, "ConfigMap").Data["payload.yaml"])
	if len(cfg.Models.Bases) != 1 || len(cfg.PII) != 2 || len(cfg.Deny) != 1 {
		t.Errorf("README policy rendered as %+v", cfg)
	}
	lintChart(t, payloadChartDir, vals, ns)
	dryRun(t, ns, objs)
}

// TestPayloadRBACGrantsAccount creates the RBAC objects for real and asks
// the API server's authorizer what the processor's ServiceAccount may do.
func TestPayloadRBACGrantsAccount(t *testing.T) {
	ch := loadChart(t, payloadChartDir)
	other := namespace(t, "charts-payload-rbac-other")
	read := access{"", "configmaps", "list"}
	for _, tc := range []struct {
		name, values   string
		ownNS, otherNS bool // may read ConfigMaps in its own, another namespace
	}{
		{name: "ns", ownNS: true},
		{name: "all", values: `payload: {adapterConfigMaps: {multiNamespace: true}}`, ownNS: true, otherNS: true},
		{name: "off", values: `payload: {adapterConfigMaps: {enabled: false}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, "charts-payload-rbac-"+tc.name)
			objs := mustRender(t, ch, "payload", ns, values(t, tc.values))
			rbacObjs := only(objs, "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
			apply(t, rbacObjs)
			sa := one[corev1.ServiceAccount](t, objs, "ServiceAccount")
			user := "system:serviceaccount:" + ns + ":" + sa.Name
			for _, v := range []string{"get", "list", "watch"} {
				a := access{"", "configmaps", v}
				if got := allowedExpecting(t, user, ns, ns, a, tc.ownNS); got != tc.ownNS {
					t.Errorf("%s may %s in its namespace: %t, want %t", user, a, got, tc.ownNS)
				}
			}
			if got := allowedExpecting(t, user, ns, other, read, tc.otherNS); got != tc.otherNS {
				t.Errorf("%s may %s in another namespace: %t, want %t", user, read, got, tc.otherNS)
			}
			for _, a := range []access{{"", "configmaps", "update"}, {"", "configmaps", "delete"}, {"", "secrets", "get"}, {"", "pods", "list"}} {
				if allowed(t, user, ns, ns, a) {
					t.Errorf("%s may %s, which the processor does not need", user, a)
				}
			}
		})
	}
}

// payloadProvider is the provider values of a test install: Istio and
// agentgateway need the inference Gateway the filter or policy goes to.
func payloadProvider(name string) string {
	switch name {
	case "agentgateway":
		return "provider: {name: agentgateway, agentgateway: {gateway: {name: inference-gateway}}}"
	case "istio":
		return `provider: {name: istio, istio: {gateway: {name: inference-gateway}, proxyVersion: "1.30.0"}}`
	}
	return providerValues(name)
}

// checkEnvoyFilter: the processor's ext_proc filter goes first on the
// inference Gateway's pods (before Istio's InferencePool ext_proc and the
// router), under a name other than Istio's, to the processor's Service as
// Istio names its outbound cluster, with streamed bodies and the usage
// metadata received.
func checkEnvoyFilter(t *testing.T, objs []*unstructured.Unstructured, ns, host string, port int) {
	t.Helper()
	ef := only(objs, "EnvoyFilter")[0]
	if ef.GetAPIVersion() != "networking.istio.io/v1alpha3" || ef.GetNamespace() != ns {
		t.Errorf("EnvoyFilter %s in %q", ef.GetAPIVersion(), ef.GetNamespace())
	}
	if sel, _, _ := unstructured.NestedStringMap(ef.Object, "spec", "workloadSelector", "labels"); sel["gateway.networking.k8s.io/gateway-name"] != "inference-gateway" || len(sel) != 1 {
		t.Errorf("workloadSelector %v, want the Gateway's pods", sel)
	}
	patches, _, _ := unstructured.NestedSlice(ef.Object, "spec", "configPatches")
	if len(patches) != 1 {
		t.Fatalf("configPatches %v", patches)
	}
	p := patches[0].(map[string]any)
	get := func(path ...string) any {
		v, _, _ := unstructured.NestedFieldNoCopy(p, path...)
		return v
	}
	for _, c := range []struct {
		path []string
		want any
	}{
		{[]string{"applyTo"}, "HTTP_FILTER"},
		{[]string{"match", "context"}, "GATEWAY"},
		{[]string{"match", "listener", "filterChain", "filter", "name"}, "envoy.filters.network.http_connection_manager"},
		{[]string{"patch", "operation"}, "INSERT_FIRST"},
		{[]string{"patch", "value", "name"}, "envoy.filters.http.ext_proc.infergate-payload"},
		{[]string{"patch", "value", "typed_config", "@type"}, "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"},
		{[]string{"patch", "value", "typed_config", "grpc_service", "envoy_grpc", "cluster_name"}, fmt.Sprintf("outbound|%d||%s", port, host)},
		{[]string{"patch", "value", "typed_config", "failure_mode_allow"}, false},
		{[]string{"patch", "value", "typed_config", "processing_mode", "request_body_mode"}, "FULL_DUPLEX_STREAMED"},
		{[]string{"patch", "value", "typed_config", "processing_mode", "response_body_mode"}, "FULL_DUPLEX_STREAMED"},
		{[]string{"patch", "value", "typed_config", "processing_mode", "request_trailer_mode"}, "SEND"},
	} {
		if got := get(c.path...); got != c.want {
			t.Errorf("%s = %v, want %v", strings.Join(c.path, "."), got, c.want)
		}
	}
	ns2, _, _ := unstructured.NestedStringSlice(p, "patch", "value", "typed_config", "metadata_options", "receiving_namespaces", "untyped")
	if !slices.Equal(ns2, []string{"io.infergate.payload"}) {
		t.Errorf("receiving namespaces %v", ns2)
	}
}

// checkAgentgatewayPolicies: a PreRouting extProc on the Gateway to the
// processor's Service, and (with TLS) backend TLS on that Service.
func checkAgentgatewayPolicies(t *testing.T, objs []*unstructured.Unstructured, ns, svc string, port int32, tls bool) {
	t.Helper()
	var traffic, backend *unstructured.Unstructured
	for _, o := range only(objs, "AgentgatewayPolicy") {
		if _, ok, _ := unstructured.NestedMap(o.Object, "spec", "traffic"); ok {
			traffic = o
		} else {
			backend = o
		}
	}
	if traffic == nil {
		t.Fatal("no AgentgatewayPolicy with traffic")
	}
	refs, _, _ := unstructured.NestedSlice(traffic.Object, "spec", "targetRefs")
	if len(refs) != 1 || refs[0].(map[string]any)["kind"] != "Gateway" || refs[0].(map[string]any)["name"] != "inference-gateway" {
		t.Errorf("traffic policy targets %v", refs)
	}
	phase, _, _ := unstructured.NestedString(traffic.Object, "spec", "traffic", "phase")
	name, _, _ := unstructured.NestedString(traffic.Object, "spec", "traffic", "extProc", "backendRef", "name")
	p, _, _ := unstructured.NestedInt64(traffic.Object, "spec", "traffic", "extProc", "backendRef", "port")
	if phase != "PreRouting" || name != svc || p != int64(port) || traffic.GetNamespace() != ns {
		t.Errorf("traffic policy: phase %q, extProc to %s:%d in %s; want PreRouting to %s:%d", phase, name, p, traffic.GetNamespace(), svc, port)
	}
	// Without failOpen the extProc is agentgateway's default, as before
	// failOpen learnt Buffered: FailClosed, bodies streamed, nothing else.
	extProc, _, _ := unstructured.NestedMap(traffic.Object, "spec", "traffic", "extProc")
	if len(extProc) != 1 {
		t.Errorf("traffic policy extProc %v, want only its backendRef", extProc)
	}
	if spec, _, _ := unstructured.NestedMap(traffic.Object, "spec"); len(spec) != 2 {
		t.Errorf("traffic policy spec %v, want only targetRefs and traffic", spec)
	}
	if (backend != nil) != tls {
		t.Fatalf("backend TLS policy rendered %v, want %v", backend != nil, tls)
	}
	if backend != nil {
		skip, _, _ := unstructured.NestedString(backend.Object, "spec", "backend", "tls", "insecureSkipVerify")
		target, _, _ := unstructured.NestedSlice(backend.Object, "spec", "targetRefs")
		if skip != "All" || len(target) != 1 || target[0].(map[string]any)["name"] != svc {
			t.Errorf("backend TLS policy: insecureSkipVerify %q targets %v", skip, target)
		}
	}
}

// TestAgentgatewayGatewayInAnotherNamespace: the policy goes beside the
// Gateway, reaches the Service across namespaces, and a ReferenceGrant in
// the release namespace allows exactly that.
func TestAgentgatewayGatewayInAnotherNamespace(t *testing.T) {
	ns := namespace(t, "charts-agw")
	objs := mustRender(t, loadChart(t, payloadChartDir), "payload", ns,
		values(t, "provider: {name: agentgateway, agentgateway: {gateway: {name: gw, namespace: gateways}, failOpen: true}}"))
	var traffic *unstructured.Unstructured
	for _, o := range only(objs, "AgentgatewayPolicy") {
		if _, ok, _ := unstructured.NestedMap(o.Object, "spec", "traffic"); ok {
			traffic = o
		}
	}
	refNS, _, _ := unstructured.NestedString(traffic.Object, "spec", "traffic", "extProc", "backendRef", "namespace")
	mode, _, _ := unstructured.NestedString(traffic.Object, "spec", "traffic", "extProc", "failureMode")
	body, _, _ := unstructured.NestedString(traffic.Object, "spec", "traffic", "extProc", "processingOptions", "requestBodyMode")
	if traffic.GetNamespace() != "gateways" || refNS != ns || mode != "FailOpen" || body != "Buffered" {
		t.Fatalf("policy in %q reaching namespace %q, failureMode %q, requestBodyMode %q", traffic.GetNamespace(), refNS, mode, body)
	}
	grants := only(objs, "ReferenceGrant")
	if len(grants) != 1 || grants[0].GetNamespace() != ns {
		t.Fatalf("ReferenceGrants %v", grants)
	}
	from, _, _ := unstructured.NestedSlice(grants[0].Object, "spec", "from")
	to, _, _ := unstructured.NestedSlice(grants[0].Object, "spec", "to")
	if len(from) != 1 || from[0].(map[string]any)["namespace"] != "gateways" || from[0].(map[string]any)["kind"] != "AgentgatewayPolicy" ||
		len(to) != 1 || to[0].(map[string]any)["name"] != "payload-payload" {
		t.Fatalf("ReferenceGrant from %v to %v", from, to)
	}
	// The grant is valid Gateway API.
	dryRun(t, ns, grants)
}

func TestPayloadBadValues(t *testing.T) {
	ch := loadChart(t, payloadChartDir)
	ns := namespace(t, "charts-payload-bad")
	for _, tc := range []struct {
		name, values string
		want         []string
	}{
		{"unknown provider", `provider: {name: nginx}`, []string{"/provider/name", "must be one of"}},
		{"istio without its gateway", `provider: {name: istio}`, []string{"/provider", "istio"}},
		{"agentgateway without its gateway", `provider: {name: agentgateway}`, []string{"/provider", "agentgateway"}},
		{"agentgateway buffer size without failOpen", `provider: {name: agentgateway, agentgateway: {gateway: {name: gw}, maxBufferSize: 1048576}}`,
			[]string{"provider.agentgateway.maxBufferSize", "Buffered", "failOpen: true"}},
		{"agentgateway buffer size not a number", `provider: {name: agentgateway, agentgateway: {gateway: {name: gw}, failOpen: true, maxBufferSize: 2Mi}}`,
			[]string{"/provider/agentgateway/maxBufferSize"}},
		{"agentgateway buffer size negative", `provider: {name: agentgateway, agentgateway: {gateway: {name: gw}, failOpen: true, maxBufferSize: -1}}`,
			[]string{"/provider/agentgateway/maxBufferSize", "minimum"}},
		{"agentgateway buffer past the processor's message limit", `provider: {name: agentgateway, agentgateway: {gateway: {name: gw}, failOpen: true, maxBufferSize: 4194304}}`,
			[]string{"/provider/agentgateway/maxBufferSize", "maximum"}},
		{"istio with an empty gateway name", `provider: {name: istio, istio: {gateway: {name: ""}}}`, []string{"/provider/istio/gateway/name"}},
		{"istio filter named as Istio's own", `provider: {name: istio, istio: {gateway: {name: gw}, filterName: envoy.filters.http.ext_proc}}`, []string{"/provider/istio/filterName"}},
		{"istio gateway name not a name", `provider: {name: istio, istio: {gateway: {name: "gw; x"}}}`, []string{"/provider/istio/gateway/name"}},
		{"istio without its proxy version", `provider: {name: istio, istio: {gateway: {name: gw}}}`, []string{"/provider/istio/proxyVersion"}},
		{"istio proxies on Envoy 1.37", `provider: {name: istio, istio: {gateway: {name: gw}, proxyVersion: "1.29.9"}}`, []string{"/provider/istio/proxyVersion", "1.29.9"}},
		{"istio proxy version without patch", `provider: {name: istio, istio: {gateway: {name: gw}, proxyVersion: "1.29"}}`, []string{"/provider/istio/proxyVersion"}},
		{"istio proxy version 1.3", `provider: {name: istio, istio: {gateway: {name: gw}, proxyVersion: "1.3"}}`, []string{"/provider/istio/proxyVersion"}},
		{"istio proxy version as a YAML number", `provider: {name: istio, istio: {gateway: {name: gw}, proxyVersion: 1.30}}`, []string{"/provider/istio/proxyVersion"}},
		{"istio proxy version not a version", `provider: {name: istio, istio: {gateway: {name: gw}, proxyVersion: latest}}`, []string{"/provider/istio/proxyVersion"}},
		{"negative replicas", `payload: {replicas: -1}`, []string{"/payload/replicas", "minimum"}},
		{"unknown PII action", `payload: {config: {pii: [{name: ssn, detector: ssn, action: block}]}}`, []string{"/payload/config/pii/0/action", "must be one of"}},
		{"misspelt policy section", `payload: {config: {limit: {maxTokens: 10}}}`, []string{"limit"}},
		{"negative limit", `payload: {config: {limits: {maxTokens: -1}}}`, []string{"/payload/config/limits/maxTokens"}},
		{"multiNamespace not a boolean", `payload: {adapterConfigMaps: {multiNamespace: "yes"}}`, []string{"/payload/adapterConfigMaps/multiNamespace"}},
		{"ports collide", `payload: {ports: {metrics: 9004}}`, []string{"payload.ports must be three different ports"}},
		{"client CA without TLS", `payload: {secureServing: false, clientCASecretName: gw-ca}`, []string{"payload.clientCASecretName", "payload.secureServing"}},
		{"negative maxStreams", `payload: {limits: {maxStreams: -1}}`, []string{"/payload/limits/maxStreams", "minimum"}},
		{"negative buffer budget", `payload: {limits: {requestBufferBudgetBytes: -1}}`, []string{"/payload/limits/requestBufferBudgetBytes", "minimum"}},
		{"idle timeout soon", `payload: {limits: {requestIdleTimeout: soon}}`, []string{"/payload/limits/requestIdleTimeout", "does not match pattern"}},
		{"idle timeout without unit", `payload: {limits: {requestIdleTimeout: 30}}`, []string{"/payload/limits/requestIdleTimeout", "maximum"}},
		{"negative idle timeout", `payload: {limits: {requestIdleTimeout: -5s}}`, []string{"/payload/limits/requestIdleTimeout"}},
		{"misspelt limit", `payload: {limits: {maxStream: 5}}`, []string{"maxStream"}},
		{"limits dropped", `payload: {limits: null}`, []string{"/payload", "limits"}},
		{"no account", `serviceAccount: {create: false}`, []string{"/serviceAccount/name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wantError(t, ch, payloadChartDir, ns, values(t, tc.values), tc.want)
		})
	}
}

// TestPayloadIstioProxyVersions: every Istio release whose proxies are built
// on Envoy 1.38 or later installs (1.30 on; TestPayloadBadValues has the
// refusals below it), the forms istio-proxy's ISTIO_VERSION takes included.
func TestPayloadIstioProxyVersions(t *testing.T) {
	ch := loadChart(t, payloadChartDir)
	ns := namespace(t, "charts-payload-istio-versions")
	for _, v := range []string{"1.30", "1.30.0", "1.30.2", "1.31.0-rc.0", "1.32-alpha.86c9f01fd735", "1.100.1", "2.0"} {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			objs := mustRender(t, ch, "payload", ns, values(t, `provider: {name: istio, istio: {gateway: {name: gw}, proxyVersion: "`+v+`"}}`))
			if len(only(objs, "EnvoyFilter")) != 1 {
				t.Errorf("proxy version %s: %d EnvoyFilters, want 1", v, len(only(objs, "EnvoyFilter")))
			}
		})
	}
}

func TestPayloadReadmeValues(t *testing.T) { readmeValues(t, payloadChartDir) }

// TestPayloadSchemaMatchesPolicy keeps values.schema.json's payload.config
// in step with the processor's policy.Config: the same fields at every
// level, so the schema neither rejects a field the processor takes nor
// lets through one it refuses.
func TestPayloadSchemaMatchesPolicy(t *testing.T) {
	ch := loadChart(t, payloadChartDir)
	var schema map[string]any
	if err := json.Unmarshal(ch.Schema, &schema); err != nil {
		t.Fatal(err)
	}
	node := schema
	for _, k := range []string{"payload", "config"} {
		node = node["properties"].(map[string]any)[k].(map[string]any)
	}
	compareSchema(t, "payload.config", node, reflect.TypeOf(policy.Config{}))
}

func compareSchema(t *testing.T, path string, node map[string]any, typ reflect.Type) {
	t.Helper()
	switch typ.Kind() {
	case reflect.Slice:
		items, ok := node["items"].(map[string]any)
		if !ok {
			t.Errorf("%s: schema has no items for %s", path, typ)
			return
		}
		compareSchema(t, path+"[]", items, typ.Elem())
	case reflect.Struct:
		if node["additionalProperties"] != false {
			t.Errorf("%s: schema allows unknown fields, the processor refuses them", path)
		}
		props, _ := node["properties"].(map[string]any)
		fields := map[string]reflect.Type{}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				t.Fatalf("%s.%s: no JSON name", path, f.Name)
			}
			fields[name] = f.Type
		}
		for name, ft := range fields {
			sub, ok := props[name].(map[string]any)
			if !ok {
				t.Errorf("%s: schema lacks %s, which the processor takes", path, name)
				continue
			}
			compareSchema(t, path+"."+name, sub, ft)
		}
		for name := range props {
			if _, ok := fields[name]; !ok {
				t.Errorf("%s: schema allows %s, which the processor does not know", path, name)
			}
		}
	}
}
