package livecluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/infergate/infergate/test/gatewaytest"
)

// proxy is kube-proxy's stand-in (see the package comment), and the cloud
// load balancer's.
type proxy struct {
	c *gatewaytest.Cluster

	mu        sync.Mutex
	listeners map[string]*forward // by ip:port
	nextLB    int
}

// forward is one Service port on one address.
type forward struct {
	ln      net.Listener
	targets atomic.Pointer[[]string] // ready endpoints, ip:port
	next    atomic.Uint64
}

func newProxy(c *gatewaytest.Cluster) *proxy {
	return &proxy{c: c, listeners: map[string]*forward{}, nextLB: 1}
}

func (p *proxy) run(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		p.sync(ctx)
		select {
		case <-ctx.Done():
			p.mu.Lock()
			defer p.mu.Unlock()
			for _, f := range p.listeners {
				_ = f.ln.Close()
			}
			return
		case <-tick.C:
		}
	}
}

func (p *proxy) sync(ctx context.Context) {
	var svcs corev1.ServiceList
	var slices discoveryv1.EndpointSliceList
	if p.c.Client.List(ctx, &svcs) != nil || p.c.Client.List(ctx, &slices) != nil {
		return
	}
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for i := range slices.Items {
		s := &slices.Items[i]
		key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		bySvc[key] = append(bySvc[key], s)
	}
	want := map[string][]string{}
	for i := range svcs.Items {
		svc := &svcs.Items[i]
		ips := []string{}
		if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
			ips = append(ips, ip)
		}
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			lb, err := p.loadBalancerIP(ctx, svc)
			if err != nil {
				continue
			}
			ips = append(ips, lb)
		}
		for _, port := range svc.Spec.Ports {
			if port.Protocol != "" && port.Protocol != corev1.ProtocolTCP {
				continue
			}
			targets := readyEndpoints(bySvc[svc.Namespace+"/"+svc.Name], port.Name)
			for _, ip := range ips {
				want[net.JoinHostPort(ip, strconv.Itoa(int(port.Port)))] = targets
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, targets := range want {
		f := p.listeners[addr]
		if f == nil {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				continue
			}
			f = &forward{ln: ln}
			p.listeners[addr] = f
			go f.serve()
		}
		f.targets.Store(&targets)
	}
	for addr, f := range p.listeners {
		if _, ok := want[addr]; !ok {
			_ = f.ln.Close()
			delete(p.listeners, addr)
		}
	}
}

// loadBalancerIP is the Service's ingress address, given one from
// LoadBalancerCIDR the first time, as a cloud's load balancer controller
// would.
func (p *proxy) loadBalancerIP(ctx context.Context, svc *corev1.Service) (string, error) {
	if in := svc.Status.LoadBalancer.Ingress; len(in) > 0 && in[0].IP != "" {
		return in[0].IP, nil
	}
	p.mu.Lock()
	ip := ip4(LoadBalancerCIDR, p.nextLB)
	p.nextLB++
	p.mu.Unlock()
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
	if err := p.c.Client.Status().Update(ctx, svc); err != nil {
		return "", err
	}
	return ip, nil
}

// readyEndpoints are the ready addresses of the slices, at the slice port
// named portName.
func readyEndpoints(slices []*discoveryv1.EndpointSlice, portName string) []string {
	var out []string
	for _, s := range slices {
		var port int32 = -1
		for _, sp := range s.Ports {
			if sp.Port != nil && (sp.Name == nil && portName == "" || sp.Name != nil && *sp.Name == portName) {
				port = *sp.Port
			}
		}
		if port < 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				out = append(out, net.JoinHostPort(a, strconv.Itoa(int(port))))
			}
		}
	}
	return out
}

// serve accepts until the listener closes; each connection goes to the
// next ready endpoint, or is reset when there is none.
func (f *forward) serve() {
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			return
		}
		go f.relay(conn.(*net.TCPConn))
	}
}

func (f *forward) relay(in *net.TCPConn) {
	targets := *f.targets.Load()
	if len(targets) == 0 {
		_ = in.SetLinger(0) // a reset, as a Service without endpoints rejects
		_ = in.Close()
		return
	}
	to := targets[int(f.next.Add(1)-1)%len(targets)]
	out, err := net.DialTimeout("tcp", to, 2*time.Second)
	if err != nil {
		_ = in.SetLinger(0)
		_ = in.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
	_ = in.Close()
	_ = out.Close()
}

// lookup resolves name.namespace.svc[.cluster.local] to the Service's
// cluster IP.
func (p *proxy) lookup(ctx context.Context, host string) (string, error) {
	name, rest, _ := strings.Cut(strings.TrimSuffix(strings.TrimSuffix(host, "."), ".cluster.local"), ".")
	ns, svcSuffix, _ := strings.Cut(rest, ".")
	if name == "" || ns == "" || svcSuffix != "svc" {
		return "", fmt.Errorf("%q is not a Service name (name.namespace.svc.cluster.local)", host)
	}
	var svc corev1.Service
	if err := p.c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
		return "", fmt.Errorf("no such Service: %w", err)
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return "", errors.New("the Service has no cluster IP")
	}
	return svc.Spec.ClusterIP, nil
}
