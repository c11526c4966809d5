package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/controlplane"
	"github.com/infergate/infergate/test/gatewaytest"
)

// The pool both pickers follow.
const (
	namespace = "default"
	poolName  = "sims"
	simPort   = 8000
)

// rig is what both sides of every comparison share: the API server with
// the pool and its Pods, the model servers behind them, a kubeconfig for
// the processors, and a folder for their files and logs.
type rig struct {
	env        *controlplane.Env
	kubeconfig string
	dir        string
	o          options
	stopSims   context.CancelFunc
}

func startRig(ctx context.Context, o options) (_ *rig, err error) {
	root, err := controlplane.ModuleRoot(ctx)
	if err != nil {
		return nil, err
	}
	// The reference picker watches the InferenceObjective and
	// InferenceModelRewrite kinds of its own API group, infergate's picker
	// those of llm-d.ai: both find theirs installed, empty.
	env, err := controlplane.Start(ctx, filepath.Join(o.reference, "crd"), filepath.Join(root, "config", "crd"))
	if err != nil {
		return nil, err
	}
	r := &rig{env: env, o: o, stopSims: func() {}}
	defer func() {
		if err != nil {
			r.stop()
		}
	}()
	if r.dir, err = os.MkdirTemp("", "infergate-reference"); err != nil {
		return nil, err
	}
	admin, err := env.AddUser("bench", "system:masters")
	if err != nil {
		return nil, err
	}
	r.kubeconfig = filepath.Join(r.dir, "kubeconfig")
	if err := gatewaytest.WriteKubeconfig(r.kubeconfig, admin); err != nil {
		return nil, err
	}
	scheme, err := controlplane.Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	simCtx, stopSims := context.WithCancel(context.Background())
	r.stopSims = stopSims
	labels := map[string]string{"app": poolName}
	for i := range o.endpoints {
		// Every address of 127.0.0.0/8 is the namespace's own loopback;
		// the API server takes loopback Pod IPs.
		ip := fmt.Sprintf("127.0.0.%d", 10+i)
		s, err := sim.New(sim.Config{Name: fmt.Sprintf("sim-%d", i)})
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(simPort)))
		if err != nil {
			return nil, err
		}
		go func() { _ = s.Serve(simCtx, ln) }()
		if _, err := controlplane.CreatePod(ctx, c, namespace, fmt.Sprintf("sim-%d", i), labels, ip, true); err != nil {
			return nil, err
		}
	}
	pool := &inferencev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: poolName},
		Spec: inferencev1.InferencePoolSpec{
			Selector:          inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": poolName}},
			TargetPorts:       []inferencev1.Port{{Number: simPort}},
			EndpointPickerRef: &inferencev1.EndpointPickerRef{Name: "epp", Port: &inferencev1.Port{Number: 9002}},
		},
	}
	if err := c.Create(ctx, pool); err != nil {
		return nil, fmt.Errorf("create the InferencePool: %w", err)
	}
	return r, nil
}

func (r *rig) stop() {
	r.stopSims()
	_ = r.env.Stop()
	if r.dir != "" {
		_ = os.RemoveAll(r.dir)
	}
}
