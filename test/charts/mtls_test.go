package charts

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestIstioMutualTLS: with a client CA on the processor and a credential
// for Istio's gateway, each chart's DestinationRule presents that
// credential (MUTUAL) to the service the chart installs.
func TestIstioMutualTLS(t *testing.T) {
	for _, tc := range []struct {
		name, dir, release, values, istio, service string
	}{
		{"picker", eppChartDir, "pool", eppInstall + "\nepp: {clientCASecretName: epp-client-ca}", "{gateway: {name: inference-gateway}}", "pool-epp"},
		{"payload processor", payloadChartDir, "payload", "payload: {clientCASecretName: payload-client-ca}", `{gateway: {name: inference-gateway}, proxyVersion: "1.30.0"}`, "payload-payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, "charts-mtls")
			vals := values(t, tc.values, "provider: {name: istio, istio: "+tc.istio+"}", "provider: {istio: {clientCredentialName: gateway-client-cert}}")
			lintChart(t, tc.dir, vals, ns)
			objs := mustRender(t, loadChart(t, tc.dir), tc.release, ns, vals)
			checkDestinationRuleTLS(t, objs, tc.service+"."+ns+".svc.cluster.local", "MUTUAL", "gateway-client-cert")
			dep := one[appsv1.Deployment](t, objs, "Deployment")
			found := false
			for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
				found = found || a == "--client-ca-file=/client-ca/ca.crt"
			}
			if !found {
				t.Errorf("the %s does not ask for client certificates: args %v", tc.name, dep.Spec.Template.Spec.Containers[0].Args)
			}
		})
	}
}
