// Package gatewaytest is what the tests that run a real gateway control
// plane (Envoy Gateway, Istio) share: a private network namespace to run
// in, the API server with a kubeconfig for the control plane's process, an
// xDS node that records what the control plane sends, and the Envoy
// stand-in as the gateway's Envoy.
package gatewaytest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/envoysim/xdsclient"
	"github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/controlplane"
)

// NetnsEnv marks the re-run inside the namespace; a child test process
// that is to make a namespace of its own runs without it.
const NetnsEnv = "INFERGATE_TEST_NETNS"

// Main is a TestMain body: the first run re-executes the test binary under
// unshare with unshareArgs (e.g. --net, --mount) and returns its exit
// code; the re-run calls setUp inside the new namespaces, then the tests.
// Control planes that bind every interface or read fixed paths run there
// without touching the machine.
func Main(m *testing.M, unshareArgs []string, setUp func() error) int {
	if !InNamespace() {
		return Reexec(unshareArgs)
	}
	if err := setUp(); err != nil {
		fmt.Fprintln(os.Stderr, "setting up the namespace:", err)
		return 1
	}
	return m.Run()
}

// BridgeAddr is the address of a test namespace's own interface, a bridge
// with no ports (this kernel has no dummy driver) that also carries the
// default route: the API server wants an address that is not loopback to
// advertise. Nothing is sent through it.
const BridgeAddr = "192.0.2.1"

// PodAddr is the i-th address of the test namespace's pods (192.0.2.10
// on): model servers, pickers and processors that the API server must
// list in EndpointSlices.
func PodAddr(i int) string { return fmt.Sprintf("192.0.2.%d", 10+i) }

// SetUpPodAddrs is SetUpBridge with the first n PodAddr addresses.
func SetUpPodAddrs(n int) error {
	pods := make([]string, n)
	for i := range pods {
		pods[i] = PodAddr(i)
	}
	return SetUpBridge(pods...)
}

// SetUpBridge brings up loopback and the bridge (BridgeAddr/24), with more
// addresses (each /32) on it for servers that listen on addresses the API
// server accepts in EndpointSlices, which loopback ones are not.
func SetUpBridge(more ...string) error {
	cmds := [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "infergate0", "type", "bridge"},
		{"addr", "add", BridgeAddr + "/24", "dev", "infergate0"},
	}
	for _, a := range more {
		cmds = append(cmds, []string{"addr", "add", a + "/32", "dev", "infergate0"})
	}
	cmds = append(cmds, []string{"link", "set", "infergate0", "up"}, []string{"route", "add", "default", "dev", "infergate0"})
	for _, args := range cmds {
		if err := IP(args...); err != nil {
			return err
		}
	}
	return nil
}

// InNamespace reports whether this process is Reexec's re-run.
func InNamespace() bool { return os.Getenv(NetnsEnv) != "" }

// Reexec runs this program again, with its arguments, under unshare with
// unshareArgs, behind wrapper if given (e.g. taskset -c 0), and returns
// the re-run's exit code.
//
// The re-run is also the first process of a PID namespace of its own
// (with its own /proc, so that the pids its processes see are the ones
// /proc lists): when it ends, however it ends, the kernel kills every
// process it left, and a killed parent takes it along (Pdeathsig on
// unshare, unshare's --kill-child on the re-run). Without that, a test
// binary that panics at its -timeout leaves behind what it started
// without a Pdeathsig of its own: envtest's kube-apiserver and etcd.
func Reexec(unshareArgs []string, wrapper ...string) int {
	args := append([]string{"--pid", "--fork", "--kill-child", "--mount-proc"}, unshareArgs...)
	args = append(append(args, "--"), wrapper...)
	cmd := exec.Command("unshare", append(append(args, os.Args[0]), os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), NetnsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "unshare (needs root):", err)
		return 1
	}
	return 0
}

// IP runs `ip args...`, for namespace set-up.
func IP(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %v: %w: %s", args, err, out)
	}
	return nil
}

// Cluster is the API server, a client of it, and a kubeconfig of an
// administrator for the control plane's process.
type Cluster struct {
	Env        *controlplane.Env
	Client     client.Client
	Kubeconfig string
	Dir        string // a temporary folder of the test
}

// StartCluster brings up the API server with the Gateway API and
// InferencePool CRDs and those in crdDirs, until the test ends; user
// names the administrator the kubeconfig is for.
func StartCluster(t *testing.T, user string, crdDirs ...string) *Cluster {
	t.Helper()
	return StartClusterChannel(t, user, controlplane.StandardChannel, crdDirs...)
}

// StartClusterChannel is StartCluster with the Gateway API CRDs of the
// given channel (controlplane.StandardChannel or ExperimentalChannel).
func StartClusterChannel(t *testing.T, user, channel string, crdDirs ...string) *Cluster {
	t.Helper()
	env, err := controlplane.StartChannel(Ctx(t), channel, crdDirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme, err := controlplane.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := env.AddUser(user, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := dir + "/kubeconfig"
	if err := WriteKubeconfig(kc, admin); err != nil {
		t.Fatal(err)
	}
	return &Cluster{Env: env, Client: c, Kubeconfig: kc, Dir: dir}
}

// WriteKubeconfig writes cfg as a kubeconfig file.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}

// Ctx is a context for one step of a test, bounded well under go test's
// own timeout.
func Ctx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond until it holds, failing the test after d.
func WaitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Run starts a control plane's process, bin args..., with env added to
// this process's, until the test ends (an interrupt, then a kill after 10
// s). Its output goes to name.log in the cluster's folder, whose last lines
// are shown when the test fails, or always in verbose runs.
func (c *Cluster) Run(t *testing.T, name string, env []string, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(c.Dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	// A test binary killed from outside (a go test -timeout, a CI cancel)
	// runs no cleanup: the kernel ends its control planes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() || testing.Verbose() {
			t.Logf("%s log (last lines):\n%s", name, childproc.Tail(logPath, 60))
		}
	})
}

// XDS is an xDS node that keeps the last resources of each type it was
// sent, decoded; read them under Mu.
type XDS struct {
	Mu        sync.Mutex
	Listeners map[string]*listenerv3.Listener
	Routes    map[string]*routev3.RouteConfiguration
	Clusters  map[string]*clusterv3.Cluster
}

// CaptureXDS connects a node of cfg (Server, NodeID and the rest) to the
// control plane until the test ends, subscribing to clusters and
// listeners and to the routes the listeners name.
func CaptureXDS(t *testing.T, cfg xdsclient.Config) *XDS {
	t.Helper()
	x := &XDS{}
	var c *xdsclient.Client
	h := xdsclient.HandlerFunc(func(_ context.Context, typ, _ string, rs []*anypb.Any) error {
		x.Mu.Lock()
		defer x.Mu.Unlock()
		switch typ {
		case xdsclient.ListenerType:
			x.Listeners = map[string]*listenerv3.Listener{}
			var rds []string
			for _, r := range rs {
				l := &listenerv3.Listener{}
				if err := r.UnmarshalTo(l); err != nil {
					return err
				}
				x.Listeners[l.GetName()] = l
				for _, hcm := range ListenerHCMs(l) {
					if hcm.GetRds() != nil {
						rds = append(rds, hcm.GetRds().GetRouteConfigName())
					}
				}
			}
			c.Subscribe(xdsclient.RouteType, rds)
		case xdsclient.RouteType:
			x.Routes = map[string]*routev3.RouteConfiguration{}
			for _, r := range rs {
				rc := &routev3.RouteConfiguration{}
				if err := r.UnmarshalTo(rc); err != nil {
					return err
				}
				x.Routes[rc.GetName()] = rc
			}
		case xdsclient.ClusterType:
			x.Clusters = map[string]*clusterv3.Cluster{}
			for _, r := range rs {
				cl := &clusterv3.Cluster{}
				if err := r.UnmarshalTo(cl); err != nil {
					return err
				}
				x.Clusters[cl.GetName()] = cl
			}
		}
		return nil
	})
	cfg.Logger = logr.Discard()
	c, err := xdsclient.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	c.Subscribe(xdsclient.ClusterType, nil)
	c.Subscribe(xdsclient.ListenerType, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return x
}

// ListenerHCMs are the HTTP connection managers of every filter chain of l.
func ListenerHCMs(l *listenerv3.Listener) []*hcmv3.HttpConnectionManager {
	var out []*hcmv3.HttpConnectionManager
	chains := slices.Clone(l.GetFilterChains())
	if l.GetDefaultFilterChain() != nil {
		chains = append(chains, l.GetDefaultFilterChain())
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig().UnmarshalTo(hcm) == nil {
				out = append(out, hcm)
			}
		}
	}
	return out
}

// StandIn runs the Envoy stand-in as an xDS node of cfg (or from its
// bootstrap) until the test ends, logging to the test in verbose runs; a
// Run that ends in error fails the test.
func StandIn(t testing.TB, cfg envoysim.NodeConfig) *envoysim.Node {
	t.Helper()
	cfg.Logger = logr.Discard()
	if tt, ok := t.(*testing.T); ok && testing.Verbose() {
		cfg.Logger = testr.New(tt)
	}
	n, err := envoysim.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("stand-in: %v", err)
		}
	})
	return n
}

// ListenerURL waits until the stand-in serves the first of listeners it
// has, and returns its base URL.
func ListenerURL(t testing.TB, n *envoysim.Node, listeners ...string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, l := range listeners {
			if a, ok := n.ListenerAddr(l); ok {
				return "http://" + a
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stand-in serves none of %v", listeners)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Built is the folder a hack/ build script prints (it builds once into
// $HOME/.cache/infergate and reuses that), or $env when set (make test
// runs the scripts first and sets it).
func Built(t *testing.T, env, script string) string {
	t.Helper()
	if v := os.Getenv(env); v != "" {
		return v
	}
	ctx := Ctx(t)
	root, err := controlplane.ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", script))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/%s: %v\n%s", script, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// StartPicker runs infergate's endpoint picker at addr over TLS, fed a
// pool file of servers (address → name), until the test ends or stop. It
// stops as its chart stops it (shutdownDelaySeconds: 5): serving on with
// its health NOT_SERVING, which a gateway's health check sees, then
// draining; it returns once the picker reports ready.
func StartPicker(t *testing.T, addr string, servers map[string]string) (stop func()) {
	t.Helper()
	var sb strings.Builder
	sb.WriteString("name: pool\nendpoints:\n")
	for a, name := range servers {
		fmt.Fprintf(&sb, "- address: %s\n  name: %s\n", a, name)
	}
	pool := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(pool, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := epp.NewService(epp.Config{
		Server: server.Options{GRPCAddr: addr, HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			TLS: server.TLSOptions{Enabled: true}, DrainTimeout: time.Second, ShutdownDelay: 5 * time.Second},
		PoolFile: pool, MetricsStaleness: 2 * time.Second, Logger: logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	if err := childproc.WaitReady(context.Background(), s.HealthAddr(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return stop
}

// PrivateMounts mounts an empty tmpfs on each folder (made if missing),
// for a test in its own mount namespace: control planes that read fixed
// paths (Envoy Gateway's /certs, in-cluster credentials) find the test's
// files there and nothing else sees them.
func PrivateMounts(dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount("tmpfs", d, "tmpfs", 0, "size=1m"); err != nil {
			return fmt.Errorf("mount a private %s: %w", d, err)
		}
	}
	return nil
}
