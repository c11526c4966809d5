package childproc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcessorConfig describes one processor child: `Binary Command ...` on
// three free loopback ports (ext_proc, health, metrics).
type ProcessorConfig struct {
	Binary  string
	Command string // epp or payload
	// Args are the processor's own flags (its pool, transport, limits).
	Args []string
	TLS  bool // serve ext_proc over TLS (--secure-serving)
	// Log is the file the child's output goes to (created).
	Log string
	// Env is the child's environment; nil is the parent's.
	Env []string
	// Ready bounds the wait for its readiness service (default 30 s).
	Ready time.Duration
	// GRPCHost and GRPCPort, when set, are where ext_proc is served
	// (default: loopback, a free port), e.g. a pod's address in a test's
	// network namespace; health and metrics stay on free loopback ports.
	GRPCHost string
	GRPCPort int
}

// Processor is a running processor child.
type Processor struct {
	GRPCAddr, HealthAddr, MetricsAddr string
	Log                               string
	Cmd                               *exec.Cmd

	exited  chan struct{} // closed once the process has been waited for
	waitErr error         // set before exited closes
}

// StartProcessor starts the child and returns once its readiness service
// answers SERVING; on failure the child is stopped and the error ends with
// its log's last lines. The kernel kills the child if the caller dies
// first (Pdeathsig), so a killed test or driver leaves none behind.
//
// The ports are free when chosen (FreeAddr), but another process may bind
// one of them before the child does: tests run side by side, and the
// kernel hands ephemeral ports out in turn. A child that fails on that
// ("address already in use") is started again on fresh ports, twice at
// most.
func StartProcessor(ctx context.Context, cfg ProcessorConfig) (*Processor, error) {
	for attempt := 1; ; attempt++ {
		p, err := startProcessor(ctx, cfg)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return p, err
		}
	}
}

func startProcessor(ctx context.Context, cfg ProcessorConfig) (*Processor, error) {
	var addrs [3]string
	for i := range addrs {
		a, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	if cfg.GRPCHost != "" || cfg.GRPCPort != 0 {
		host, port, _ := net.SplitHostPort(addrs[0])
		if cfg.GRPCHost != "" {
			host = cfg.GRPCHost
		}
		if cfg.GRPCPort != 0 {
			port = strconv.Itoa(cfg.GRPCPort)
		}
		addrs[0] = net.JoinHostPort(host, port)
	}
	hostPort := func(a string) (string, string) { h, p, _ := net.SplitHostPort(a); return h, p }
	port := func(a string) string { _, p := hostPort(a); return p }
	grpcHost, _ := hostPort(addrs[0])
	args := append([]string{cfg.Command, "--secure-serving=" + strconv.FormatBool(cfg.TLS),
		"--grpc-bind-address", grpcHost, "--grpc-port", port(addrs[0]),
		"--grpc-health-bind-address", "127.0.0.1", "--grpc-health-port", port(addrs[1]),
		"--metrics-bind-address", "127.0.0.1", "--metrics-port", port(addrs[2])}, cfg.Args...)
	logf, err := os.Create(cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", cfg.Command, err)
	}
	defer logf.Close() // the child holds its own descriptor
	p := &Processor{GRPCAddr: addrs[0], HealthAddr: addrs[1], MetricsAddr: addrs[2], Log: cfg.Log,
		Cmd: exec.Command(cfg.Binary, args...), exited: make(chan struct{})}
	p.Cmd.Env = cfg.Env
	p.Cmd.Stdout, p.Cmd.Stderr = logf, logf
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", cfg.Binary, cfg.Command, err)
	}
	go func() {
		p.waitErr = p.Cmd.Wait()
		close(p.exited)
	}()
	ready := cfg.Ready
	if ready <= 0 {
		ready = 30 * time.Second
	}
	// A child that exits (a bad flag) ends the wait at once.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-p.exited:
			cancel(fmt.Errorf("it exited (%v)", p.waitErr))
		case <-wctx.Done():
		}
	}()
	if err := WaitReady(wctx, p.HealthAddr, ready); err != nil {
		p.Stop(time.Second)
		return nil, fmt.Errorf("%s: %w; its log ends:\n%s", cfg.Command, err, Tail(cfg.Log, 20))
	}
	return p, nil
}

// Pid is the child's process id.
func (p *Processor) Pid() int { return p.Cmd.Process.Pid }

// Alive says whether the child has not exited yet.
func (p *Processor) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// WaitErr is how the child exited; nil while it runs.
func (p *Processor) WaitErr() error {
	if p.Alive() {
		return nil
	}
	return p.waitErr
}

// Stop interrupts the child (it drains, as on a pod's stop) and kills it
// if it has not exited within grace; forced says it had to be killed.
func (p *Processor) Stop(grace time.Duration) (forced bool) {
	if !p.Alive() {
		return false
	}
	_ = p.Cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.exited:
		return false
	case <-time.After(grace):
		_ = p.Cmd.Process.Kill()
		<-p.exited
		return true
	}
}
