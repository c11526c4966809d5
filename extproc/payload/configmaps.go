package payload

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/yaml"

	"github.com/infergate/infergate/inference/policy"
)

// The ConfigMaps that carry adapter → base-model entries, with the label
// and keys the reference payload processor uses, so existing ones work.
const (
	ManagedLabel  = "inference.llm-d.ai/ipp-managed"
	BaseModelKey  = "baseModel"
	AdaptersKey   = "adapters"
	AllNamespaces = "*"
)

// configMapOptions say where to look and whom to tell.
type configMapOptions struct {
	Config *rest.Config
	// Namespace to watch, or AllNamespaces.
	Namespace string
	// OnChange receives the whole current set after every change.
	OnChange func([]policy.BaseModel)
	Logger   logr.Logger
}

// runConfigMaps follows the labelled ConfigMaps until ctx ends.
func runConfigMaps(ctx context.Context, o configMapOptions) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	managed := labels.SelectorFromSet(labels.Set{ManagedLabel: "true"})
	cacheOpts := cache.Options{
		// Only the labelled ConfigMaps are cached, not every one in scope.
		ByObject: map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: managed}},
	}
	if o.Namespace != AllNamespaces {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{o.Namespace: {}}
	}
	mgr, err := ctrl.NewManager(o.Config, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 o.Logger,
		Cache:                  cacheOpts,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	r := &configMapReconciler{client: mgr.GetClient(), onChange: o.OnChange, log: o.Logger}
	skipNameCheck := true
	err = builder.ControllerManagedBy(mgr).
		Named("adapter-configmaps").
		// Every event rebuilds the whole set, so all map to one key.
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{}}
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: &skipNameCheck}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	go func() {
		// With no ConfigMap yet nothing triggers a reconcile; report the
		// empty set once the cache is synced so readiness can follow.
		if mgr.GetCache().WaitForCacheSync(ctx) {
			_, _ = r.Reconcile(ctx, reconcile.Request{})
		}
	}()
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	return nil
}

type configMapReconciler struct {
	client   client.Client
	onChange func([]policy.BaseModel)
	log      logr.Logger
}

func (r *configMapReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var list corev1.ConfigMapList
	if err := r.client.List(ctx, &list, client.MatchingLabels{ManagedLabel: "true"}); err != nil {
		return reconcile.Result{}, fmt.Errorf("list adapter ConfigMaps: %w", err)
	}
	bases, problems := basesFromConfigMaps(list.Items)
	for _, p := range problems {
		r.log.Error(p, "adapter ConfigMap ignored")
	}
	r.onChange(bases)
	return reconcile.Result{}, nil
}

// basesFromConfigMaps reads baseModel and adapters (a YAML list) from each
// ConfigMap; several ConfigMaps may name the same base, and their adapters
// add up. The result is sorted so equal inputs give equal policies.
func basesFromConfigMaps(cms []corev1.ConfigMap) ([]policy.BaseModel, []error) {
	adapters := map[string]map[string]bool{}
	var problems []error
	for _, cm := range cms {
		base := strings.TrimSpace(cm.Data[BaseModelKey])
		if base == "" {
			problems = append(problems, fmt.Errorf("ConfigMap %s/%s: no %q", cm.Namespace, cm.Name, BaseModelKey))
			continue
		}
		var list []string
		if raw := cm.Data[AdaptersKey]; strings.TrimSpace(raw) != "" {
			if err := yaml.Unmarshal([]byte(raw), &list); err != nil {
				problems = append(problems, fmt.Errorf("ConfigMap %s/%s: %q is not a YAML list of names: %w", cm.Namespace, cm.Name, AdaptersKey, err))
				continue
			}
		}
		if adapters[base] == nil {
			adapters[base] = map[string]bool{}
		}
		for _, a := range list {
			if a = strings.TrimSpace(a); a != "" {
				adapters[base][a] = true
			}
		}
	}
	out := make([]policy.BaseModel, 0, len(adapters))
	for base, set := range adapters {
		b := policy.BaseModel{Name: base}
		for a := range set {
			b.Adapters = append(b.Adapters, a)
		}
		sort.Strings(b.Adapters)
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, problems
}

// mergeBases adds the ConfigMaps' bases to the file's: the same base in
// both gets the adapters of both. An adapter under two different bases
// stays in both so that policy.Compile reports the conflict.
func mergeBases(file, fromCluster []policy.BaseModel) []policy.BaseModel {
	out := make([]policy.BaseModel, 0, len(file)+len(fromCluster))
	index := map[string]int{}
	for _, b := range append(append([]policy.BaseModel(nil), file...), fromCluster...) {
		i, ok := index[b.Name]
		if !ok {
			index[b.Name] = len(out)
			out = append(out, policy.BaseModel{Name: b.Name})
			i = len(out) - 1
		}
		for _, a := range b.Adapters {
			dup := false
			for _, have := range out[i].Adapters {
				dup = dup || have == a
			}
			if !dup {
				out[i].Adapters = append(out[i].Adapters, a)
			}
		}
	}
	return out
}
