package gateway

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
	"testing/fstest"

	"sigs.k8s.io/yaml"
)

// Images are the container images the base manifests run: infergate's, in
// place of the upstream suite's test picker (lwepp) and echo server
// (echo-basic), run as `infergate epp --conformance-test-mode` and
// `infergate sim --echo`.
type Images struct {
	EPP, ModelServer string
}

// Upstream image names the rewrite recognises (by prefix: tags change
// between suite versions).
const (
	upstreamEcho  = "gcr.io/k8s-staging-gateway-api/echo-basic"
	upstreamLWEPP = "registry.k8s.io/gateway-api-inference-extension/lwepp"
)

// baseManifests is the path of the suite's shared resources in its FS.
const baseManifests = "resources/base.yaml"

// manifests returns upstream's manifest FS with base.yaml rewritten to run
// img, and infergate's tests' manifests under strictManifestDir; every
// other file (upstream's tests' own manifests) is upstream's.
func manifests(upstream fs.FS, img Images) (fs.FS, error) {
	base, err := fs.ReadFile(upstream, baseManifests)
	if err != nil {
		return nil, err
	}
	rewritten, err := rewriteBase(base, img)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", baseManifests, err)
	}
	top := fstest.MapFS{baseManifests: {Data: rewritten, Mode: 0o444}}
	// infergate's tests' manifests, under their own folder.
	entries, err := fs.ReadDir(strictManifests, "strict")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		b, err := fs.ReadFile(strictManifests, "strict/"+e.Name())
		if err != nil {
			return nil, err
		}
		// A test's own pickers and echo servers are written as upstream's
		// are, and run the same images.
		if b, _, err = rewrite(b, img); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", strictManifestDir, e.Name(), err)
		}
		top[strictManifestDir+"/"+e.Name()] = &fstest.MapFile{Data: b, Mode: 0o444}
	}
	return overlay{upstream, top}, nil
}

// overlay serves top's files, and base's for the rest.
type overlay struct {
	base fs.FS
	top  fstest.MapFS
}

func (o overlay) Open(name string) (fs.File, error) {
	if _, ok := o.top[name]; ok {
		return o.top.Open(name)
	}
	return o.base.Open(name)
}

// rewriteBase swaps the test picker and echo containers of the base
// manifests for infergate's, and lets the pickers' Role read what
// infergate's picker watches. Everything else is left as upstream wrote it,
// so names, namespaces, labels and ports stay those the tests expect.
func rewriteBase(base []byte, img Images) ([]byte, error) {
	out, seen, err := rewrite(base, img)
	if err != nil {
		return nil, err
	}
	if seen["epp"] == 0 || seen["echo"] == 0 {
		return nil, fmt.Errorf("found %d test picker and %d echo containers (images %s:*, %s:*); the suite's manifests changed shape", seen["epp"], seen["echo"], upstreamLWEPP, upstreamEcho)
	}
	return out, nil
}

// rewrite is rewriteBase for any manifests: it also returns how many
// picker ("epp") and echo ("echo") containers it swapped.
func rewrite(manifests []byte, img Images) ([]byte, map[string]int, error) {
	var out bytes.Buffer
	seen := map[string]int{}
	for i, doc := range splitYAML(manifests) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, nil, fmt.Errorf("document %d: %w", i, err)
		}
		if obj == nil {
			continue
		}
		switch obj["kind"] {
		case "Deployment":
			containers, _ := dig(obj, "spec", "template", "spec")["containers"].([]any)
			for _, c := range containers {
				ctr, _ := c.(map[string]any)
				image, _ := ctr["image"].(string)
				switch {
				case strings.HasPrefix(image, upstreamLWEPP+":"):
					if err := asPicker(ctr, img.EPP); err != nil {
						return nil, nil, fmt.Errorf("document %d (%s): %w", i, name(obj), err)
					}
					seen["epp"]++
				case strings.HasPrefix(image, upstreamEcho+":"):
					if err := asEcho(ctr, img.ModelServer); err != nil {
						return nil, nil, fmt.Errorf("document %d (%s): %w", i, name(obj), err)
					}
					seen["echo"]++
				}
			}
		case "Role":
			rules, _ := obj["rules"].([]any)
			obj["rules"] = append(rules, map[string]any{
				"apiGroups": []any{"llm-d.ai"}, "resources": []any{"inferenceobjectives", "inferencemodelrewrites"},
				"verbs": []any{"get", "list", "watch"},
			})
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			return nil, nil, err
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	return out.Bytes(), seen, nil
}

// asPicker makes an lwepp container infergate's picker in conformance-test
// mode for the same pool, on the Pod's own address, TLS with a self-signed
// certificate as lwepp serves, and probed on infergate's health services.
func asPicker(ctr map[string]any, image string) error {
	args := stringsOf(ctr["args"])
	pool, ns := flagValue(args, "--pool-name"), flagValue(args, "--pool-namespace")
	if pool == "" || ns == "" {
		return fmt.Errorf("test picker args %v name no --pool-name and --pool-namespace", args)
	}
	ctr["image"] = image
	ctr["args"] = []any{"epp", "--pool-name", pool, "--pool-namespace", ns, "--conformance-test-mode",
		"--grpc-port", "9002", "--grpc-health-port", "9003", "--metrics-port", "9090",
		"--grpc-bind-address", "$(POD_IP)", "--grpc-health-bind-address", "$(POD_IP)", "--metrics-bind-address", "$(POD_IP)"}
	ctr["env"] = withPodIP(ctr["env"])
	for probe, service := range map[string]string{"livenessProbe": "liveness", "readinessProbe": "readiness"} {
		if p, ok := ctr[probe].(map[string]any); ok {
			if g, ok := p["grpc"].(map[string]any); ok {
				g["service"] = service
			}
		}
	}
	return nil
}

// asEcho makes an echo-basic container infergate's sim in echo mode on the
// ports echo-basic would take (HTTP_PORT, default 3000; H2C_PORT when the
// container declares it).
func asEcho(ctr map[string]any, image string) error {
	env := map[string]string{}
	for _, e := range asSlice(ctr["env"]) {
		m, _ := e.(map[string]any)
		if v, ok := m["value"].(string); ok {
			env[m["name"].(string)] = v
		}
	}
	httpPort := env["HTTP_PORT"]
	if httpPort == "" {
		httpPort = "3000"
	}
	args := []any{"sim", "--echo", "--address", "$(POD_IP)", "--port", httpPort}
	if h2c := env["H2C_PORT"]; h2c != "" && declaresPort(ctr, h2c) {
		args = append(args, "--h2c-port", h2c)
	}
	ctr["image"] = image
	ctr["args"] = args
	ctr["env"] = withPodIP(ctr["env"])
	return nil
}

func declaresPort(ctr map[string]any, port string) bool {
	for _, p := range asSlice(ctr["ports"]) {
		m, _ := p.(map[string]any)
		if fmt.Sprint(m["containerPort"]) == port {
			return true
		}
	}
	return false
}

// withPodIP adds POD_IP from the downward API unless the container has it.
func withPodIP(env any) []any {
	list := asSlice(env)
	for _, e := range list {
		if m, _ := e.(map[string]any); m["name"] == "POD_IP" {
			return list
		}
	}
	return append(list, map[string]any{"name": "POD_IP", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.podIP"}}})
}

func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), b...), []byte("\n---")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m, _ = m[k].(map[string]any)
	}
	return m
}

func name(obj map[string]any) string {
	n, _ := dig(obj, "metadata")["name"].(string)
	return n
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func stringsOf(v any) []string {
	var out []string
	for _, x := range asSlice(v) {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}
