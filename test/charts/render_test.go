package charts

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/helmrender"
)

// Chart folders, from this package's folder.
var (
	eppChartDir     = filepath.Join("..", "..", "charts", "infergate-epp")
	payloadChartDir = filepath.Join("..", "..", "charts", "infergate-payload")
)

// providers are every value provider.name accepts.
var providers = []string{"none", "istio", "agentgateway", "envoy-gateway"}

func loadChart(t *testing.T, dir string) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatalf("load chart %s: %v", dir, err)
	}
	return ch
}

// values merges YAML value documents as repeated `helm install -f` does:
// later documents win.
func values(t *testing.T, docs ...string) map[string]any {
	t.Helper()
	v, err := helmrender.Values(docs...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// render is what `helm install` does before it talks to the cluster, for
// the test control plane's Kubernetes version.
func render(ch *chart.Chart, release, namespace string, vals map[string]any) ([]*unstructured.Unstructured, error) {
	return helmrender.Render(ch, release, namespace, vals, fx.kubeVersion)
}

func mustRender(t *testing.T, ch *chart.Chart, release, namespace string, vals map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := render(ch, release, namespace, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return objs
}

// lintChart runs `helm lint`'s rules (Chart.yaml, values and schema,
// templates, dependencies) and fails on any warning or error.
func lintChart(t *testing.T, dir string, vals map[string]any, namespace string) {
	t.Helper()
	for _, m := range lintMessages(dir, vals, namespace) {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		}
	}
}

func lintMessages(dir string, vals map[string]any, namespace string) []support.Message {
	kv := fx.kubeVersion
	return lint.AllWithKubeVersion(dir, vals, namespace, &kv).Messages
}

// dryRun submits every object with server-side dry-run and strict field
// validation: the API server validates and admits it (schemas, CRD CEL,
// RBAC escalation checks) without storing it. Warnings fail too.
func dryRun(t *testing.T, namespace string, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		o := o.DeepCopy()
		namespaced, err := fx.client.IsObjectNamespaced(o)
		if err != nil {
			t.Errorf("%s: %v", describe(o), err)
			continue
		}
		if namespaced && o.GetNamespace() != namespace {
			t.Errorf("%s: namespace %q, want the release namespace %q", describe(o), o.GetNamespace(), namespace)
		}
		if !namespaced && o.GetNamespace() != "" {
			t.Errorf("%s: cluster-scoped but has namespace %q", describe(o), o.GetNamespace())
		}
		ctx, w := withWarnings(context.Background())
		if err := fx.client.Create(ctx, o, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
			t.Errorf("dry-run create %s: %v", describe(o), err)
		}
		for _, text := range w.all() {
			t.Errorf("dry-run create %s: warning: %s", describe(o), text)
		}
	}
}

// apply creates the objects for real.
func apply(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if err := fx.client.Create(context.Background(), o.DeepCopy()); err != nil {
			t.Fatalf("create %s: %v", describe(o), err)
		}
	}
}

func describe(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetName()
}

// kinds lists the objects as "Kind" strings, sorted.
func kinds(objs []*unstructured.Unstructured) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.GetKind())
	}
	sort.Strings(ks)
	return ks
}

// only returns the objects of the given kinds.
func only(objs []*unstructured.Unstructured, kinds ...string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		for _, k := range kinds {
			if o.GetKind() == k {
				out = append(out, o)
			}
		}
	}
	return out
}

// one finds the single object of a kind and converts it to its Go type.
func one[T any](t *testing.T, objs []*unstructured.Unstructured, kind string) *T {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s, rendered %d (objects: %v)", kind, len(found), kinds(objs))
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(found[0].Object, out); err != nil {
		t.Fatalf("%s: %v", describe(found[0]), err)
	}
	return out
}

// named is the one object of kind with that name.
func named[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	var picked []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			picked = append(picked, o)
		}
	}
	return one[T](t, picked, kind)
}

// readmeValues checks that the chart's README table documents every value
// (a row starting with the value's path in backquotes) and nothing that
// is not a value. A value is a leaf of values.yaml, where the schema
// leaves free-form objects (resources, security contexts) and empty
// defaults whole.
func readmeValues(t *testing.T, dir string) {
	t.Helper()
	ch := loadChart(t, dir)
	var schema map[string]any
	if err := json.Unmarshal(ch.Schema, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	documented := map[string]bool{}
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n## Values\n")
	if !ok {
		t.Fatalf("%s/README.md has no Values section", filepath.Base(dir))
	}
	table, _, _ = strings.Cut(table, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `([A-Za-z0-9_.]+)` \\|")
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		documented[m[1]] = true
	}
	known := map[string]bool{}
	var walk func(prefix string, v any, s map[string]any)
	walk = func(prefix string, v any, s map[string]any) {
		known[prefix] = true
		m, isMap := v.(map[string]any)
		props, hasProps := s["properties"].(map[string]any)
		if !isMap || len(m) == 0 || !hasProps {
			if prefix != "" && !documented[prefix] {
				t.Errorf("%s/README.md: value %s is not in the values table", filepath.Base(dir), prefix)
			}
			return
		}
		for k, sub := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			ss, _ := props[k].(map[string]any)
			if ss == nil {
				t.Errorf("%s: value %s is not in values.schema.json", filepath.Base(dir), p)
				continue
			}
			walk(p, sub, ss)
		}
	}
	walk("", ch.Values, schema)
	for d := range documented {
		if !known[d] {
			t.Errorf("%s/README.md documents %s, which is not a value", filepath.Base(dir), d)
		}
	}
}

// readmeBlock returns the README's fenced code block containing marker.
func readmeBlock(t *testing.T, dir, marker string) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```[a-z]*\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	for _, b := range blocks {
		if strings.Contains(b[1], marker) {
			return b[1]
		}
	}
	t.Fatalf("%s/README.md: no code block with %q", filepath.Base(dir), marker)
	return ""
}

// wantError renders bad values and checks that the install fails naming
// the problem, and that `helm lint` does too when the schema rejects them
// (lint renders templates in lint mode, where fail and required only log).
func wantError(t *testing.T, ch *chart.Chart, dir, namespace string, vals map[string]any, want []string) {
	t.Helper()
	_, err := render(ch, "bad", namespace, vals)
	if err == nil {
		t.Fatalf("rendered; want an error naming %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q:\n%v", w, err)
		}
	}
	if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
		return
	}
	var lintErrs []string
	for _, m := range lintMessages(dir, vals, namespace) {
		if m.Severity == support.ErrorSev {
			lintErrs = append(lintErrs, m.Error())
		}
	}
	if len(lintErrs) == 0 {
		t.Errorf("helm lint reports no error")
	} else if !strings.Contains(strings.Join(lintErrs, "\n"), want[0]) {
		t.Errorf("helm lint errors do not mention %q:\n%s", want[0], strings.Join(lintErrs, "\n"))
	}
}

// checkKinds compares the rendered kinds with base plus the optional
// PodMonitor and Istio DestinationRule.
func checkKinds(t *testing.T, objs []*unstructured.Unstructured, base []string, podMonitor, istioTLS bool) {
	t.Helper()
	want := append([]string(nil), base...)
	if podMonitor {
		want = append(want, "PodMonitor")
	}
	if istioTLS {
		want = append(want, "DestinationRule")
	}
	sort.Strings(want)
	if got := kinds(objs); !slices.Equal(got, want) {
		t.Fatalf("rendered %v, want %v", got, want)
	}
}
