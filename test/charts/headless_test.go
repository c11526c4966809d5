package charts

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestHeadlessServices: with headlessService.enabled each processor chart
// adds <name>-headless, a Service without a cluster IP over the ext_proc
// port (what a plain Envoy bootstrap's STRICT_DNS cluster resolves to a
// host per pod); without it there is none.
func TestHeadlessServices(t *testing.T) {
	for _, tc := range []struct {
		dir, release, name, base string
		port                     int32
	}{
		{eppChartDir, "epp", "epp-epp-headless", eppInstall, 9002},
		{payloadChartDir, "payload", "payload-payload-headless", ``, 9004},
	} {
		t.Run(tc.release, func(t *testing.T) {
			ch := loadChart(t, tc.dir)
			ns := namespace(t, "charts-headless")
			if n := len(only(mustRender(t, ch, tc.release, ns, values(t, tc.base)), "Service")); n != 1 {
				t.Fatalf("%d Services by default, want 1", n)
			}
			vals := values(t, tc.base, `headlessService: {enabled: true}`)
			objs := mustRender(t, ch, tc.release, ns, vals)
			lintChart(t, tc.dir, vals, ns)
			var found *corev1.Service
			for _, o := range only(objs, "Service") {
				if o.GetName() == tc.name {
					found = new(corev1.Service)
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, found); err != nil {
						t.Fatal(err)
					}
				}
			}
			switch {
			case found == nil:
				t.Fatalf("no Service %s (objects %v)", tc.name, kinds(objs))
			case found.Spec.ClusterIP != corev1.ClusterIPNone || len(found.Spec.Ports) != 1 || found.Spec.Ports[0].Port != tc.port ||
				found.Spec.Ports[0].TargetPort.StrVal != "grpc" || len(found.Spec.Selector) == 0:
				t.Fatalf("headless Service %+v", found.Spec)
			}
			dryRun(t, ns, only(objs, "Service"))
		})
	}
}
