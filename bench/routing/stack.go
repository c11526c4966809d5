package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// The configurations compared, in table order.
const (
	cfgRoundRobin = "round-robin"
	cfgRandom     = "random"
	cfgLoadOnly   = "load-only"
	cfgDefault    = "infergate-default"
	cfgOracle     = "oracle"
	// cfgOracleCapacity is the oracle of a pool whose sims differ: each
	// sim gets prefixes in proportion to its KV cache (capacitySplit).
	// Workload h runs it always, as the figure its rows are measured
	// against; on pools of equal sims it is the oracle again.
	cfgOracleCapacity = "oracle-capacity"
)

// allConfigs are the configurations --configs accepts, in table order;
// defaultConfigs those it runs unless told.
var (
	allConfigs     = []string{cfgRoundRobin, cfgRandom, cfgLoadOnly, cfgDefault, cfgOracle, cfgOracleCapacity}
	defaultConfigs = allConfigs[:5]
)

// oracleConfig is the oracles' picker: the client makes the hand split
// and names the sim in the test-epp-endpoint-selection header; the picker
// only keeps it. The split so pays the same proxy and ext_proc path as
// every picker row, and an oracle differs from them in the routing alone.
const oracleConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: max-score-picker
`

// pickerConfigs are the EndpointPickerConfig files of the picker rows;
// infergate-default runs the picker without one.
var pickerConfigs = map[string]string{
	cfgRandom: `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
`,
	cfgLoadOnly: `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: max-score-picker
`,
	cfgOracle:         oracleConfig,
	cfgOracleCapacity: oracleConfig,
}

// usesPicker reports whether the configuration runs the endpoint picker.
func usesPicker(cfg string) bool { return cfg != cfgRoundRobin }

// proc is one child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// procs are the children of one run; stop interrupts and reaps them all.
type procs struct {
	dir  string
	mu   sync.Mutex
	list []*proc
}

// start runs binary with args, stderr (and stdout unless out is set) going
// to a log file; out receives stdout lines when set.
func (p *procs) start(name, binary string, out io.Writer, args ...string) (*proc, error) {
	return p.startEnv(name, binary, nil, out, args...)
}

// startEnv is start with env added to the driver's environment.
func (p *procs) startEnv(name, binary string, env []string, out io.Writer, args ...string) (*proc, error) {
	logPath := filepath.Join(p.dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stderr = logf
	cmd.Stdout = logf
	if out != nil {
		cmd.Stdout = out
	}
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s %s: %w", binary, args[0], err)
	}
	c := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(c.done) }()
	p.mu.Lock()
	p.list = append(p.list, c)
	p.mu.Unlock()
	return c, nil
}

// stop interrupts every child (last started first), waits up to 5s for each
// and kills what is left.
func (p *procs) stop() {
	p.mu.Lock()
	list := slices.Clone(p.list)
	p.list = nil
	p.mu.Unlock()
	for _, c := range slices.Backward(list) {
		_ = c.cmd.Process.Signal(os.Interrupt)
	}
	deadline := time.After(5 * time.Second)
	for _, c := range list {
		select {
		case <-c.done:
		case <-deadline:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
}

// exited reports whether the child has ended.
func (c *proc) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// cpu is the user+system CPU time the child has used so far.
func (c *proc) cpu() time.Duration {
	d, _ := childproc.CPUTime(c.cmd.Process.Pid)
	return d
}

// simInfo is one running simulator.
type simInfo struct {
	name, addr string
	proc       *proc
	// model is its latency model: the sims' defaults, or a heterogeneous
	// pool's server's (server.model).
	model simModel
}

// replica is one picker process and the addresses it serves on, kept so
// that a replica killed by the failover run starts again on the same ones.
type replica struct {
	name                 string
	proc                 *proc
	grpc, metrics, peers string // peers is "" for a picker that runs alone
}

// stack is everything one (workload, config) run talks to.
type stack struct {
	cfg     string
	tok     tokenizer // the sims'
	procs   *procs
	sims    []simInfo
	base    string     // dev proxy URL
	pickers []*replica // none without a picker
	// pickerArgs are the flags every replica shares (pool, config).
	pickerArgs []string
	// split is the capacity-weighted oracle's sim for each group.
	split []int
	// Counters after the warm-up (markBaseline), per sim and per replica.
	simBase    []map[string]float64
	pickerBase []map[string]float64
}

// stackSpec is what startStack starts.
type stackSpec struct {
	cfg string
	// replicas is how many picker processes run, joined as peers behind
	// the proxy's round robin; 0 counts as 1 for a config with a picker.
	replicas int
	tok      tokenizer // the sims'
	// servers are the sims, one each; the zero server is a default sim.
	servers    []server
	objectives []objective
	// groups is how many shared prefixes the workload has, which the
	// capacity-weighted oracle splits.
	groups int
	name   string // the run's log folder
}

// objective is a pool-file objective.
type objective struct {
	name     string
	priority int
}

type env struct {
	binary  string // infergate: sims and picker
	standIn string // envoysim
	scale   float64
	dir     string
	model   simModel
	itls    []itlSample // one per run, for the machine check
	goals   goals       // the goals, one figure per run
	// tokenizers are the sims' tokenizers of workload t.
	tokenizers []tokenizer
	// replicas are the picker replica counts each picker config runs with
	// (--replicas).
	replicas []int
	// quick runs workload h and the failover run at their small sizes.
	quick bool
	// llmd runs workload h's servers on llm-d-inference-sim; nil runs
	// infergate sim.
	llmd *llmdSim
}

// startStack starts fresh simulators and, depending on the config, the
// picker's replicas and the Envoy stand-in in front of them. The caller
// must stop st.procs, also when an error is returned.
func (e *env) startStack(ctx context.Context, spec stackSpec) (*stack, error) {
	dir := filepath.Join(e.dir, spec.name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	st := &stack{cfg: spec.cfg, tok: spec.tok, procs: &procs{dir: dir}}
	if err := e.startSims(ctx, st, spec); err != nil {
		return st, err
	}
	proxyArgs := []string{"--port", "0"}
	switch {
	case usesPicker(spec.cfg):
		if spec.cfg == cfgOracleCapacity {
			st.split = capacitySplit(spec.groups, kvWeights(spec.servers))
		}
		if err := e.startPickers(ctx, st, spec, dir); err != nil {
			return st, err
		}
		grpc := make([]string, len(st.pickers))
		for i, r := range st.pickers {
			grpc[i] = r.grpc
		}
		// Several hosts make the proxy's processor a health-checked
		// cluster: each stream to the next healthy replica in turn.
		proxyArgs = append(proxyArgs, "--ext-proc", "epp="+strings.Join(grpc, "+")+",failure-mode=FailClose,tls=false,response-body=none")
	default:
		proxyArgs = append(proxyArgs, "--fallback-endpoints", st.simAddrs())
	}
	return st, e.startProxy(ctx, st, proxyArgs)
}

// startSims starts one sim per server and waits until each answers.
func (e *env) startSims(ctx context.Context, st *stack, spec stackSpec) error {
	for i, srv := range spec.servers {
		name := fmt.Sprintf("pod-%d", i)
		addr, err := childproc.FreeAddr()
		if err != nil {
			return err
		}
		_, port, _ := net.SplitHostPort(addr)
		c := e.simCommand(name, port, srv, spec)
		p, err := st.procs.startEnv(name, c.binary, c.env, nil, c.args...)
		if err != nil {
			return err
		}
		st.sims = append(st.sims, simInfo{name: name, addr: addr, proc: p, model: c.model})
	}
	return st.waitSims(ctx)
}

// simCommand is how one server of a pool starts: its binary, the
// environment it adds, its flags, and the latency model it runs.
type simCommand struct {
	binary    string
	env, args []string
	model     simModel
}

// simCommand starts server srv as infergate sim, or on
// llm-d-inference-sim with --llmd-sim, listening on port.
func (e *env) simCommand(name, port string, srv server, spec stackSpec) simCommand {
	base := e.baseModel()
	if e.llmd != nil {
		return simCommand{binary: e.llmd.binary, env: llmdEnv(name), args: e.llmd.args(port, srv, base), model: llmdModel(srv, base)}
	}
	args := append([]string{"sim", "--name", name, "--port", port, "--time-scale", strconv.FormatFloat(e.scale, 'g', -1, 64)}, spec.tok.simArgs()...)
	return simCommand{binary: e.binary, args: append(args, srv.args(base)...), model: srv.model(e.model)}
}

// waitSims waits until every sim answers its health check.
func (st *stack) waitSims(ctx context.Context) error {
	for _, s := range st.sims {
		if err := waitHTTP(ctx, "http://"+s.addr+"/health", s.proc, nil); err != nil {
			return fmt.Errorf("%s: %w (log: %s)", s.name, err, childproc.Tail(s.proc.log, 5))
		}
	}
	return nil
}

// startPickers writes the pool (and config) file and starts the picker's
// replicas, each joining those before it, and waits until each has fresh
// metrics of every sim and sees all the others: only then do decisions
// reach every replica from the first measured request on.
func (e *env) startPickers(ctx context.Context, st *stack, spec stackSpec, dir string) error {
	var pool strings.Builder
	fmt.Fprintf(&pool, "name: %s\nendpoints:\n", spec.name)
	for _, s := range st.sims {
		fmt.Fprintf(&pool, "- address: %s\n  name: %s\n", s.addr, s.name)
	}
	if len(spec.objectives) > 0 {
		pool.WriteString("objectives:\n")
		for _, o := range spec.objectives {
			fmt.Fprintf(&pool, "- {name: %s, priority: %d}\n", o.name, o.priority)
		}
	}
	poolFile := filepath.Join(dir, "pool.yaml")
	if err := os.WriteFile(poolFile, []byte(pool.String()), 0o600); err != nil {
		return err
	}
	st.pickerArgs = []string{"epp", "--pool-file", poolFile, "--secure-serving=false", "--grpc-health-port", "0"}
	if text, ok := pickerConfigs[spec.cfg]; ok {
		f := filepath.Join(dir, "epp-config.yaml")
		if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
			return err
		}
		st.pickerArgs = append(st.pickerArgs, "--config-file", f)
	}
	n := max(spec.replicas, 1)
	for i := range n {
		r, err := newReplica(i, n)
		if err != nil {
			return err
		}
		st.pickers = append(st.pickers, r)
		if err := e.startReplica(st, r, st.pickers[:i]); err != nil {
			return err
		}
	}
	for _, r := range st.pickers {
		if err := st.waitReplica(ctx, r, n-1); err != nil {
			return err
		}
	}
	return nil
}

// newReplica picks free loopback ports for replica i of n: ext_proc,
// metrics and, with several replicas, the peers port (memberlist binds
// its TCP and UDP). One replica is named "epp" as the picker always was.
func newReplica(i, n int) (*replica, error) {
	r := &replica{name: "epp"}
	if n > 1 {
		r.name = fmt.Sprintf("epp-%d", i)
	}
	addrs := []*string{&r.grpc, &r.metrics}
	if n > 1 {
		addrs = append(addrs, &r.peers)
	}
	for _, a := range addrs {
		free, err := childproc.FreeAddr()
		if err != nil {
			return nil, err
		}
		*a = free
	}
	return r, nil
}

// startReplica starts r's process on its addresses, joining the replicas
// in join.
func (e *env) startReplica(st *stack, r *replica, join []*replica) error {
	hostPort := func(a string) (string, string) { h, p, _ := net.SplitHostPort(a); return h, p }
	ghost, gport := hostPort(r.grpc)
	mhost, mport := hostPort(r.metrics)
	args := append(slices.Clone(st.pickerArgs), "--grpc-bind-address", ghost, "--grpc-port", gport,
		"--metrics-bind-address", mhost, "--metrics-port", mport)
	if r.peers != "" {
		args = append(args, "--peers-bind-address", r.peers)
		var peers []string
		for _, j := range join {
			peers = append(peers, j.peers)
		}
		if len(peers) > 0 {
			args = append(args, "--peers", strings.Join(peers, ","))
		}
	}
	p, err := st.procs.start(r.name, e.binary, nil, args...)
	if err != nil {
		return err
	}
	r.proc = p
	return nil
}

// waitReplica waits until r has fresh metrics of every sim and sees peers
// other replicas.
func (st *stack) waitReplica(ctx context.Context, r *replica, peers int) error {
	if err := waitScraped(ctx, r.metrics, len(st.sims), r.proc); err != nil {
		return fmt.Errorf("picker %s: %w (log: %s)", r.name, err, childproc.Tail(r.proc.log, 5))
	}
	if peers == 0 {
		return nil
	}
	seen := func() bool {
		m, err := pickerMetrics(ctx, r.metrics)
		return err == nil && m[metricPeers] == float64(peers)
	}
	if err := waitFor(ctx, r.proc, 20*time.Second, fmt.Sprintf("see %d peers (%s)", peers, metricPeers), seen); err != nil {
		return fmt.Errorf("picker %s: %w (log: %s)", r.name, err, childproc.Tail(r.proc.log, 5))
	}
	return nil
}

// startProxy starts the Envoy stand-in and waits until a request passes
// through it.
func (e *env) startProxy(ctx context.Context, st *stack, args []string) error {
	out := newLineWatch("envoysim listening on ")
	p, err := st.procs.start("envoysim", e.standIn, out, args...)
	if err != nil {
		return err
	}
	select {
	case u := <-out.found:
		st.base = u
	case <-p.done:
		return fmt.Errorf("envoysim exited (log: %s)", childproc.Tail(p.log, 5))
	case <-time.After(15 * time.Second):
		return fmt.Errorf("envoysim did not report its address within 15s (log: %s)", childproc.Tail(p.log, 5))
	case <-ctx.Done():
		return ctx.Err()
	}
	// The probe names every sim for the oracle's testing filter; the other
	// pickers ignore the header.
	probe := http.Header{selectionHeader: {st.simAddrs()}}
	if err := waitHTTP(ctx, st.base+"/v1/models", p, probe); err != nil {
		return fmt.Errorf("through envoysim: %w (log: %s)", err, childproc.Tail(p.log, 5))
	}
	return nil
}

// simAddrs lists the sims' addresses as the proxy's flags take them.
func (st *stack) simAddrs() string {
	addrs := make([]string, len(st.sims))
	for i, s := range st.sims {
		addrs[i] = s.addr
	}
	return strings.Join(addrs, ",")
}

// cpuSnap is the CPU time used so far by kind of process: sims, picker,
// proxy and the driver itself.
type cpuSnap map[string]time.Duration

var cpuKinds = []string{"sims", "picker", "proxy", "driver"}

func (st *stack) cpu() cpuSnap {
	st.procs.mu.Lock()
	defer st.procs.mu.Unlock()
	m := cpuSnap{"driver": selfCPU()}
	for _, c := range st.procs.list {
		kind := c.name
		switch {
		case strings.HasPrefix(kind, "pod-"):
			kind = "sims"
		case strings.HasPrefix(kind, "epp"): // every replica's
			kind = "picker"
		case kind == "envoysim":
			kind = "proxy"
		}
		m[kind] += c.cpu()
	}
	return m
}

// cores returns the cores used between before and s over wall: in total
// and by kind of process.
func (s cpuSnap) cores(before cpuSnap, wall time.Duration) (float64, string) {
	total := 0.0
	var parts []string
	for _, k := range cpuKinds {
		v, ok := s[k]
		if !ok {
			continue
		}
		c := (v - before[k]).Seconds() / wall.Seconds()
		total += c
		parts = append(parts, fmt.Sprintf("%s %.2f", k, c))
	}
	return total, strings.Join(parts, ", ")
}

// lineWatch is a writer that reports the rest of the first line starting
// with prefix and discards everything.
type lineWatch struct {
	prefix string
	found  chan string
	mu     sync.Mutex
	buf    []byte
	done   bool
}

func newLineWatch(prefix string) *lineWatch {
	return &lineWatch{prefix: prefix, found: make(chan string, 1)}
}

func (w *lineWatch) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(b), nil
	}
	w.buf = append(w.buf, b...)
	for {
		i := slices.Index(w.buf, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSpace(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
		if rest, ok := strings.CutPrefix(line, w.prefix); ok {
			w.found <- rest
			w.done, w.buf = true, nil
			break
		}
	}
	return len(b), nil
}

// waitHTTP waits up to 15s for url to answer 200, giving up early when the
// process serving it exits.
func waitHTTP(ctx context.Context, url string, p *proc, hdr http.Header) error {
	ok := func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		maps.Copy(req.Header, hdr)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	return waitFor(ctx, p, 15*time.Second, "answer 200 at "+url, ok)
}

// waitScraped waits until the picker has fresh metrics of all n endpoints.
func waitScraped(ctx context.Context, metricsAddr string, n int, p *proc) error {
	fresh := func() bool {
		got, err := freshEndpoints(ctx, metricsAddr)
		return err == nil && got == n
	}
	return waitFor(ctx, p, 20*time.Second, fmt.Sprintf("report %d endpoints with fresh metrics", n), fresh)
}

// waitFor polls ok every 25 ms until it holds, for at most within, giving
// up early when p exits.
func waitFor(ctx context.Context, p *proc, within time.Duration, what string, ok func() bool) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if p.exited() {
			return errors.New("process exited")
		}
		if ok() {
			return nil
		}
		if err := sleepCtx(ctx, 25*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("did not %s within %s", what, within)
}

var freshRE = regexp.MustCompile(`(?m)^infergate_epp_endpoints\{state="fresh"\} (\S+)$`)

func freshEndpoints(ctx context.Context, metricsAddr string) (int, error) {
	b, err := getBody(ctx, "http://"+metricsAddr+"/metrics")
	if err != nil {
		return 0, err
	}
	m := freshRE.FindSubmatch(b)
	if m == nil {
		return 0, errors.New("no infergate_epp_endpoints gauge")
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return int(v), err
}

func getBody(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// simModel is the simulators' latency model, read from `infergate sim
// --help` so that the figures follow the binary's defaults.
type simModel struct {
	maxNumSeqs              int
	overhead, perToken, itl time.Duration
	known                   bool
}

var helpDefaultRE = regexp.MustCompile(`--([a-z-]+) \S+ .*\(default ([^)]+)\)`)

func readSimModel(binary string) simModel {
	out, err := exec.Command(binary, "sim", "--help").CombinedOutput()
	if err != nil {
		return simModel{}
	}
	return parseSimHelp(string(out))
}

// parseSimHelp reads the latency and concurrency defaults from the flag
// list of `infergate sim --help`.
func parseSimHelp(help string) simModel {
	defs := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		if m := helpDefaultRE.FindStringSubmatch(sc.Text()); m != nil {
			defs[m[1]] = m[2]
		}
	}
	var m simModel
	var errs []error
	dur := func(k string) time.Duration {
		d, err := time.ParseDuration(defs[k])
		errs = append(errs, err)
		return d
	}
	m.overhead = dur("prefill-overhead")
	m.perToken = dur("prefill-time-per-token")
	m.itl = dur("inter-token-latency")
	n, err := strconv.Atoi(defs["max-num-seqs"])
	m.maxNumSeqs = n
	errs = append(errs, err)
	m.known = errors.Join(errs...) == nil && n > 0
	return m
}

// service is the simulated time a request holds a running slot: prefill of
// the uncached prompt, then one inter-token latency per token after the
// first.
func (m simModel) service(promptTokens, cachedTokens, outputTokens int) time.Duration {
	return m.overhead + time.Duration(promptTokens-cachedTokens)*m.perToken + time.Duration(max(outputTokens-1, 0))*m.itl
}
