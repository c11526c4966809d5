package gateway

import (
	"io/fs"
	"strings"
	"testing"

	gie "sigs.k8s.io/gateway-api-inference-extension/conformance"
	"sigs.k8s.io/yaml"
)

func TestRewriteBaseRunsInfergate(t *testing.T) {
	img := Images{EPP: "example.test/infergate:1", ModelServer: "example.test/infergate:2"}
	fsys, err := manifests(&gie.Manifests, img)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fs.ReadFile(fsys, baseManifests)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), upstreamLWEPP) || strings.Contains(string(b), upstreamEcho) {
		t.Fatal("an upstream test image survived the rewrite")
	}
	pickers, echoes, h2c := 0, 0, 0
	for _, doc := range splitYAML(b) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatal(err)
		}
		for _, c := range asSlice(dig(obj, "spec", "template", "spec")["containers"]) {
			ctr := c.(map[string]any)
			args := strings.Join(stringsOf(ctr["args"]), " ")
			switch ctr["image"] {
			case img.EPP:
				pickers++
				if !strings.HasPrefix(args, "epp --pool-name ") || !strings.Contains(args, "--conformance-test-mode") ||
					!strings.Contains(args, "--grpc-bind-address $(POD_IP)") || flagValue(stringsOf(ctr["args"]), "--pool-namespace") != "inference-conformance-app-backend" {
					t.Errorf("%s: picker args %q", name(obj), args)
				}
				if s := dig(ctr, "readinessProbe", "grpc")["service"]; s != "readiness" {
					t.Errorf("%s: readiness probe service %v", name(obj), s)
				}
			case img.ModelServer:
				echoes++
				if !strings.HasPrefix(args, "sim --echo --address $(POD_IP) --port 30") {
					t.Errorf("%s: echo args %q", name(obj), args)
				}
				if strings.Contains(args, "--h2c-port 3001") {
					h2c++
				}
			}
			if !strings.Contains(string(doc), "status.podIP") {
				t.Errorf("%s: no POD_IP", name(obj))
			}
		}
	}
	// Five pools, one picker each; three single-container Deployments and
	// one of three data-parallel containers; only the appProtocol pool's
	// servers declare the h2c port.
	if pickers != 5 || echoes != 6 || h2c != 1 {
		t.Fatalf("%d pickers, %d echo containers, %d with h2c", pickers, echoes, h2c)
	}
	if !strings.Contains(string(b), "inferenceobjectives") {
		t.Fatal("the pickers' Role cannot read InferenceObjectives")
	}
	// The tests' own manifests come from upstream unchanged.
	up, _ := fs.ReadFile(&gie.Manifests, "tests/inferencepool_accepted.yaml")
	got, err := fs.ReadFile(fsys, "tests/inferencepool_accepted.yaml")
	if err != nil || string(got) != string(up) {
		t.Fatalf("test manifest changed: %v", err)
	}
}

func TestRewriteBaseRefusesAnUnknownShape(t *testing.T) {
	_, err := rewriteBase([]byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n"), Images{EPP: "a", ModelServer: "b"})
	if err == nil || !strings.Contains(err.Error(), "changed shape") {
		t.Fatalf("err = %v", err)
	}
}

// TestEveryTestManifestIsServed: each test's manifests, upstream's and
// infergate's, are in the FS the suite applies from, and infergate's parse.
func TestEveryTestManifestIsServed(t *testing.T) {
	fsys, err := manifests(&gie.Manifests, Images{EPP: "e", ModelServer: "m"})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tc := range AllTests(Options{}) {
		if names[tc.ShortName] {
			t.Errorf("two tests named %s", tc.ShortName)
		}
		names[tc.ShortName] = true
		for _, m := range tc.Manifests {
			b, err := fs.ReadFile(fsys, m)
			if err != nil {
				t.Errorf("%s: %v", tc.ShortName, err)
				continue
			}
			for _, doc := range splitYAML(b) {
				var obj map[string]any
				if err := yaml.Unmarshal(doc, &obj); err != nil {
					t.Errorf("%s: %s: %v", tc.ShortName, m, err)
				}
			}
		}
	}
	if len(AllTests(Options{UpstreamOnly: true})) != len(Tests()) || len(AllTests(Options{})) != len(Tests())+len(StrictTests()) {
		t.Fatal("AllTests does not add infergate's tests to upstream's exactly when asked")
	}
}
