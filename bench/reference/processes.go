package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/infergate/infergate/bench/extprocload"
	"github.com/infergate/infergate/test/childproc"
)

// model is the model every request names (the simulators' default).
const model = "meta-llama/Llama-3.1-8B-Instruct"

// pickers: GAIE's endpoint picker against infergate's, both in Kubernetes
// mode on the same pool with their default scheduling profiles, TLS on.
var pickers = comparison{
	name: "endpoint pickers", key: "epp",
	start: func(r *rig, infergate bool) (*process, error) {
		if !infergate {
			return r.start("GAIE epp v1.5.0", filepath.Join(r.o.reference, "epp"), "127.0.0.1:9002",
				"--pool-name", poolName, "--pool-namespace", namespace,
				"--grpc-port", "9002", "--grpc-health-port", "9003", "--metrics-port", "9090",
				"--secure-serving=true", "--tracing=false", "--metrics-endpoint-auth=false")
		}
		return r.startInfergate("infergate epp", "127.0.0.1:9012", "127.0.0.1:9091", "epp",
			"--pool-name", poolName, "--pool-namespace", namespace, "--kubeconfig", r.kubeconfig,
			"--grpc-bind-address", "127.0.0.1", "--grpc-port", "9012",
			"--grpc-health-bind-address", "127.0.0.1", "--grpc-health-port", "9013",
			"--metrics-bind-address", "127.0.0.1", "--metrics-port", "9091", "--enable-pprof="+strconv.FormatBool(r.o.pprof()))
	},
	request: func(o options) (extprocload.Request, error) {
		return extprocload.Chat(model, o.eppBodyBytes, 0)
	},
	goals: func(ref, ours sample) []string {
		return []string{
			fmt.Sprintf("goal requests/s ≥ 3× the reference's: %.2f×, %s", ours.rate/ref.rate, met(ours.rate >= 3*ref.rate)),
			fmt.Sprintf("goal p99 ≤ 0.33× the reference's: %.2f×, %s", ours.p99.Seconds()/ref.p99.Seconds(), met(ours.p99.Seconds() <= 0.33*ref.p99.Seconds())),
		}
	},
}

// payloadProcessors: GAIE's body-based router (streaming) against
// infergate's payload processor with no policy, both setting the model
// headers only, TLS on.
var payloadProcessors = comparison{
	name: "payload processors", key: "payload",
	start: func(r *rig, infergate bool) (*process, error) {
		if !infergate {
			return r.start("GAIE bbr v1.5.0", filepath.Join(r.o.reference, "bbr"), "127.0.0.1:9004",
				"--streaming", "--grpc-port", "9004", "--grpc-health-port", "9005", "--metrics-port", "9092",
				"--secure-serving=true", "--tracing=false", "--metrics-endpoint-auth=false")
		}
		return r.startInfergate("infergate payload", "127.0.0.1:9014", "127.0.0.1:9093", "payload",
			"--grpc-bind-address", "127.0.0.1", "--grpc-port", "9014", "--grpc-health-bind-address", "127.0.0.1", "--grpc-health-port", "9015",
			"--metrics-bind-address", "127.0.0.1", "--metrics-port", "9093",
			"--enable-pprof="+strconv.FormatBool(r.o.pprof()))
	},
	request: func(o options) (extprocload.Request, error) {
		return extprocload.Chat(model, o.payloadBodyBytes, o.payloadChunkBytes)
	},
	goals: func(ref, ours sample) []string {
		return []string{
			fmt.Sprintf("goal RSS ≤ the reference's: %.0f against %.0f MiB, %s", ours.rssMiB, ref.rssMiB, met(ours.rssMiB <= ref.rssMiB)),
			fmt.Sprintf("goal requests/s ≥ 1.4× the reference's: %.2f×, %s", ours.rate/ref.rate, met(ours.rate >= 1.4*ref.rate)),
		}
	},
}

// process is a processor under measurement, and connections to it.
type process struct {
	name      string
	pprofAddr string // infergate's metrics listener, serving pprof with --cpu-profile or --trace
	cmd       *exec.Cmd
	log       string
	conns     []*extprocload.Conn
	done      chan error
}

// start runs bin with args (KUBECONFIG set to the rig's), logging to a
// file, and dials its ext_proc address over TLS.
func (r *rig) start(name, bin, addr string, args ...string) (*process, error) {
	logPath := filepath.Join(r.dir, strings.ReplaceAll(name, " ", "-")+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	if r.o.pin {
		args = append([]string{"-c", "1", bin}, args...)
		bin = "taskset"
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+r.kubeconfig), strings.Fields(r.o.env)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Should this command die (or be killed) with a processor stopped,
	// the processor goes too rather than linger.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	if p.conns, err = extprocload.Dial(addr, true, r.o.conns); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// startInfergate starts infergate's binary; metricsAddr is where it serves
// pprof when a profile is asked for.
func (r *rig) startInfergate(name, addr, metricsAddr string, args ...string) (*process, error) {
	p, err := r.start(name, r.o.binary, addr, append(args, "--extproc-transport", r.o.transport)...)
	if err == nil && r.o.pprof() {
		p.pprofAddr = metricsAddr
	}
	return p, err
}

// waitAnswering waits until the processor answers req, which for a picker
// means it has read the pool and its Pods.
func (p *process) waitAnswering(ctx context.Context, req extprocload.Request) error {
	var last error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		select {
		case err := <-p.done:
			return fmt.Errorf("%s exited (%v); its log ends:\n%s", p.name, err, childproc.Tail(p.log, 20))
		default:
		}
		if _, last = extprocload.One(ctx, p.conns[0], req); last == nil {
			return nil
		}
	}
	return fmt.Errorf("%s did not answer within 60 s, the last attempt: %v; its log ends:\n%s", p.name, last, childproc.Tail(p.log, 20))
}

// pause stops the process (SIGSTOP) until resume.
func (p *process) pause() error { return p.cmd.Process.Signal(syscall.SIGSTOP) }

// resume continues a paused process (SIGCONT).
func (p *process) resume() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

func (p *process) cpu() (time.Duration, error) { return childproc.CPUTime(p.cmd.Process.Pid) }

func (p *process) rss() (int64, error) { return childproc.RSS(p.cmd.Process.Pid) }

// stop closes the connections and stops the process, killing it if it
// has not stopped 10 s after an interrupt.
func (p *process) stop() {
	extprocload.Close(p.conns)
	_ = p.resume()
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
