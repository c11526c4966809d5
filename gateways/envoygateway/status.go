package envoygateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/gateways/internal/xdsbuild"
	"github.com/infergate/infergate/inference/wire"
)

// DefaultControllerName is Envoy Gateway's GatewayClass controller: the
// pool's status entries are written for the Gateways it manages, under its
// name, since they report how those Gateways treat the pool.
const DefaultControllerName = "gateway.envoyproxy.io/gatewayclass-controller"

// statusReconciler writes InferencePool status.parents: one entry per
// Gateway (of Envoy Gateway's controller) an HTTPRoute attaches the pool to,
// with Accepted (the route's own acceptance by that Gateway) and
// ResolvedRefs (the pool's endpointPickerRef resolves to a Service). Entries
// of other controllers are left alone; entries for Gateways no route
// attaches any more are removed.
type statusReconciler struct {
	client     client.Client
	events     events.EventRecorder
	controller string
	log        logr.Logger
	// probe asks a picker replica for grpc.health.v1 (probeHealth).
	probe func(ctx context.Context, addr string, plaintext bool) error
}

// eventSource names the extension in the Events it records.
const eventSource = "infergate-egext"

// conflictRetry is how soon a status update that lost a write race is
// retried.
const conflictRetry = 100 * time.Millisecond

func setUpStatus(mgr ctrl.Manager, controllerName string, log logr.Logger) error {
	r := &statusReconciler{client: mgr.GetClient(), events: mgr.GetEventRecorder(eventSource), controller: controllerName, log: log, probe: probeHealth}
	return ctrl.NewControllerManagedBy(mgr).
		Named("inferencepool-status").
		// controller-runtime keeps controller names process-wide; tests run
		// several extensions in one process.
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true)}).
		For(&inferencev1.InferencePool{}).
		Watches(&gatewayv1.HTTPRoute{}, handler.EnqueueRequestsFromMapFunc(poolsOfRoute)).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.poolsOfService)).
		Complete(r)
}

// poolsOfRoute enqueues the pools a route's rules name.
func poolsOfRoute(_ context.Context, o client.Object) []reconcile.Request {
	route, ok := o.(*gatewayv1.HTTPRoute)
	if !ok {
		return nil
	}
	var out []reconcile.Request
	for _, key := range routePools(route) {
		out = append(out, reconcile.Request{NamespacedName: key})
	}
	return out
}

// poolsOfService enqueues the pools of the Service's namespace whose picker
// it may be.
func (r *statusReconciler) poolsOfService(ctx context.Context, o client.Object) []reconcile.Request {
	var pools inferencev1.InferencePoolList
	if err := r.client.List(ctx, &pools, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, p := range pools.Items {
		if ref := p.Spec.EndpointPickerRef; ref != nil && string(ref.Name) == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
		}
	}
	return out
}

// routePools lists the pools a route's rules name as backends.
func routePools(route *gatewayv1.HTTPRoute) []types.NamespacedName {
	var out []types.NamespacedName
	for _, rule := range route.Spec.Rules {
		for _, b := range rule.BackendRefs {
			if b.Group == nil || string(*b.Group) != inferencev1.GroupVersion.Group || b.Kind == nil || *b.Kind != "InferencePool" {
				continue
			}
			ns := route.Namespace
			if b.Namespace != nil {
				ns = string(*b.Namespace)
			}
			key := types.NamespacedName{Namespace: ns, Name: string(b.Name)}
			if !slices.Contains(out, key) {
				out = append(out, key)
			}
		}
	}
	return out
}

func (r *statusReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pool inferencev1.InferencePool
	if err := r.client.Get(ctx, req.NamespacedName, &pool); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var routes gatewayv1.HTTPRouteList
	if err := r.client.List(ctx, &routes); err != nil {
		return reconcile.Result{}, fmt.Errorf("list HTTPRoutes: %w", err)
	}
	resolved := r.resolvedRefs(ctx, &pool)
	var requeue time.Duration
	if resolved.Status == metav1.ConditionTrue {
		if msg, retry := r.pickerHealth(ctx, &pool); msg != "" {
			resolved.Status, resolved.Reason, resolved.Message = metav1.ConditionFalse, string(inferencev1.InferencePoolReasonInvalidExtensionRef), msg
		} else if retry {
			requeue = healthProbeRetry
		}
	}
	var ours []inferencev1.ParentStatus
	for i := range routes.Items {
		route := &routes.Items[i]
		if !slices.Contains(routePools(route), req.NamespacedName) {
			continue
		}
		for _, ps := range route.Status.Parents {
			if string(ps.ControllerName) != r.controller {
				continue
			}
			ref := parentRef(route.Namespace, ps.ParentRef)
			if slices.ContainsFunc(ours, func(s inferencev1.ParentStatus) bool { return equality.Semantic.DeepEqual(s.ParentRef, ref) }) {
				continue
			}
			accepted := metav1.Condition{Type: string(inferencev1.InferencePoolConditionAccepted), Status: metav1.ConditionTrue,
				Reason: string(inferencev1.InferencePoolReasonAccepted), Message: "referenced by an HTTPRoute accepted by the Gateway"}
			if c := meta.FindStatusCondition(ps.Conditions, string(gatewayv1.RouteConditionAccepted)); c == nil || c.Status != metav1.ConditionTrue {
				accepted.Status, accepted.Reason = metav1.ConditionFalse, string(inferencev1.InferencePoolReasonHTTPRouteNotAccepted)
				accepted.Message = fmt.Sprintf("HTTPRoute %s/%s is not accepted by the Gateway; see its status", route.Namespace, route.Name)
			}
			if pool.Spec.EndpointPickerRef == nil {
				accepted.Status, accepted.Reason = metav1.ConditionFalse, string(inferencev1.InferencePoolReasonEndpointPickerRefMissing)
				accepted.Message = "spec.endpointPickerRef is required: infergate routes every request through the pool's endpoint picker"
			}
			st := inferencev1.ParentStatus{ParentRef: ref, ControllerName: inferencev1.ControllerName(r.controller)}
			for _, c := range []metav1.Condition{accepted, resolved} {
				c.ObservedGeneration = pool.Generation
				meta.SetStatusCondition(&st.Conditions, c)
			}
			ours = append(ours, st)
		}
	}
	next := slices.DeleteFunc(slices.Clone(pool.Status.Parents), func(s inferencev1.ParentStatus) bool {
		return string(s.ControllerName) == r.controller
	})
	var warnings []metav1.Condition
	for _, st := range ours {
		var prevConds []metav1.Condition
		if prev := findParent(pool.Status.Parents, st.ParentRef); prev != nil {
			prevConds = prev.Conditions
		}
		for _, c := range st.Conditions {
			if was := meta.FindStatusCondition(prevConds, c.Type); c.Status == metav1.ConditionFalse &&
				(was == nil || was.Status != c.Status || was.Reason != c.Reason) &&
				!slices.ContainsFunc(warnings, func(w metav1.Condition) bool { return w.Type == c.Type && w.Reason == c.Reason }) {
				warnings = append(warnings, c)
			}
		}
		// Keep condition transition times when nothing changed.
		conds := slices.Clone(prevConds)
		for _, c := range st.Conditions {
			meta.SetStatusCondition(&conds, c)
		}
		st.Conditions = conds
		next = append(next, st)
	}
	if equality.Semantic.DeepEqual(next, pool.Status.Parents) {
		return reconcile.Result{RequeueAfter: requeue}, nil
	}
	pool.Status.Parents = next
	if err := r.client.Status().Update(ctx, &pool); err != nil {
		if apierrors.IsConflict(err) {
			// Someone wrote the pool since the cache read it: try again
			// shortly on the newer copy, without logging an error.
			return reconcile.Result{RequeueAfter: conflictRetry}, nil
		}
		return reconcile.Result{}, fmt.Errorf("update status of %s: %w", req.NamespacedName, err)
	}
	// A problem becomes an Event once, when it appears (kubectl describe
	// shows it beside the status).
	for _, w := range warnings {
		r.events.Eventf(&pool, nil, corev1.EventTypeWarning, w.Reason, "Route", "%s: %s", w.Type, w.Message)
	}
	r.log.V(1).Info("pool status", "pool", req.NamespacedName, "parents", len(ours))
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// healthProbeRetry is how soon a picker that could not be asked (no ready
// replica yet, or none answering) is asked again.
const healthProbeRetry = 30 * time.Second

// pickerHealth asks a ready replica of the pool's picker the check Envoy
// will run on it: grpc.health.v1 on its ext_proc port, unless the pool
// asks for a TCP check. A picker that answers it serves no such service
// would never be healthy in Envoy, and every request of the pool would
// fail (FailClose) or go unpicked (FailOpen), so that is said in the
// status (msg). retry: the picker could not be asked now.
func (r *statusReconciler) pickerHealth(ctx context.Context, pool *inferencev1.InferencePool) (msg string, retry bool) {
	p, err := poolOf(pool)
	if err != nil || p.HealthCheck != xdsbuild.HealthGRPC || r.probe == nil {
		return "", false
	}
	addrs, err := KubeEndpoints{Reader: r.client}.PickerEndpoints(ctx, p)
	if err != nil || len(addrs) == 0 {
		return "", true
	}
	err = r.probe(ctx, addrs[0], p.Plaintext)
	switch status.Code(err) {
	case codes.OK:
		return "", false
	case codes.Unimplemented, codes.NotFound:
		return fmt.Sprintf("the endpoint picker at %s does not serve grpc.health.v1 for %q on its ext_proc port (%v): Envoy checks it there "+
			"and would never find it healthy, so every request of the pool would get 500 (FailClose) or no pick (FailOpen). "+
			"Run the picker with its health service (GAIE's and llm-d's: --health-checking), or set the pool's annotation %s: %s",
			addrs[0], wire.ExtProcHealthService, status.Convert(err).Message(), HealthCheckAnnotation, xdsbuild.HealthTCP), false
	}
	return "", true
}

// probeHealth is one grpc.health.v1 Check of the ext_proc service at addr,
// over TLS that accepts the picker's self-signed certificate unless
// plaintext, as Envoy's check reaches it.
func probeHealth(ctx context.Context, addr string, plaintext bool) error {
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // as Envoy's cluster: the picker's certificate is self-signed
	if plaintext {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: wire.ExtProcHealthService})
	return err
}

// resolvedRefs checks the pool's endpointPickerRef: a valid reference to a
// Service that exists in the pool's namespace.
func (r *statusReconciler) resolvedRefs(ctx context.Context, pool *inferencev1.InferencePool) metav1.Condition {
	ok := metav1.Condition{Type: string(inferencev1.InferencePoolConditionResolvedRefs), Status: metav1.ConditionTrue,
		Reason: string(inferencev1.InferencePoolReasonResolvedRefs), Message: "the endpoint picker Service exists and exposes the port"}
	bad := func(format string, args ...any) metav1.Condition {
		return metav1.Condition{Type: ok.Type, Status: metav1.ConditionFalse,
			Reason: string(inferencev1.InferencePoolReasonInvalidExtensionRef), Message: fmt.Sprintf(format, args...)}
	}
	if _, err := poolOf(pool); err != nil {
		return bad("%v", err)
	}
	var svc corev1.Service
	name := string(pool.Spec.EndpointPickerRef.Name)
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return bad("endpoint picker Service %s/%s not found", pool.Namespace, name)
		}
		return bad("endpoint picker Service %s/%s: %v", pool.Namespace, name, err)
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return bad("endpoint picker Service %s/%s is an ExternalName Service", pool.Namespace, name)
	}
	port := int32(DefaultEPPPort)
	if p := pool.Spec.EndpointPickerRef.Port; p != nil {
		port = int32(p.Number)
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Port == port }) {
		return bad("endpoint picker Service %s/%s has no port %d", pool.Namespace, name, port)
	}
	return ok
}

func parentRef(routeNS string, p gatewayv1.ParentReference) inferencev1.ParentReference {
	group := inferencev1.Group(gatewayv1.GroupName)
	if p.Group != nil {
		group = inferencev1.Group(*p.Group)
	}
	kind := inferencev1.Kind("Gateway")
	if p.Kind != nil {
		kind = inferencev1.Kind(*p.Kind)
	}
	ns := routeNS
	if p.Namespace != nil {
		ns = string(*p.Namespace)
	}
	return inferencev1.ParentReference{Group: &group, Kind: kind, Name: inferencev1.ObjectName(p.Name), Namespace: inferencev1.Namespace(ns)}
}

func findParent(ps []inferencev1.ParentStatus, ref inferencev1.ParentReference) *inferencev1.ParentStatus {
	for i := range ps {
		if equality.Semantic.DeepEqual(ps[i].ParentRef, ref) {
			return &ps[i]
		}
	}
	return nil
}
