package gatewayconformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/gateway-api-inference-extension/conformance/resources"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/livecluster"
)

// timeline records, once a second while a run goes, each change in what
// decides where a pool's requests can go, layer by layer: the app
// namespace's Pods (IP, readiness), its EndpointSlices (ready addresses),
// istiod's endpoint shards for its services (what istiod pushes from), the
// load assignments each stand-in accepted, the hosts per cluster it serves
// with, and its NACKs. When the test fails it prints the changes, so a
// request that did not reach the picker's choice shows which layer lagged:
// the pod's readiness, the EndpointSlice controller, istiod's registry,
// istiod's push, or the stand-in (a NACK, or warming that held an
// accepted assignment back). With -v it prints them always.
type timeline struct {
	start time.Time

	mu     sync.Mutex
	nodes  map[string]*envoysim.Node
	last   map[string]string // by source
	events []string
}

func startTimeline(t *testing.T, l *livecluster.Live) *timeline {
	tl := &timeline{start: time.Now(), nodes: map[string]*envoysim.Node{}, last: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			tl.sample(ctx, l)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() || testing.Verbose() {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			t.Logf("timeline of the app namespace's pods, EndpointSlices and the stand-ins' hosts (seconds since the run began; last 400 changes):\n%s",
				strings.Join(tl.events[max(0, len(tl.events)-400):], "\n"))
		}
	})
	return tl
}

func (tl *timeline) watch(name string, n *envoysim.Node) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.nodes[name] = n
}

func (tl *timeline) sample(ctx context.Context, l *livecluster.Live) {
	state := map[string]string{}
	var pods corev1.PodList
	if err := l.Client.List(ctx, &pods, client.InNamespace(resources.AppBackendNamespace)); err == nil {
		var ps []string
		for _, p := range pods.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
			}
			ps = append(ps, fmt.Sprintf("%s=%s ready=%t", p.Name, p.Status.PodIP, ready))
		}
		slices.Sort(ps)
		state["pods"] = strings.Join(ps, " ")
	}
	var slicesList discoveryv1.EndpointSliceList
	if err := l.Client.List(ctx, &slicesList, client.InNamespace(resources.AppBackendNamespace)); err == nil {
		for _, s := range slicesList.Items {
			var eps []string
			for _, e := range s.Endpoints {
				eps = append(eps, fmt.Sprintf("%v ready=%t", e.Addresses, e.Conditions.Ready != nil && *e.Conditions.Ready))
			}
			state["slice "+s.Name] = strings.Join(eps, ", ")
		}
	}
	maps.Copy(state, istiodShards(ctx))
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for name, n := range tl.nodes {
		// A NACK keeps the rejected resources at their last version (a
		// whole update, when it is not one cluster or listener at fault).
		for typ, st := range n.XDS().Status() {
			if st.NACKs > 0 {
				state["stand-in "+name+" NACK "+typ[strings.LastIndex(typ, ".")+1:]] = fmt.Sprintf("%d NACKs, last of version %q: %s", st.NACKs, st.RejectedVersion, st.LastError)
			}
		}
		for _, h := range n.ClusterHosts() {
			if cl, hosts, ok := strings.Cut(h, ": "); ok && strings.Contains(cl, resources.AppBackendNamespace) {
				state["stand-in "+name+" "+cl] = hosts
			}
		}
		// Istio puts the inference ext_proc filter on a Gateway's
		// listener only while the Gateway has an InferencePool attached;
		// a route's override of a filter the listener lacks does nothing.
		for _, f := range n.ListenerFilters() {
			if l, fs, ok := strings.Cut(f, ": "); ok {
				state["stand-in "+name+" filters "+l] = fs
			}
		}
		for _, h := range n.AssignedHosts() {
			if cl, hosts, ok := strings.Cut(h, ": "); ok && strings.Contains(cl, resources.AppBackendNamespace) {
				state["stand-in "+name+" accepted "+cl] = hosts
			}
		}
	}
	at := time.Since(tl.start).Seconds()
	for _, k := range slices.Sorted(maps.Keys(state)) {
		if tl.last[k] != state[k] {
			tl.events = append(tl.events, fmt.Sprintf("%7.1f %s: %s", at, k, state[k]))
			tl.last[k] = state[k]
		}
	}
}

// istiodShards is istiod's endpoint registry for the app namespace's
// services (its /debug/endpointShardz): the endpoints it builds load
// assignments from, by service host. Empty when istiod does not answer
// (not started yet, or the Envoy Gateway runs).
func istiodShards(ctx context.Context) map[string]string {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	// service host -> namespace -> {Shards: shard -> endpoints}
	var shards map[string]map[string]struct {
		Shards map[string][]struct {
			Addresses    []string
			EndpointPort uint32
			HealthStatus int
		}
	}
	if err := istiodDebug(ctx, "/debug/endpointShardz", &shards); err != nil {
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if errors.As(err, &syntax) || errors.As(err, &typ) {
			return map[string]string{"istiod shards": "unreadable: " + err.Error()}
		}
		return nil // istiod not answering yet
	}
	out := map[string]string{}
	for host, byNS := range shards {
		for ns, es := range byNS {
			if ns != resources.AppBackendNamespace {
				continue
			}
			var eps []string
			for _, list := range es.Shards {
				for _, e := range list {
					eps = append(eps, fmt.Sprintf("%v:%d health=%d", e.Addresses, e.EndpointPort, e.HealthStatus))
				}
			}
			slices.Sort(eps)
			out["istiod shards "+host] = strings.Join(eps, ", ")
		}
	}
	return out
}

// istiodDebug decodes istiod's answer to the debug path into v.
func istiodDebug(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+gatewaytest.IstioHTTP+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("istiod %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
