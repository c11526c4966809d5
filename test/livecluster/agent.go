package livecluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/gatewaytest"
)

// agent is the kubelet's stand-in (see the package comment).
type agent struct {
	c      *gatewaytest.Cluster
	cfg    Config
	logDir string

	mu     sync.Mutex
	pods   map[types.UID]*runningPod
	nextIP int
	logs   []string
}

// runningPod is a Pod the agent runs.
type runningPod struct {
	pod   *corev1.Pod // as last reported
	ip    string
	procs []*exec.Cmd
	ready bool
	exits chan struct{} // closed when every process has ended
}

func newAgent(c *gatewaytest.Cluster, cfg Config, logDir string) *agent {
	return &agent{c: c, cfg: cfg, logDir: logDir, pods: map[types.UID]*runningPod{}, nextIP: 2}
}

// run syncs the node's Pods every 200 ms until ctx ends, then stops every
// process.
func (a *agent) run(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		a.sync(ctx)
		select {
		case <-ctx.Done():
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, rp := range a.pods {
				stop(rp)
			}
			return
		case <-tick.C:
		}
	}
}

func (a *agent) sync(ctx context.Context) {
	var list corev1.PodList
	if err := a.c.Client.List(ctx, &list, client.MatchingFields{"spec.nodeName": NodeName}); err != nil {
		return // the API server is going away, or a blip: next tick
	}
	seen := map[types.UID]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		seen[p.UID] = true
		a.mu.Lock()
		rp := a.pods[p.UID]
		a.mu.Unlock()
		switch {
		case p.DeletionTimestamp != nil:
			a.terminate(ctx, p, rp)
		case rp == nil && a.cfg.Hold != nil && a.cfg.Hold(ctx, a.c.Client, p):
			// Pending until the next sync asks again.
		case rp == nil:
			a.start(ctx, p)
		default:
			a.report(ctx, p, rp)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid, rp := range a.pods {
		if !seen[uid] { // deleted outright (grace period 0)
			stop(rp)
			delete(a.pods, uid)
		}
	}
}

// start gives the Pod its IP, starts its containers and reports it
// Running (not yet Ready).
func (a *agent) start(ctx context.Context, p *corev1.Pod) {
	a.mu.Lock()
	ip := ip4(PodCIDR, a.nextIP)
	a.nextIP++
	rp := &runningPod{pod: p, ip: ip, exits: make(chan struct{})}
	a.pods[p.UID] = rp
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, ctr := range p.Spec.Containers {
		bin, ok := a.cfg.Images[ctr.Image]
		if !ok {
			continue
		}
		cmd, logPath, err := a.command(p, ip, ctr, bin)
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			a.event(p, fmt.Sprintf("container %s: %v", ctr.Name, err))
			continue
		}
		a.mu.Lock()
		rp.procs = append(rp.procs, cmd)
		a.logs = append(a.logs, logPath)
		a.mu.Unlock()
		wg.Go(func() { _ = cmd.Wait() })
	}
	go func() { wg.Wait(); close(rp.exits) }()
	a.report(ctx, p, rp)
}

// command builds a container's process: its args with $(VAR) expanded,
// its environment with downward-API fields resolved, output to a log.
func (a *agent) command(p *corev1.Pod, ip string, ctr corev1.Container, bin string) (*exec.Cmd, string, error) {
	env := map[string]string{}
	var list []string
	for _, e := range ctr.Env {
		v := e.Value
		if e.ValueFrom != nil {
			f := e.ValueFrom.FieldRef
			if f == nil {
				return nil, "", fmt.Errorf("env %s: only fieldRef sources are supported", e.Name)
			}
			switch f.FieldPath {
			case "metadata.name":
				v = p.Name
			case "metadata.namespace":
				v = p.Namespace
			case "status.podIP":
				v = ip
			case "status.hostIP":
				v = NodeIP
			case "spec.nodeName":
				v = NodeName
			case "spec.serviceAccountName":
				v = p.Spec.ServiceAccountName
			default:
				return nil, "", fmt.Errorf("env %s: field %s is not supported", e.Name, f.FieldPath)
			}
		} else {
			v = expand(v, env)
		}
		env[e.Name] = v
		list = append(list, e.Name+"="+v)
	}
	args := make([]string, len(ctr.Args))
	for i, s := range ctr.Args {
		args[i] = expand(s, env)
	}
	logPath := filepath.Join(a.logDir, fmt.Sprintf("%s_%s_%s.log", p.Namespace, p.Name, ctr.Name))
	f, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(append(os.Environ(), a.cfg.Env...), "HOSTNAME="+p.Name), list...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd, logPath, nil
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expand replaces $(VAR) with the variable's value as the kubelet does:
// $$ is a literal $, and an unknown reference stays as written.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// report writes the Pod's status: Running with its IP; Ready once every
// declared TCP port of a container with a process accepts connections and
// no process has ended.
func (a *agent) report(ctx context.Context, p *corev1.Pod, rp *runningPod) {
	ended := false
	select {
	case <-rp.exits:
		ended = len(rp.procs) > 0
	default:
	}
	ready := !ended && (rp.ready || a.portsOpen(p, rp.ip))
	if ready == rp.ready && p.Status.PodIP == rp.ip {
		return
	}
	now := metav1.Now()
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: now}
	}
	st := corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: rp.ip, PodIPs: []corev1.PodIP{{IP: rp.ip}}, HostIP: NodeIP,
		HostIPs: []corev1.HostIP{{IP: NodeIP}}, StartTime: &now, QOSClass: p.Status.QOSClass,
		Conditions: []corev1.PodCondition{cond(corev1.PodScheduled, true), cond(corev1.PodInitialized, true),
			cond(corev1.ContainersReady, ready), cond(corev1.PodReady, ready)},
	}
	if ended {
		st.Phase = corev1.PodFailed
	}
	for _, ctr := range p.Spec.Containers {
		cs := corev1.ContainerStatus{Name: ctr.Name, Image: ctr.Image, ImageID: ctr.Image, Ready: ready, Started: ptr(true),
			ContainerID: "infergate://" + string(p.UID) + "/" + ctr.Name}
		if ended {
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: now}
		} else {
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	fresh := p.DeepCopy()
	fresh.Status = st
	if err := a.c.Client.Status().Update(ctx, fresh); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			a.event(p, "status: "+err.Error())
		}
		return // the next sync tries again with the Pod as it is then
	}
	a.mu.Lock()
	rp.ready, rp.pod = ready, fresh
	a.mu.Unlock()
}

// portsOpen tells whether every declared TCP port of the Pod's containers
// that have a process accepts a connection at ip.
func (a *agent) portsOpen(p *corev1.Pod, ip string) bool {
	for _, ctr := range p.Spec.Containers {
		if _, ok := a.cfg.Images[ctr.Image]; !ok {
			continue
		}
		for _, port := range ctr.Ports {
			if port.Protocol != "" && port.Protocol != corev1.ProtocolTCP {
				continue
			}
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(int(port.ContainerPort))), 100*time.Millisecond)
			if err != nil {
				return false
			}
			_ = conn.Close()
		}
	}
	return true
}

// terminate stops a deleted Pod's processes (SIGTERM, SIGKILL after 5 s)
// and then removes the Pod, as the kubelet does at the end of the grace
// period.
func (a *agent) terminate(ctx context.Context, p *corev1.Pod, rp *runningPod) {
	if rp != nil {
		stop(rp)
	}
	err := a.c.Client.Delete(ctx, p, client.GracePeriodSeconds(0), client.Preconditions{UID: &p.UID})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return
	}
	a.mu.Lock()
	delete(a.pods, p.UID)
	a.mu.Unlock()
}

func stop(rp *runningPod) {
	for _, cmd := range rp.procs {
		if cmd.Process != nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	select {
	case <-rp.exits:
	case <-time.After(5 * time.Second):
		for _, cmd := range rp.procs {
			_ = cmd.Process.Kill()
		}
		<-rp.exits
	}
}

// event notes a Pod's container that could not start, in its log list.
func (a *agent) event(p *corev1.Pod, msg string) {
	path := filepath.Join(a.logDir, fmt.Sprintf("%s_%s.event", p.Namespace, p.Name))
	_ = os.WriteFile(path, []byte(msg+"\n"), 0o600)
	a.mu.Lock()
	if !slices.Contains(a.logs, path) {
		a.logs = append(a.logs, path)
	}
	a.mu.Unlock()
}

// tails are the last lines of every process's log, for a failed test.
func (a *agent) tails() string {
	a.mu.Lock()
	logs := append([]string(nil), a.logs...)
	a.mu.Unlock()
	sort.Strings(logs)
	var b strings.Builder
	for _, l := range logs {
		fmt.Fprintf(&b, "--- %s (last lines)\n%s\n", filepath.Base(l), childproc.Tail(l, 15))
	}
	return b.String()
}

func ptr[T any](v T) *T { return &v }
