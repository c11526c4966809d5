// Command demo runs infergate's main job on loopback and explains it: three
// simulated model servers of different speed, the payload processor and
// the endpoint picker in front of them, and the Envoy stand-in (envoysim)
// running both filters, each as its own process. It sends a few
// hundred chat requests through the proxy, prints how they were spread and
// why (the picker's scores), then shows the guardrails at work, and stops
// everything. `make demo` runs it.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// server is one simulated model server and how it differs from the others.
type server struct {
	name string
	args []string
	what string
	addr string
}

func main() {
	binary := flag.String("binary", "bin/infergate", "the infergate binary")
	standIn := flag.String("envoysim", "bin/envoysim", "the envoysim binary (the Envoy stand-in)")
	requests := flag.Int("requests", 300, "requests to send")
	concurrency := flag.Int("concurrency", 24, "requests in flight at once")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := run(ctx, *binary, *standIn, *requests, *concurrency); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, binary, standIn string, nRequests, concurrency int) error {
	for _, b := range []string{binary, standIn} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s: %w (run make build)", b, err)
		}
	}
	dir, err := os.MkdirTemp("", "infergate-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	procs := &processes{}
	defer procs.stopAll()

	// Time runs 20x faster than real time in the sims so the demo is quick.
	common := []string{"--time-scale", "20", "--prefill-overhead", "20ms", "--prefill-time-per-token", "200us", "--lora-adapters", demoAdapter}
	servers := []*server{
		{name: "sim-large", args: []string{"--max-num-seqs", "12", "--inter-token-latency", "15ms"}, what: "12 concurrent sequences, 15ms/token"},
		{name: "sim-medium", args: []string{"--max-num-seqs", "6", "--inter-token-latency", "20ms"}, what: "6 concurrent sequences, 20ms/token"},
		{name: "sim-small", args: []string{"--max-num-seqs", "2", "--inter-token-latency", "30ms"}, what: "2 concurrent sequences, 30ms/token"},
	}
	fmt.Println("infergate demo: three simulated model servers, the payload processor, the endpoint picker and the Envoy stand-in, all on 127.0.0.1")
	var pool strings.Builder
	pool.WriteString("name: demo\nendpoints:\n")
	for _, s := range servers {
		if s.addr, err = childproc.FreeAddr(); err != nil {
			return err
		}
		_, port, _ := net.SplitHostPort(s.addr)
		args := append([]string{"sim", "--name", s.name, "--port", port}, append(common, s.args...)...)
		if err := procs.start(ctx, filepath.Join(dir, s.name+".log"), binary, args...); err != nil {
			return err
		}
		fmt.Fprintf(&pool, "- address: %s\n  name: %s\n", s.addr, s.name)
	}
	for _, s := range servers {
		if err := waitHTTP(ctx, "http://"+s.addr+"/health"); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		fmt.Printf("  %-10s %s  %s\n", s.name, s.addr, s.what)
	}

	poolFile := filepath.Join(dir, "pool.yaml")
	if err := os.WriteFile(poolFile, []byte(pool.String()), 0o600); err != nil {
		return err
	}
	eppAddr, err := childproc.FreeAddr()
	if err != nil {
		return err
	}
	_, eppPort, _ := net.SplitHostPort(eppAddr)
	if err := procs.start(ctx, filepath.Join(dir, "epp.log"), binary, "epp", "--pool-file", poolFile,
		"--grpc-bind-address", "127.0.0.1", "--grpc-port", eppPort, "--grpc-health-port", "0", "--metrics-port", "0",
		"--emit-endpoint-scores"); err != nil {
		return err
	}
	payloadFile := filepath.Join(dir, "payload.yaml")
	if err := os.WriteFile(payloadFile, []byte(payloadConfig), 0o600); err != nil {
		return err
	}
	payloadAddr, err := childproc.FreeAddr()
	if err != nil {
		return err
	}
	payloadMetrics, err := childproc.FreeAddr()
	if err != nil {
		return err
	}
	_, payloadPort, _ := net.SplitHostPort(payloadAddr)
	_, payloadMetricsPort, _ := net.SplitHostPort(payloadMetrics)
	if err := procs.start(ctx, filepath.Join(dir, "payload.log"), binary, "payload", "--config-file", payloadFile,
		"--grpc-bind-address", "127.0.0.1", "--grpc-port", payloadPort, "--grpc-health-port", "0",
		"--metrics-bind-address", "127.0.0.1", "--metrics-port", payloadMetricsPort); err != nil {
		return err
	}
	proxyLog := filepath.Join(dir, "envoysim.log")
	proxyOut, err := procs.startPiped(ctx, proxyLog, standIn, "--port", "0",
		"--ext-proc", "payload="+payloadAddr+",failure-mode=FailClose,tls=true",
		"--ext-proc", "epp="+eppAddr+",failure-mode=FailClose,tls=true", "--debug-metadata")
	if err != nil {
		return err
	}
	base, err := proxyURL(proxyOut)
	if err != nil {
		return fmt.Errorf("envoysim: %w (log: %s)", err, childproc.Tail(proxyLog, 5))
	}
	fmt.Printf("  %-10s %s  TLS; model headers, adapter %s -> its base, e-mail masked, SSN and injection refused\n", "payload", payloadAddr, demoAdapter)
	fmt.Printf("  %-10s %s  TLS, the default profile\n", "epp", eppAddr)
	fmt.Printf("  %-10s %s  ext_proc filters 'payload' then 'epp' (both FailClose), routes by the picker's envoy.lb metadata\n\n", "envoysim", strings.TrimPrefix(base, "http://"))
	if err := waitPicks(ctx, base); err != nil {
		return fmt.Errorf("%w (picker log: %s)", err, childproc.Tail(filepath.Join(dir, "epp.log"), 5))
	}

	fmt.Printf("Sending %d chat requests, %d at a time, from %d apps; each app has its own long system prompt...\n\n", nRequests, concurrency, apps)
	results, elapsed := send(ctx, base, nRequests, concurrency)
	if err := report(ctx, servers, results, elapsed); err != nil {
		return err
	}
	return guardrails(ctx, base, "http://"+payloadMetrics+"/metrics")
}

// apps is how many distinct system prompts the demo's requests share.
const apps = 8

// systemPrompt is app a's system prompt: about 600 tokens of text that
// differs between apps from its first words.
func systemPrompt(a int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "You are assistant number %d. ", a)
	for i := 0; b.Len() < 2400; i++ {
		fmt.Fprintf(&b, "Rule %d of app %d: answer briefly, cite sources, and stay on topic. ", i, a)
	}
	return b.String()
}

type result struct {
	app      int
	err      error
	status   int
	upstream string
	pod      string
	latency  time.Duration
	scores   map[string]float64
}

func send(ctx context.Context, base string, n, concurrency int) ([]result, time.Duration) {
	client := &http.Client{Timeout: 30 * time.Second}
	out := make([]result, n)
	jobs := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				out[i] = one(ctx, client, base, i)
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return out, time.Since(start)
}

func one(ctx context.Context, client *http.Client, base string, i int) result {
	app := (i * 5) % apps // interleaved, so every app's requests are spread over the run
	// Some requests name the LoRA adapter, some carry an e-mail address the
	// payload processor masks before the request reaches a server.
	model, user := demoBase, fmt.Sprintf("Request %d: write a haiku about routing.", i)
	if i%10 == 3 {
		model = demoAdapter
	}
	if i%7 == 2 {
		user += fmt.Sprintf(" Mail it to user%d@example.com.", i)
	}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`,
		model, systemPrompt(app), user, 16+i%48)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return result{app: app, err: err}
	}
	req.Header.Set("content-type", "application/json")
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	r := result{app: app, status: resp.StatusCode, upstream: resp.Header.Get("x-infergate-upstream"), pod: resp.Header.Get("x-inference-pod"), latency: time.Since(t0)}
	var lb struct {
		Scores map[string]float64 `json:"x-gateway-destination-endpoint-scores"`
	}
	if json.Unmarshal([]byte(resp.Header.Get("x-infergate-debug-envoy-lb")), &lb) == nil {
		r.scores = lb.Scores
	}
	return r
}

// report prints the table and the explanation; it fails when a request
// failed or was answered by another server than the one picked.
func report(ctx context.Context, servers []*server, results []result, elapsed time.Duration) error {
	name := map[string]string{}
	for _, s := range servers {
		name[s.addr] = s.name
	}
	type agg struct {
		n   int
		lat []time.Duration
	}
	by := map[string]*agg{}
	failed := 0
	for _, r := range results {
		if r.err != nil || r.status != 200 {
			failed++
			continue
		}
		a := by[r.upstream]
		if a == nil {
			a = &agg{}
			by[r.upstream] = a
		}
		a.n++
		a.lat = append(a.lat, r.latency)
	}
	ok := len(results) - failed
	fmt.Printf("| endpoint | server | requests | share | prefix-cache hit rate | p50 latency | p99 latency |\n")
	fmt.Printf("|---|---|---:|---:|---:|---:|---:|\n")
	for _, s := range servers {
		a := by[s.addr]
		if a == nil {
			a = &agg{}
		}
		slices.Sort(a.lat)
		fmt.Printf("| %s | %s | %d | %.0f%% | %s | %s | %s |\n", s.name, s.addr, a.n, 100*float64(a.n)/float64(max(ok, 1)),
			hitRate(ctx, s.addr), pct(a.lat, 0.5), pct(a.lat, 0.99))
	}
	fmt.Printf("\n%d of %d requests answered 200 in %s; %d failed. Latencies are wall clock with the sims running 20x faster than real time.\n", ok, len(results), elapsed.Round(time.Millisecond), failed)
	mismatch := 0
	for _, r := range results {
		if r.err == nil && r.status == 200 && name[r.upstream] != r.pod {
			mismatch++
		}
	}
	fmt.Printf("Every answer came from the server the picker chose: %v (x-inference-pod matched the picked endpoint %d/%d times).\n\n", mismatch == 0, ok-mismatch, ok)

	fmt.Println("Where each app's requests went (its system prompt sits in that server's prefix cache):")
	for a := range apps {
		count := map[string]int{}
		for _, r := range results {
			if r.app == a && r.err == nil && r.status == 200 {
				count[name[r.upstream]]++
			}
		}
		var parts []string
		for _, s := range servers {
			if count[s.name] > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", s.name, count[s.name]))
			}
		}
		fmt.Printf("  app %d: %s\n", a, strings.Join(parts, ", "))
	}
	fmt.Println()
	fmt.Println("Why: the default profile. A new system prompt goes to the server that least recently took a new one")
	fmt.Println("(no-hit-lru-scorer x2), so the apps spread over the pool. From then on the prefix-cache-affinity-filter")
	fmt.Println("keeps an app on the servers holding its prompt (the others show as filtered out), unless their waiting")
	fmt.Println("queue is more than 2 longer than another server's: then load decides and the prompt gets cached on a")
	fmt.Println("second server. prefix-cache-scorer x3, queue-scorer x2 and kv-cache-utilization-scorer x2 weigh the")
	fmt.Println("rest (metrics scraped every 50ms); lora-affinity-scorer x1 favours servers with the adapter active.")
	fmt.Println("The small server's queue fills first, so its apps overflow; the large server takes the most work.")
	fmt.Println("A few decisions, with every candidate's score:")
	for _, i := range []int{0, len(results) / 4, len(results) / 2, 3 * len(results) / 4, len(results) - 1} {
		r := results[i]
		if r.err != nil || r.scores == nil {
			continue
		}
		var parts []string
		for _, s := range servers {
			if v, ok := r.scores[s.addr]; ok {
				parts = append(parts, fmt.Sprintf("%s %.2f", s.name, v))
			} else {
				parts = append(parts, s.name+" filtered out")
			}
		}
		fmt.Printf("  request %3d (app %d) -> %-10s  (%s)\n", i, r.app, name[r.upstream], strings.Join(parts, ", "))
	}
	if failed > 0 || mismatch > 0 {
		return fmt.Errorf("%d requests failed and %d were answered by another server than the picked one", failed, mismatch)
	}
	return nil
}

func pct(sorted []time.Duration, p float64) string {
	if len(sorted) == 0 {
		return "-"
	}
	return sorted[min(int(float64(len(sorted))*p), len(sorted)-1)].Round(time.Millisecond).String()
}

// processes are the demo's children; stopAll interrupts them and waits.
type processes struct{ cmds []*exec.Cmd }

func (p *processes) start(ctx context.Context, logPath, binary string, args ...string) error {
	_, err := p.launch(ctx, logPath, false, binary, args...)
	return err
}

func (p *processes) startPiped(ctx context.Context, logPath, binary string, args ...string) (io.Reader, error) {
	return p.launch(ctx, logPath, true, binary, args...)
}

func (p *processes) launch(ctx context.Context, logPath string, pipe bool, binary string, args ...string) (io.Reader, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Stderr = logf
	var out io.Reader
	if pipe {
		if out, err = cmd.StdoutPipe(); err != nil {
			return nil, err
		}
	} else {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", binary, args[0], err)
	}
	p.cmds = append(p.cmds, cmd)
	return out, nil
}

func (p *processes) stopAll() {
	for _, c := range slices.Backward(p.cmds) {
		_ = c.Process.Signal(os.Interrupt)
	}
	for _, c := range p.cmds {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	fmt.Printf("\nStopped %d processes.\n", len(p.cmds))
}

func waitHTTP(ctx context.Context, url string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer within 15s", url)
}

// proxyURL reads the address the Envoy stand-in printed when it bound port 0.
func proxyURL(out io.Reader) (string, error) {
	sc := bufio.NewScanner(out)
	lines := make(chan string, 1)
	go func() {
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "envoysim listening on "); ok {
				lines <- u
			}
		}
	}()
	select {
	case u := <-lines:
		return u, nil
	case <-time.After(15 * time.Second):
		return "", errors.New("did not report its address within 15s")
	}
}

// waitPicks waits until the picker answers through the proxy with a pick.
func waitPicks(ctx context.Context, base string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("the proxy got no pick from the picker within 15s")
}

// hitRate reads a sim's prefix-cache counters.
func hitRate(ctx context.Context, addr string) string {
	series, err := scrape(ctx, "http://"+addr+"/metrics")
	if err != nil {
		return "?"
	}
	var hits, queries float64
	for s, v := range series {
		name, _, _ := strings.Cut(s, "{")
		switch name {
		case "vllm:prefix_cache_hits_total":
			hits += v
		case "vllm:prefix_cache_queries_total":
			queries += v
		}
	}
	if queries == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*hits/queries)
}
