package grpcjs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// Processor kinds and transports under test.
const (
	kindPicker  = "picker"
	kindPayload = "payload"

	transportGRPC = "grpc"
	transportH2   = "h2"
)

// openStreamsGauge is the processors' count of ext_proc streams open
// (extproc/server/budget.go): what a client left behind shows there.
const openStreamsGauge = "infergate_extproc_open_streams"

// processor is one running `infergate epp` or `infergate payload` child.
type processor struct {
	kind, transport string
	tls             bool
	addr            string // ext_proc, host:port
	metricsAddr     string
	logPath         string
	served          string // a picker's one endpoint
}

func (p *processor) String() string {
	return fmt.Sprintf("%s on %s (tls=%v) at %s", p.kind, p.transport, p.tls, p.addr)
}

// startProcessor runs one processor child on loopback ports until the test
// ends, and returns once its readiness health service says SERVING. The
// picker's pool is poolFile.
func startProcessor(t *testing.T, bin, kind, transport string, tls bool, poolFile string) (*processor, error) {
	args := []string{"--extproc-transport", transport,
		// A stop must not outlast the test: with nothing left open the
		// drain is immediate, and a stream left open is a failure the
		// scenarios report themselves.
		"--drain-timeout", "2s",
	}
	if kind == kindPicker {
		args = append(args, "--pool-file", poolFile)
	}
	log := filepath.Join(t.TempDir(), fmt.Sprintf("%s-%s-tls%v.log", kind, transport, tls))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	child, err := childproc.StartProcessor(ctx, childproc.ProcessorConfig{Binary: bin,
		Command: map[string]string{kindPicker: "epp", kindPayload: "payload"}[kind], Args: args, TLS: tls, Log: log})
	if err != nil {
		return nil, fmt.Errorf("%s on %s (tls=%v): %w", kind, transport, tls, err)
	}
	p := &processor{kind: kind, transport: transport, tls: tls, addr: child.GRPCAddr, metricsAddr: child.MetricsAddr, logPath: log}
	t.Cleanup(func() {
		if child.Stop(10 * time.Second) {
			t.Errorf("%s: still running 10 s after SIGINT (drain timeout 2 s); killed", p)
		} else if err := child.WaitErr(); err != nil {
			t.Errorf("%s: stopped with %v", p, err)
		}
		if t.Failed() {
			t.Logf("%s log (last lines):\n%s", p, childproc.Tail(p.logPath, 30))
		}
	})
	return p, nil
}

// openStreams reads the processor's open-streams gauge.
func (p *processor) openStreams(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", p, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), openStreamsGauge+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s %q: %w", p, openStreamsGauge, v, err)
			}
			return int(f), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("scrape %s: %w", p, err)
	}
	return 0, fmt.Errorf("%s: no %s in its metrics", p, openStreamsGauge)
}

// waitOpenStreams polls the open-streams gauge until it reads want, and
// returns how long that took.
func (p *processor) waitOpenStreams(ctx context.Context, want int, within time.Duration) (time.Duration, error) {
	start := time.Now()
	last := -1
	for {
		n, err := p.openStreams(ctx)
		if err != nil {
			return 0, err
		}
		if n == want {
			return time.Since(start), nil
		}
		last = n
		if time.Since(start) > within {
			return 0, fmt.Errorf("%s: %s is %d after %s, want %d", p, openStreamsGauge, last, within, want)
		}
		select {
		case <-ctx.Done():
			return 0, errors.Join(ctx.Err(), fmt.Errorf("%s: %s is %d, want %d", p, openStreamsGauge, last, want))
		case <-time.After(20 * time.Millisecond):
		}
	}
}
