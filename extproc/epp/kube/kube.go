// Package kube feeds the endpoint picker's datastore from Kubernetes: the
// InferencePool it serves, the Pods the pool selects, and the
// InferenceObjectives and InferenceModelRewrites that name the pool. It is
// the pool-file source's sibling (package poolfile). Every ready Pod with
// an IP becomes one endpoint per target port (data-parallel ranks);
// scale-out, scale-in, readiness flips and IP changes follow from the
// watch without a restart, and a missing pool is an empty endpoint set
// (the picker then answers 503) until it comes back.
//
// Pods are watched directly rather than through EndpointSlices: the
// picker needs the pod's labels (engine type, role) anyway, and it is one
// of the two ways the inference-extension implementers' guide allows.
package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/extproc/epp/datastore"
)

// Options say which pool to follow and where the result goes.
type Options struct {
	Config    *rest.Config
	Namespace string
	PoolName  string
	// EngineLabel is the pod label naming the model-server engine.
	EngineLabel string
	// LeaderElection makes replicas active-passive: only the leader
	// reports ready, so the gateway sends it all traffic; the others keep
	// their endpoint sets warm to take over.
	LeaderElection bool
	// LeaseName defaults to "<pool>-epp".
	LeaseName string
	// Store receives the pool's endpoints, and the InferenceObjectives
	// and InferenceModelRewrites (oldest object first) that name the
	// pool, after every change.
	Store *datastore.Store
	// SetReady is called whenever readiness changes: synced, and leader
	// when leader election is on.
	SetReady func(bool)
	Logger   logr.Logger
}

// newScheme holds the kinds the picker reads.
func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := inferencev1.Install(s); err != nil {
		return nil, err
	}
	return s, nil
}

// RoleRules are the least-privilege permissions the picker needs in its
// pool's namespace: read its InferencePool, the Pods, the
// InferenceObjectives and InferenceModelRewrites, and hold a Lease for
// leader election. The Helm chart's Role grants exactly these.
func RoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{inferencev1.GroupName}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{ObjectiveGVK.Group}, Resources: []string{"inferenceobjectives", "inferencemodelrewrites"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}

// Run follows the pool until ctx ends or leadership is lost.
func Run(ctx context.Context, o Options) error {
	if o.Namespace == "" || o.PoolName == "" {
		return errors.New("--pool-name and --pool-namespace are required in Kubernetes mode")
	}
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	if o.LeaseName == "" {
		o.LeaseName = o.PoolName + "-epp"
	}
	if o.SetReady == nil {
		o.SetReady = func(bool) {}
	}
	mgr, err := ctrl.NewManager(o.Config, ctrl.Options{
		Scheme: scheme,
		Logger: o.Logger,
		// Only the pool's namespace: the Role the chart grants is namespaced.
		Cache:                         cache.Options{DefaultNamespaces: map[string]cache.Config{o.Namespace: {}}},
		Metrics:                       metricsserver.Options{BindAddress: "0"}, // the picker serves its own
		HealthProbeBindAddress:        "0",
		LeaderElection:                o.LeaderElection,
		LeaderElectionID:              o.LeaseName,
		LeaderElectionNamespace:       o.Namespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	r := &reconciler{client: mgr.GetClient(), key: types.NamespacedName{Namespace: o.Namespace, Name: o.PoolName},
		engineLabel: o.EngineLabel, store: o.Store, log: o.Logger.WithName("pool"), first: make(chan struct{})}
	toPool := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: r.key}}
	})
	notLeaderOnly, skipNameCheck := false, true
	b := builder.ControllerManagedBy(mgr).
		Named("inferencepool-endpoints").
		For(&inferencev1.InferencePool{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			return obj.GetName() == o.PoolName
		}))).
		Watches(&corev1.Pod{}, toPool).
		// Every replica keeps its endpoint set current, leader or not.
		// The name check guards controller-runtime's process-wide metrics,
		// which the picker does not serve; tests run several pickers.
		WithOptions(controller.Options{NeedLeaderElection: &notLeaderOnly, MaxConcurrentReconciles: 1, SkipNameValidation: &skipNameCheck})
	// InferenceObjectives and InferenceModelRewrites are optional: without
	// their CRDs the picker runs with no priorities (every request 0) and
	// no rewrites rather than not at all.
	for _, k := range []struct {
		gvk     schema.GroupVersionKind
		on      *bool
		without string
	}{{ObjectiveGVK, &r.objectives, "priorities are all 0"}, {RewriteGVK, &r.rewrites, "no model rewrites"}} {
		if _, err := mgr.GetRESTMapper().RESTMapping(k.gvk.GroupKind(), k.gvk.Version); err != nil {
			o.Logger.Info("CRD not installed: "+k.without, "kind", k.gvk.String(), "reason", err.Error())
			continue
		}
		*k.on = true
		b = b.Watches(newUnstructured(k.gvk), toPool)
	}
	if err := b.Complete(r); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	go reportReadiness(ctx, mgr, r, o)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	return nil
}

// reportReadiness turns ready once the first reconcile has filled the store
// and, with leader election, this replica leads.
func reportReadiness(ctx context.Context, mgr ctrl.Manager, r *reconciler, o Options) {
	o.SetReady(false)
	// With no pool and no pods nothing would trigger a reconcile: run one
	// as soon as the cache is synced, so "no pool" is a known, empty set.
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return
	}
	if _, err := r.Reconcile(ctx, reconcile.Request{}); err != nil {
		o.Logger.Error(err, "first sync")
	}
	select {
	case <-r.first:
	case <-ctx.Done():
		return
	}
	if o.LeaderElection {
		select {
		case <-mgr.Elected():
			o.Logger.Info("leading: ready to serve", "lease", o.Namespace+"/"+o.LeaseName)
		case <-ctx.Done():
			return
		}
	}
	o.SetReady(true)
	<-ctx.Done()
	o.SetReady(false)
}

// reconciler rebuilds the endpoint set from the pool and its pods.
type reconciler struct {
	client      client.Client
	key         types.NamespacedName
	engineLabel string
	store       *datastore.Store
	log         logr.Logger
	// objectives and rewrites are true when their CRDs are served.
	objectives, rewrites bool

	mu sync.Mutex
	// first closes after the first endpoint set is in the store.
	first     chan struct{}
	firstOnce sync.Once
}

func (r *reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	// One rebuild at a time, so a slower one cannot overwrite a newer set.
	r.mu.Lock()
	defer r.mu.Unlock()
	specs, err := r.endpoints(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	if r.objectives {
		objs, err := r.inferenceObjectives(ctx)
		if err != nil {
			return reconcile.Result{}, err
		}
		r.store.SetObjectives(objs)
	}
	if r.rewrites {
		rw, err := r.modelRewrites(ctx)
		if err != nil {
			return reconcile.Result{}, err
		}
		r.store.SetModelRewrites(rw)
	}
	if err := r.store.Replace(specs); err != nil {
		// A spec the store refuses (an engine label it does not know) is
		// a pod problem, not a reason to stop following the pool.
		r.log.Error(err, "endpoint set refused; keeping the previous one")
		return reconcile.Result{RequeueAfter: 10 * time.Second}, nil
	}
	r.firstOnce.Do(func() { close(r.first) })
	return reconcile.Result{}, nil
}

func (r *reconciler) endpoints(ctx context.Context) ([]datastore.Spec, error) {
	var pool inferencev1.InferencePool
	if err := r.client.Get(ctx, r.key, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.log.V(1).Info("pool not found: no endpoints", "pool", r.key)
			return nil, nil
		}
		return nil, fmt.Errorf("get pool %s: %w", r.key, err)
	}
	selector := make(client.MatchingLabels, len(pool.Spec.Selector.MatchLabels))
	for k, v := range pool.Spec.Selector.MatchLabels {
		selector[string(k)] = string(v)
	}
	if len(selector) == 0 {
		return nil, nil // the CRD requires one; never select the whole namespace
	}
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.InNamespace(r.key.Namespace), selector); err != nil {
		return nil, fmt.Errorf("list pods of %s: %w", r.key, err)
	}
	return Specs(pods.Items, pool.Spec.TargetPorts, r.engineLabel), nil
}

// ObjectiveGVK is InferenceObjective in the llm-d.ai/v1alpha2 shape
// (config/crd/llm-d.ai_inferenceobjectives.yaml).
var ObjectiveGVK = schema.GroupVersionKind{Group: "llm-d.ai", Version: "v1alpha2", Kind: "InferenceObjective"}

// RewriteGVK is InferenceModelRewrite in the llm-d.ai/v1alpha2 shape
// (config/crd/llm-d.ai_inferencemodelrewrites.yaml).
var RewriteGVK = schema.GroupVersionKind{Group: "llm-d.ai", Version: "v1alpha2", Kind: "InferenceModelRewrite"}

// The llm-d.ai kinds are read as unstructured objects: a handful of
// fields do not justify generated types.
func newUnstructured(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

// ofPool lists the objects of a kind in the pool's namespace whose
// spec.poolRef names this pool, oldest first (then by name).
func (r *reconciler) ofPool(ctx context.Context, gvk schema.GroupVersionKind) ([]unstructured.Unstructured, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := r.client.List(ctx, list, client.InNamespace(r.key.Namespace)); err != nil {
		return nil, fmt.Errorf("list %s: %w", gvk.Kind, err)
	}
	var out []unstructured.Unstructured
	for _, o := range list.Items {
		if pool, _, _ := unstructured.NestedString(o.Object, "spec", "poolRef", "name"); pool == r.key.Name {
			out = append(out, o)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		ti, tj := out[i].GetCreationTimestamp(), out[j].GetCreationTimestamp()
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return out[i].GetName() < out[j].GetName()
	})
	return out, nil
}

// inferenceObjectives are the pool's objectives, each named after its
// object, with its priority (unset: 0).
func (r *reconciler) inferenceObjectives(ctx context.Context) ([]datastore.Objective, error) {
	objs, err := r.ofPool(ctx, ObjectiveGVK)
	if err != nil {
		return nil, err
	}
	out := make([]datastore.Objective, 0, len(objs))
	for _, o := range objs {
		prio, _, _ := unstructured.NestedInt64(o.Object, "spec", "priority")
		out = append(out, datastore.Objective{Name: o.GetName(), Priority: int(prio)})
	}
	return out, nil
}

// modelRewrites collects the rules of the pool's InferenceModelRewrites.
func (r *reconciler) modelRewrites(ctx context.Context) ([]datastore.ModelRewrite, error) {
	objs, err := r.ofPool(ctx, RewriteGVK)
	if err != nil {
		return nil, err
	}
	var out []datastore.ModelRewrite
	for _, o := range objs {
		rules, _, _ := unstructured.NestedSlice(o.Object, "spec", "rules")
		for _, raw := range rules {
			rule, _ := raw.(map[string]any)
			var rw datastore.ModelRewrite
			matches, _, _ := unstructured.NestedSlice(rule, "matches")
			for _, m := range matches {
				if mm, ok := m.(map[string]any); ok {
					if v, _, _ := unstructured.NestedString(mm, "model", "value"); v != "" {
						rw.Models = append(rw.Models, v)
					}
				}
			}
			targets, _, _ := unstructured.NestedSlice(rule, "targets")
			for _, t := range targets {
				tm, _ := t.(map[string]any)
				model, _, _ := unstructured.NestedString(tm, "modelRewrite")
				weight, found, _ := unstructured.NestedInt64(tm, "weight")
				if !found {
					weight = 1
				}
				if model != "" {
					rw.Targets = append(rw.Targets, datastore.RewriteTarget{Model: model, Weight: int(weight)})
				}
			}
			if len(rw.Targets) > 0 {
				out = append(out, rw)
			}
		}
	}
	return out, nil
}

// Specs turns pods into endpoints: each ready pod with an IP, once per
// target port, in a stable order.
func Specs(pods []corev1.Pod, ports []inferencev1.Port, engineLabel string) []datastore.Spec {
	var out []datastore.Spec
	for i := range pods {
		p := &pods[i]
		if !ready(p) {
			continue
		}
		for rank, port := range ports {
			name := p.Name
			if len(ports) > 1 {
				name = p.Name + "-rank-" + strconv.Itoa(rank)
			}
			out = append(out, datastore.Spec{
				Address: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port.Number))),
				Name:    name,
				Labels:  p.Labels,
			}.EngineFromLabel(engineLabel))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}

// ready reports whether a pod should take traffic: running, Ready, an IP,
// and not on its way out.
func ready(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
