// Package controlplane starts a real kube-apiserver and etcd for tests,
// through controller-runtime's envtest, with the Gateway API (standard
// channel, or experimental) and InferencePool CRDs installed from the pinned Go modules
// (nothing is downloaded). The
// binaries come from KUBEBUILDER_ASSETS, or from hack/controlplane.sh,
// which builds kube-apiserver once into $HOME/.cache/infergate and
// installs Debian's etcd-server.
//
// There is no kubelet, scheduler or controller-manager: tests create Pods
// and set their status themselves (see SetPodReady).
package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Env is a running control plane.
type Env struct {
	env    *envtest.Environment
	Config *rest.Config
}

// Gateway API release channels, as the module's config/crd folders name
// them. Experimental serves more kinds, and more versions of some
// (TLSRoute and TCPRoute v1alpha2, which controllers built on older
// Gateway API releases still list).
const (
	StandardChannel     = "standard"
	ExperimentalChannel = "experimental"
)

// Start brings the control plane up with the Gateway API's standard
// channel; Stop takes it down. Extra CRD directories are installed besides
// the Gateway API and InferencePool ones.
func Start(ctx context.Context, extraCRDDirs ...string) (*Env, error) {
	return StartChannel(ctx, StandardChannel, extraCRDDirs...)
}

// StartChannel is Start with the Gateway API CRDs of the given channel.
func StartChannel(ctx context.Context, channel string, extraCRDDirs ...string) (*Env, error) {
	assets, err := assets(ctx)
	if err != nil {
		return nil, err
	}
	gaie, err := ModuleDir(ctx, "sigs.k8s.io/gateway-api-inference-extension")
	if err != nil {
		return nil, err
	}
	gwapi, err := ModuleDir(ctx, "sigs.k8s.io/gateway-api")
	if err != nil {
		return nil, err
	}
	if channel != StandardChannel && channel != ExperimentalChannel {
		return nil, fmt.Errorf("the Gateway API channel %q: want %s or %s", channel, StandardChannel, ExperimentalChannel)
	}
	dirs := []string{filepath.Join(gwapi, "config", "crd", channel), filepath.Join(gaie, "config", "crd", "bases")}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     append(dirs, extraCRDDirs...),
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("envtest with %s: %w", assets, err)
	}
	return &Env{env: env, Config: cfg}, nil
}

// Scheme holds the built-in kinds, the Gateway API and InferencePool.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, gatewayv1.Install, inferencev1.Install} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// AddUser creates credentials for a user in groups (RBAC is on), to test
// what a Role allows.
func (e *Env) AddUser(name string, groups ...string) (*rest.Config, error) {
	u, err := e.env.ControlPlane.AddUser(envtest.User{Name: name, Groups: groups}, e.Config)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

// assets is the folder with kube-apiserver and etcd.
func assets(ctx context.Context) (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "controlplane.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/controlplane.sh: %w\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// ModuleRoot is the folder of this repository's go.mod.
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// Version is infergate's release version, the VERSION file at the module
// root.
func Version(ctx context.Context) (string, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	v, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(v)), nil
}

// ModuleDir finds a required module in the module cache.
func ModuleDir(ctx context.Context, module string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", module, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("module %s is not in the module cache (go mod download)", module)
	}
	return dir, nil
}
