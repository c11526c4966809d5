package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// child is one processor process started for one attack on one transport.
type child struct {
	*childproc.Processor
	processor, transport string
}

// startChild runs `infergate <processor>` on free loopback ports with the
// given transport, logging to a file in dir, and waits until its readiness
// service answers. extra are the processor's own flags (the picker's pool).
func startChild(ctx context.Context, binary, processor, transport, dir string, extra ...string) (*child, error) {
	p, err := childproc.StartProcessor(ctx, childproc.ProcessorConfig{
		Binary: binary, Command: processor, Args: append([]string{"--extproc-transport", transport}, extra...),
		Log: filepath.Join(dir, fmt.Sprintf("%s-%s-%d.log", processor, transport, time.Now().UnixNano())),
		// The charts' pods set GOMEMLIMIT from their memory limit; here
		// the processor runs without one, so that the RSS an attack costs
		// shows in full instead of as collector work, and is compared with
		// the limit.
		Env: withoutEnv(os.Environ(), "GOMEMLIMIT"),
	})
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", processor, transport, err)
	}
	return &child{Processor: p, processor: processor, transport: transport}, nil
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

// cpu is the CPU time the process has used so far, from /proc while it
// runs and from its exit status once it has died.
func (c *child) cpu() (time.Duration, error) {
	if !c.Alive() {
		st := c.Cmd.ProcessState
		return st.UserTime() + st.SystemTime(), nil
	}
	d, err := childproc.CPUTime(c.Pid())
	if err != nil && !c.Alive() {
		return c.cpu()
	}
	return d, err
}

// healthy says whether the process is alive and the readiness service
// answers SERVING both on its health listener and on the ext_proc
// listener the attack hit (gateways probe the latter), and if not, why.
func (c *child) healthy(ctx context.Context) (bool, string) {
	if !c.Alive() {
		return false, fmt.Sprintf("exited (%v); log: %s", c.WaitErr(), lastLine(c.Log))
	}
	for _, addr := range []string{c.GRPCAddr, c.HealthAddr} {
		if err := childproc.WaitReady(ctx, addr, 5*time.Second); err != nil {
			if !c.Alive() {
				return false, fmt.Sprintf("exited (%v); log: %s", c.WaitErr(), lastLine(c.Log))
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
