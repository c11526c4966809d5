package charts

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/infergate/infergate/gateways/envoygateway"
)

var egextChartDir = filepath.Join("..", "..", "charts", "infergate-egext")

// TestEgextChart renders the extension's chart with several value sets,
// lints it, dry-runs it against the API server, and checks what the
// extension runs with: its arguments, its Service, and RBAC equal to
// envoygateway.ClusterRoleRules() (what the Envoy Gateway tests prove
// enough).
func TestEgextChart(t *testing.T) {
	ch := loadChart(t, egextChartDir)
	for _, tc := range []struct {
		name, values string
		args         []string // wanted among the container's arguments
		noArgs       []string // prefixes that must not be there
		roleKind     string
	}{
		{"defaults", ``, []string{"egext", "--port=5005", "--eds-address=egext-egext.<ns>.svc.cluster.local:5005",
			"--gateway-controller-name=gateway.envoyproxy.io/gatewayclass-controller", "--leader-elect"}, []string{"--namespace", "--payload-address", "--tls-cert-file"}, "ClusterRole"},
		{"one namespace, no EDS", `egext: {watchNamespace: models, eds: false}`, []string{"--namespace=models"}, []string{"--eds-address"}, "Role"},
		{"payload processor", `egext: {payload: {address: "infergate-payload.infergate.svc.cluster.local:9004", failOpen: true}}`,
			[]string{"--payload-address=infergate-payload.infergate.svc.cluster.local:9004", "--payload-tls=true", "--payload-fail-open=true"}, nil, "ClusterRole"},
		{"TLS", `egext: {tlsSecretName: egext-tls}`, []string{"--tls-cert-file=/certs/tls.crt", "--tls-key-file=/certs/tls.key"}, []string{"--processor-client"}, "ClusterRole"},
		{"client certificate to the processors", `egext: {processorClientCertSecretName: processor-client}`,
			[]string{"--processor-client-cert-file=/client-cert/tls.crt", "--processor-client-key-file=/client-cert/tls.key"}, []string{"--tls-cert-file"}, "ClusterRole"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, "charts-egext")
			vals := values(t, tc.values)
			lintChart(t, egextChartDir, vals, ns)
			objs := mustRender(t, ch, "egext", ns, vals)
			dryRun(t, ns, only(objs, "ServiceAccount", "Service", "Deployment"))
			dep := one[appsv1.Deployment](t, objs, "Deployment")
			args := dep.Spec.Template.Spec.Containers[0].Args
			for _, a := range tc.args {
				if a = strings.ReplaceAll(a, "<ns>", ns); !slices.Contains(args, a) {
					t.Errorf("args %q lack %q", args, a)
				}
			}
			for _, prefix := range tc.noArgs {
				if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, prefix) }) {
					t.Errorf("args %q have %s", args, prefix)
				}
			}
			svc := one[corev1.Service](t, objs, "Service")
			if p := servicePort(t, svc, "grpc"); p.Port != 5005 {
				t.Errorf("service port %d", p.Port)
			}
			var rules []rbacv1.PolicyRule
			switch tc.roleKind {
			case "Role":
				role := roleNamed(t, objs, "egext-egext")
				if role.Namespace != "models" {
					t.Errorf("Role in %q, want the watched namespace", role.Namespace)
				}
				rules = role.Rules
			default:
				rules = one[rbacv1.ClusterRole](t, objs, "ClusterRole").Rules
			}
			got, err := ruleSet(rules)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ruleSet(envoygateway.ClusterRoleRules())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(keys(got), keys(want)) {
				t.Errorf("chart RBAC %v\nwant envoygateway.ClusterRoleRules() %v", keys(got), keys(want))
			}
			lease := roleNamed(t, objs, "egext-egext-leader-election")
			if lease.Namespace != ns {
				t.Errorf("leader election Role in %q, want the release namespace", lease.Namespace)
			}
			if got, want := mustRuleSet(t, lease.Rules), mustRuleSet(t, envoygateway.LeaseRoleRules()); !slices.Equal(keys(got), keys(want)) {
				t.Errorf("leader election RBAC %v, want envoygateway.LeaseRoleRules() %v", keys(got), keys(want))
			}
			if pdb := only(objs, "PodDisruptionBudget"); len(pdb) != 1 {
				t.Errorf("%d PodDisruptionBudgets for 2 replicas, want 1", len(pdb))
			}
			env := dep.Spec.Template.Spec.Containers[0].Env
			if len(env) == 0 || env[0].Name != "POD_NAMESPACE" || env[0].ValueFrom == nil || env[0].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
				t.Errorf("env %v, want POD_NAMESPACE from the pod's namespace", env)
			}
		})
	}
}

func TestEgextBadValues(t *testing.T) {
	ch := loadChart(t, egextChartDir)
	ns := namespace(t, "charts-egext-bad")
	for _, tc := range []struct {
		name, values string
		want         []string
	}{
		{"negative replicas", `egext: {replicas: -1}`, []string{"/egext/replicas", "minimum"}},
		{"port out of range", `egext: {port: 0}`, []string{"/egext/port", "minimum"}},
		{"payload address without a port", `egext: {payload: {address: infergate-payload}}`, []string{"/egext/payload/address"}},
		{"misspelt value", `egext: {replica: 1}`, []string{"replica"}},
		{"no account", `serviceAccount: {create: false}`, []string{"serviceAccount.name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, ch, egextChartDir, ns, values(t, tc.values), tc.want)
		})
	}
}

func TestEgextReadmeValues(t *testing.T) { readmeValues(t, egextChartDir) }

// roleNamed is the rendered Role called name.
func roleNamed(t *testing.T, objs []*unstructured.Unstructured, name string) *rbacv1.Role {
	t.Helper()
	for _, o := range only(objs, "Role") {
		if o.GetName() == name {
			r := new(rbacv1.Role)
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatalf("no Role %s (objects: %v)", name, kinds(objs))
	return nil
}

func mustRuleSet(t *testing.T, rules []rbacv1.PolicyRule) map[access]bool {
	t.Helper()
	s, err := ruleSet(rules)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
