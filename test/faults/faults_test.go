package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/gateways/envoy"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/loopback"
)

// Windows the rendered configuration gives (gateways/internal/xdsbuild):
// a processor's host is out after 2 failed checks, a check every 2 s that
// times out after 1 s, so a silent host is out within 2×2 s + 1 s; the
// name is resolved again every 5 s; a connection to a silent peer is
// closed by the kernel once what was sent on it has waited 10 s for an
// acknowledgement (TCP_USER_TIMEOUT), or after 5 s + 3×2 s of unanswered
// keepalive probes when idle. Recovery must come within these windows,
// never minutes.
const (
	outWindow   = 2*2*time.Second + time.Second
	dnsRefresh  = 5 * time.Second
	userTimeout = 10 * time.Second
	// recoveryBound is the longest a scenario may take from the fault to
	// the last request answered other than normally: a host taken out,
	// and a request caught in flight on a connection the kernel ends.
	recoveryBound = outWindow + userTimeout + 2*time.Second
	// hangBound is the longest any request may take.
	hangBound = userTimeout + 5*time.Second
)

const (
	pickerName, payloadName = "picker.faults", "payload.faults"
	pickerPort, payloadPort = 9002, 9004
	peersPort               = 7946
)

// service is a processor's Deployment: replicas, and the names a headless
// Service resolves to (the ready replicas).
type service struct {
	name, command string
	port          int
	args          []string
	// peersPort, when set, runs the replicas active-active: each binds it
	// on its address and joins every other address of the service, as
	// the chart's peers Service lists every pod.
	peersPort int
	all       []string // every address the service's replicas may have

	mu    sync.Mutex
	free  []string   // addresses not yet given to a replica
	ready []*replica // resolved by name
}

type replica struct {
	ip string
	p  *childproc.Processor
}

// cluster is one scenario's world: sims, the two processors' replicas,
// and two gateways, FailOpen and FailClose.
type cluster struct {
	t        *testing.T
	bin      string
	iptables string
	logDir   string
	svcs     map[string]*service
	gateways []*gateway
}

type gateway struct {
	name string // FailOpen or FailClose
	base string
}

// iptablesBinary is where hack/iptables.sh put iptables (make test exports
// INFERGATE_IPTABLES), else the one on PATH.
func iptablesBinary(t *testing.T) string {
	if p := os.Getenv("INFERGATE_IPTABLES"); p != "" {
		return p
	}
	p, err := exec.LookPath("iptables")
	if err != nil {
		t.Fatal("iptables is needed to drop a host's packets: run hack/iptables.sh (make test does) or install Debian's iptables")
	}
	return p
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, bin: childproc.Command(t, "infergate"), iptables: iptablesBinary(t), logDir: t.TempDir()}
	var sims []string
	var pool strings.Builder
	pool.WriteString("name: faults\nendpoints:\n")
	for i := range 2 {
		name := fmt.Sprintf("sim-%d", i)
		s, err := sim.New(sim.Config{Name: name, TimeScale: 50})
		if err != nil {
			t.Fatal(err)
		}
		addr := loopback.Serve(t, s.Serve)
		sims = append(sims, addr)
		fmt.Fprintf(&pool, "- address: %s\n  name: %s\n", addr, name)
	}
	poolFile := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(poolFile, []byte(pool.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// As the charts stop a processor: serving on for 5 s with its health
	// NOT_SERVING, then draining.
	stop := []string{"--shutdown-delay", "5s"}
	c.svcs = map[string]*service{
		pickerName: {name: pickerName, command: "epp", port: pickerPort, free: slices.Clone(pickerIPs), all: pickerIPs,
			peersPort: peersPort, args: append([]string{"--pool-file", poolFile}, stop...)},
		payloadName: {name: payloadName, command: "payload", port: payloadPort, free: slices.Clone(payloadIPs), args: stop},
	}
	for _, s := range c.svcs {
		for range 2 {
			s.publish(c.start(s))
		}
	}
	t.Cleanup(func() { _ = exec.Command(c.iptables, "-F", "INPUT").Run() })
	for _, failOpen := range []bool{true, false} {
		b, err := envoy.Bootstrap(envoy.Config{
			Listen:  "127.0.0.1:8080", // bound on a free port instead (FreePorts)
			Payload: &envoy.Processor{Address: fmt.Sprintf("%s:%d", payloadName, payloadPort), FailOpen: failOpen},
			Pools: []envoy.Pool{{Name: "llama", Endpoints: sims,
				Picker: envoy.Processor{Address: fmt.Sprintf("%s:%d", pickerName, pickerPort), FailOpen: failOpen}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		n := gatewaytest.StandIn(t, envoysim.NodeConfig{Bootstrap: b, FreePorts: true, Lookup: c.lookup, DebugMetadata: true})
		name := map[bool]string{true: "FailOpen", false: "FailClose"}[failOpen]
		c.gateways = append(c.gateways, &gateway{name: name, base: gatewaytest.ListenerURL(t, n, envoy.ListenerName)})
	}
	// Every gateway routes through both processors before the fault.
	for _, g := range c.gateways {
		deadline := time.Now().Add(30 * time.Second)
		for {
			o := post(context.Background(), g.base)
			if o.normal() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s gateway never routed a request: %+v", g.name, o)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return c
}

// lookup is the cluster DNS: a headless Service's name resolves to its
// ready replicas.
func (c *cluster) lookup(_ context.Context, host string) ([]string, error) {
	s := c.svcs[host]
	if s == nil {
		return nil, fmt.Errorf("%s: no such service", host)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ready) == 0 {
		return nil, fmt.Errorf("%s: no ready endpoints", host)
	}
	var ips []string
	for _, r := range s.ready {
		ips = append(ips, r.ip)
	}
	return ips, nil
}

// start runs a new replica of s at its next address and waits until it is
// ready.
func (c *cluster) start(s *service) *replica {
	c.t.Helper()
	s.mu.Lock()
	if len(s.free) == 0 {
		s.mu.Unlock()
		c.t.Fatalf("%s: no address left for a replica", s.name)
	}
	ip := s.free[0]
	s.free = s.free[1:]
	s.mu.Unlock()
	args := slices.Clone(s.args)
	if s.peersPort != 0 {
		var others []string
		for _, a := range s.all {
			if a != ip {
				others = append(others, net.JoinHostPort(a, fmt.Sprint(s.peersPort)))
			}
		}
		args = append(args, "--peers-bind-address", net.JoinHostPort(ip, fmt.Sprint(s.peersPort)), "--peers", strings.Join(others, ","))
	}
	p, err := childproc.StartProcessor(context.Background(), childproc.ProcessorConfig{
		Binary: c.bin, Command: s.command, Args: args, TLS: true, GRPCHost: ip, GRPCPort: s.port,
		Log: filepath.Join(c.logDir, s.command+"-"+ip+".log"),
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { p.Stop(time.Second) })
	return &replica{ip: ip, p: p}
}

func (s *service) publish(r *replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready = append(s.ready, r)
}

func (s *service) unpublish(r *replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready = slices.DeleteFunc(s.ready, func(x *replica) bool { return x == r })
}

func (s *service) replicas() []*replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ready)
}

// The faults, as they happen to a pod.

// crash kills a replica (connections refused and reset); the endpoints
// controller takes it out of the Service a second later, and its
// replacement joins once ready.
func (c *cluster) crash(s *service) {
	r := s.replicas()[0]
	_ = r.p.Cmd.Process.Kill()
	time.Sleep(time.Second)
	s.unpublish(r)
	s.publish(c.start(s))
}

// silentLoss drops every packet to and from a replica, as when its node is
// lost: no RST, no FIN. The Service keeps it (the node controller marks
// its pods not ready only after its grace period, 40 s by default), so the
// gateway's health checks must take it out.
func (c *cluster) silentLoss(s *service) {
	r := s.replicas()[0]
	for _, dir := range []string{"-d", "-s"} {
		if out, err := exec.Command(c.iptables, "-I", "INPUT", dir, r.ip, "-j", "DROP").CombinedOutput(); err != nil {
			c.t.Fatalf("iptables: %v: %s", err, out)
		}
	}
}

// rollingRestart replaces each replica in turn as a Deployment's rollout
// does (maxSurge 1, maxUnavailable 0): the new pod joins the Service once
// ready, then the old one leaves it and is stopped, serving on for its
// shutdown delay with its health NOT_SERVING before it drains.
func (c *cluster) rollingRestart(s *service) {
	for _, old := range s.replicas() {
		s.publish(c.start(s))
		s.unpublish(old)
		if old.p.Stop(20 * time.Second) {
			c.t.Errorf("%s at %s had to be killed", s.command, old.ip)
		}
	}
}

// outcome is one request's fate.
type outcome struct {
	start, end time.Time
	status     int
	picked     bool // the picker chose the endpoint
	err        error
}

// normal is a request answered as with every processor up.
func (o outcome) normal() bool { return o.err == nil && o.status == http.StatusOK && o.picked }

func post(ctx context.Context, base string) outcome {
	o := outcome{start: time.Now()}
	defer func() { o.end = time.Now() }()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions",
		strings.NewReader(`{"model":"`+sim.DefaultModel+`","prompt":"the fault suite asks","max_tokens":4}`))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		o.err, o.end = err, time.Now()
		return o
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	o.end = time.Now()
	o.status, o.err = resp.StatusCode, err
	o.picked = strings.Contains(resp.Header.Get(envoysim.DebugMetadataHeader), "x-gateway-destination-endpoint")
	return o
}

// load keeps clients requests in flight at a gateway until stopped.
type load struct {
	mu   sync.Mutex
	out  []outcome
	stop context.CancelFunc
	wg   sync.WaitGroup
}

func startLoad(base string, clients int) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{stop: cancel}
	for range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				o := post(context.WithoutCancel(ctx), base)
				l.mu.Lock()
				l.out = append(l.out, o)
				l.mu.Unlock()
				// Paced, so that a busy machine runs the suite as an idle one.
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *load) finish() []outcome {
	l.stop()
	l.wg.Wait()
	return l.out
}

// report is a scenario's figures at one gateway.
type report struct {
	sent, picked, unpicked int
	failed                 map[string]int // by status, or the client's error
	recovery, longest      time.Duration
}

func summarize(out []outcome, faultAt time.Time) report {
	r := report{sent: len(out), failed: map[string]int{}}
	for _, o := range out {
		r.longest = max(r.longest, o.end.Sub(o.start))
		switch {
		case o.err != nil:
			r.failed[clientError(o.err)]++
		case o.status != http.StatusOK:
			r.failed[fmt.Sprint(o.status)]++
		case o.picked:
			r.picked++
		default:
			r.unpicked++
		}
		if !o.normal() && o.end.After(faultAt) {
			r.recovery = max(r.recovery, o.end.Sub(faultAt))
		}
	}
	return r
}

func clientError(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "hang"
	case errors.Is(err, io.ErrUnexpectedEOF), strings.Contains(err.Error(), "reset"), strings.Contains(err.Error(), "EOF"):
		return "reset"
	}
	return "error"
}

func (r report) failures() int {
	n := 0
	for _, v := range r.failed {
		n += v
	}
	return n
}

func (r report) String() string {
	var keys []string
	for k := range r.failed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var f []string
	for _, k := range keys {
		f = append(f, fmt.Sprintf("%s×%d", k, r.failed[k]))
	}
	failed := strings.Join(f, " ")
	if failed == "" {
		failed = "none"
	}
	return fmt.Sprintf("sent %4d  picked %4d  unpicked %4d  failed %-16s  recovery %5.1fs  longest %5.1fs",
		r.sent, r.picked, r.unpicked, failed, r.recovery.Seconds(), r.longest.Seconds())
}

// scenario runs fault on a processor under load at both gateways and
// checks what they answered.
func scenario(t *testing.T, svc string, fault func(*cluster, *service), check func(t *testing.T, gw string, r report)) {
	c := newCluster(t)
	s := c.svcs[svc]
	loads := make([]*load, len(c.gateways))
	for i, g := range c.gateways {
		loads[i] = startLoad(g.base, 3)
	}
	time.Sleep(2 * time.Second)
	faultAt := time.Now()
	fault(c, s)
	// Load goes on past every window, so recovery is seen, not assumed.
	time.Sleep(recoveryBound + dnsRefresh)
	for i, g := range c.gateways {
		r := summarize(loads[i].finish(), faultAt)
		fmt.Printf("faults: %-32s %-9s %s\n", t.Name(), g.name, r)
		t.Logf("%s: %s", g.name, r)
		check(t, g.name, r)
	}
}

// bounded is the check of a crash or a silent loss: recovery within the
// windows, no request hangs, and picking resumes.
func bounded(t *testing.T, gw string, r report) {
	if r.recovery > recoveryBound {
		t.Errorf("%s: recovered after %v, want within %v", gw, r.recovery, recoveryBound)
	}
	if r.longest > hangBound {
		t.Errorf("%s: a request took %v, want none over %v", gw, r.longest, hangBound)
	}
	if r.failed["hang"] > 0 {
		t.Errorf("%s: %d requests hung", gw, r.failed["hang"])
	}
	if r.picked == 0 {
		t.Errorf("%s: nothing picked", gw)
	}
}

// noFailure is the check of a rolling restart: every request answered
// normally.
func noFailure(t *testing.T, gw string, r report) {
	if r.failures() > 0 || r.unpicked > 0 {
		t.Errorf("%s: a rolling restart of 2 replicas failed %d requests and left %d unpicked, want none", gw, r.failures(), r.unpicked)
	}
}

func TestPickerCrash(t *testing.T) {
	scenario(t, pickerName, (*cluster).crash, bounded)
}

func TestPickerSilentLoss(t *testing.T) {
	scenario(t, pickerName, (*cluster).silentLoss, bounded)
}

func TestPickerRollingRestart(t *testing.T) {
	scenario(t, pickerName, (*cluster).rollingRestart, noFailure)
}

func TestPayloadCrash(t *testing.T) {
	scenario(t, payloadName, (*cluster).crash, bounded)
}

func TestPayloadSilentLoss(t *testing.T) {
	scenario(t, payloadName, (*cluster).silentLoss, bounded)
}

func TestPayloadRollingRestart(t *testing.T) {
	scenario(t, payloadName, (*cluster).rollingRestart, noFailure)
}
