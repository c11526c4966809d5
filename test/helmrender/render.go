// Package helmrender renders a chart the way `helm install` does before it
// talks to the cluster, with Helm's own libraries, for tests that check or
// apply what the charts produce.
package helmrender

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Values merges YAML value documents as repeated `helm install -f` does:
// later documents win.
func Values(docs ...string) (map[string]any, error) {
	merged := map[string]any{}
	for _, doc := range docs {
		v, err := chartutil.ReadValues([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("values %q: %w", doc, err)
		}
		// CoalesceTables keeps dst's values over src's.
		merged = chartutil.CoalesceTables(v.AsMap(), merged)
	}
	return merged, nil
}

// Render coalesces the values with the chart's defaults, validates them
// against values.schema.json, renders the templates for a cluster of
// kubeVersion and splits the manifests into objects, in Helm's install
// order. An error is what the user would see.
func Render(ch *chart.Chart, release, namespace string, vals map[string]any, kubeVersion chartutil.KubeVersion) ([]*unstructured.Unstructured, error) {
	return render(ch, release, namespace, vals, kubeVersion, true)
}

// RenderThirdParty is Render for a chart this project did not write:
// documents with no object (only comments), which Render refuses in this
// project's charts, are dropped, as Helm's install drops them.
func RenderThirdParty(ch *chart.Chart, release, namespace string, vals map[string]any, kubeVersion chartutil.KubeVersion) ([]*unstructured.Unstructured, error) {
	return render(ch, release, namespace, vals, kubeVersion, false)
}

func render(ch *chart.Chart, release, namespace string, vals map[string]any, kubeVersion chartutil.KubeVersion, strict bool) ([]*unstructured.Unstructured, error) {
	caps := chartutil.DefaultCapabilities.Copy()
	if kubeVersion.Version != "" {
		caps.KubeVersion = kubeVersion
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var objs []*unstructured.Unstructured
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		docs := releaseutil.SplitManifests(files[name])
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			u, err := decode(docs[k])
			if errors.Is(err, errNoObject) && !strict {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", name, err, docs[k])
			}
			objs = append(objs, u)
		}
	}
	return objs, nil
}

var errNoObject = errors.New("a document with no object (comments only?)")

// decode turns one rendered document into an object. A document that is
// only comments is an error: templates that render nothing must render
// nothing at all.
func decode(doc string) (*unstructured.Unstructured, error) {
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	if string(js) == "null" {
		return nil, errNoObject
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(js); err != nil {
		return nil, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	return u, nil
}
