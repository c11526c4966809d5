package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// child is one processor process started for one attack on one transport.
type child struct {
	processor, transport          string
	grpcAddr, healthAddr, metrics string
	cmd                           *exec.Cmd
	log                           string
	exited                        chan struct{} // closed once the process has been waited for
	waitErr                       error         // set before exited closes
}

// startChild runs `infergate <processor>` on free loopback ports with the
// given transport, logging to a file in dir, and waits until its readiness
// service answers. extra are the processor's own flags (the picker's pool).
func startChild(ctx context.Context, binary, processor, transport, dir string, extra ...string) (*child, error) {
	var addrs [3]string
	for i := range addrs {
		a, err := childproc.FreeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	c := &child{processor: processor, transport: transport, grpcAddr: addrs[0], healthAddr: addrs[1], metrics: addrs[2],
		log: filepath.Join(dir, fmt.Sprintf("%s-%s-%d.log", processor, transport, time.Now().UnixNano())), exited: make(chan struct{})}
	port := func(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
	args := append([]string{processor, "--extproc-transport", transport, "--secure-serving=false",
		"--grpc-bind-address", "127.0.0.1", "--grpc-port", port(c.grpcAddr),
		"--grpc-health-bind-address", "127.0.0.1", "--grpc-health-port", port(c.healthAddr),
		"--metrics-bind-address", "127.0.0.1", "--metrics-port", port(c.metrics)}, extra...)
	logFile, err := os.Create(c.log)
	if err != nil {
		return nil, fmt.Errorf("child log: %w", err)
	}
	defer logFile.Close()
	c.cmd = exec.Command(binary, args...)
	// The charts' pods set GOMEMLIMIT from their memory limit; here the
	// processor runs without one, so that the RSS an attack costs shows in
	// full instead of as collector work, and is compared with the limit.
	c.cmd.Env = withoutEnv(os.Environ(), "GOMEMLIMIT")
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	// A driver killed mid-attack must not leave a processor behind.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", binary, processor, err)
	}
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	if err := childproc.WaitReady(ctx, c.healthAddr, 30*time.Second); err != nil {
		c.stop()
		return nil, fmt.Errorf("%s on %s: %w; its log ends:\n%s", processor, transport, err, childproc.Tail(c.log, 20))
	}
	return c, nil
}

func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// cpu is the CPU time the process has used so far, from /proc while it
// runs and from its exit status once it has died.
func (c *child) cpu() (time.Duration, error) {
	if !c.alive() {
		st := c.cmd.ProcessState
		return st.UserTime() + st.SystemTime(), nil
	}
	d, err := childproc.CPUTime(c.pid())
	if err != nil && !c.alive() {
		return c.cpu()
	}
	return d, err
}

// stop interrupts the process and kills it if it has not exited within
// 10 s (the drain of a stream the attack left open must not hold the
// run); forced says it had to be killed.
func (c *child) stop() (forced bool) {
	if !c.alive() {
		return false
	}
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.exited:
		return false
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return true
	}
}

// healthy says whether the process is alive and the readiness service
// answers SERVING both on its health listener and on the ext_proc
// listener the attack hit (gateways probe the latter), and if not, why.
func (c *child) healthy(ctx context.Context) (bool, string) {
	if !c.alive() {
		return false, fmt.Sprintf("exited (%v); log: %s", c.waitErr, lastLine(c.log))
	}
	for _, addr := range []string{c.grpcAddr, c.healthAddr} {
		if err := childproc.WaitReady(ctx, addr, 5*time.Second); err != nil {
			if !c.alive() {
				return false, fmt.Sprintf("exited (%v); log: %s", c.waitErr, lastLine(c.log))
			}
			return false, fmt.Sprintf("no health answer: %v", err)
		}
	}
	return true, ""
}

func lastLine(path string) string {
	s := childproc.Tail(path, 1)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// heapInuse is the Go heap in use (spans holding objects, garbage not yet
// swept included) the processor reports on its metrics listener. RSS
// misses memory that is allocated but not yet touched (a fresh large
// allocation is zero pages until written); the collector, and GOMEMLIMIT
// in a pod, count it.
func heapInuse(ctx context.Context, client *http.Client, metricsAddr string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_inuse_bytes "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("go_memstats_heap_inuse_bytes %q: %w", v, err)
			}
			return int64(f), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("metrics: no go_memstats_heap_inuse_bytes")
}
