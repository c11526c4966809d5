package grpcjs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

// jsEnv is where grpc-js and node are: the folder hack/grpcjs.sh prints,
// whose node_modules holds @grpc/grpc-js.
type jsEnv struct {
	node     string
	modules  string // NODE_PATH
	driverJS string
}

// findJS locates node, grpc-js (from $INFERGATE_GRPCJS, else by running
// hack/grpcjs.sh, which installs it once) and the driver. A missing piece
// fails the test with the reason: the test never passes without running.
func findJS(t *testing.T) jsEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := moduleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("INFERGATE_GRPCJS")
	if dir == "" {
		cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "grpcjs.sh"))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("hack/grpcjs.sh (installs @grpc/grpc-js; set INFERGATE_GRPCJS to an installed copy instead): %v\n%s", err, stderr.String())
		}
		dir = strings.TrimSpace(string(out))
	}
	env := jsEnv{modules: filepath.Join(dir, "node_modules"), driverJS: filepath.Join(root, "test", "grpcjs", "driver.js")}
	if _, err := os.Stat(filepath.Join(env.modules, "@grpc", "grpc-js", "package.json")); err != nil {
		t.Fatalf("@grpc/grpc-js is not installed under %s (INFERGATE_GRPCJS or hack/grpcjs.sh): %v", dir, err)
	}
	if env.node, err = exec.LookPath("node"); err != nil {
		t.Fatalf("node is needed to run grpc-js (hack/grpcjs.sh installs Debian's nodejs): %v", err)
	}
	cmd := exec.CommandContext(ctx, env.node, "-p", `"node " + process.version + ", nghttp2 " + process.versions.nghttp2 + ", @grpc/grpc-js " + require("@grpc/grpc-js/package.json").version`)
	cmd.Env = append(os.Environ(), "NODE_PATH="+env.modules)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node cannot load @grpc/grpc-js from %s: %v\n%s", env.modules, err, out)
	}
	t.Logf("client: %s", strings.TrimSpace(string(out)))
	return env
}

// event is one line of the driver's output.
type event struct {
	Ev       string            `json:"ev"`
	ID       int               `json:"id"`
	B64      []byte            `json:"b64"` // encoding/json reads base64 into []byte
	Code     int               `json:"code"`
	Details  string            `json:"details"`
	Metadata map[string]string `json:"metadata"`
	MS       float64           `json:"ms"`
	State    string            `json:"state"`
	Text     string            `json:"text"`
}

// command is one line of the driver's input.
type command struct {
	Op         string `json:"op"`
	ID         int    `json:"id"`
	B64        []byte `json:"b64,omitempty"`
	DeadlineMS int64  `json:"deadline_ms,omitempty"`
}

// driver is one node process running driver.js: one grpc-js channel.
type driver struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	stderr *lockedBuffer

	mu        sync.Mutex
	enc       *json.Encoder
	nextID    int
	streams   map[int]*jsStream
	states    []event
	logs      []string
	done      bool // the driver said every stream ended after stdin closed
	exitedNow bool // the process is gone: streams opened now end at once
	readErr   error
}

// driverConfig is the channel the driver opens.
type driverConfig struct {
	Target  string         `json:"target"`
	TLS     bool           `json:"tls"`
	Options map[string]any `json:"options,omitempty"`
	// Trace turns on grpc-js tracers (GRPC_TRACE), whose lines come back
	// as log events.
	Trace string `json:"-"`
}

// startDriver runs the driver against cfg until the test ends.
func startDriver(t *testing.T, js jsEnv, cfg driverConfig) (*driver, error) {
	arg, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(js.node, js.driverJS, string(arg))
	cmd.Env = append(os.Environ(), "NODE_PATH="+js.modules)
	if cfg.Trace != "" {
		cmd.Env = append(cmd.Env, "GRPC_TRACE="+cfg.Trace, "GRPC_VERBOSITY=DEBUG")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	d := &driver{cmd: cmd, exited: make(chan struct{}), stderr: &lockedBuffer{}, streams: map[int]*jsStream{}}
	cmd.Stderr = d.stderr
	if d.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	d.enc = json.NewEncoder(d.stdin)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node %s: %w", js.driverJS, err)
	}
	go d.read(stdout)
	t.Cleanup(func() {
		_ = d.stdin.Close()
		select {
		case <-d.exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-d.exited
		}
	})
	return d, nil
}

func (d *driver) read(stdout io.Reader) {
	defer close(d.exited)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			d.fail(fmt.Errorf("driver output %q: %w", sc.Text(), err))
			continue
		}
		d.mu.Lock()
		switch ev.Ev {
		case "headers", "msg", "status":
			s := d.streams[ev.ID]
			d.mu.Unlock()
			if s != nil {
				s.events <- ev
			}
			continue
		case "state":
			d.states = append(d.states, ev)
		case "log":
			d.logs = append(d.logs, ev.Text)
		case "done":
			d.done = true
		}
		d.mu.Unlock()
	}
	if err := sc.Err(); err != nil {
		d.fail(fmt.Errorf("reading the driver: %w", err))
	}
	_ = d.cmd.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.exitedNow = true
	for _, s := range d.streams {
		close(s.gone)
	}
}

func (d *driver) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.readErr = errors.Join(d.readErr, err)
}

func (d *driver) send(c command) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.enc.Encode(c); err != nil {
		return fmt.Errorf("driver stdin: %w (stderr: %s)", err, d.stderr.String())
	}
	return nil
}

// close ends the driver's input and waits for it to exit: it closes its
// channel once every stream has ended. It reports whether it said so.
func (d *driver) close(ctx context.Context) error {
	_ = d.stdin.Close()
	select {
	case <-d.exited:
	case <-ctx.Done():
		return fmt.Errorf("the driver did not exit: %w", ctx.Err())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.done {
		return fmt.Errorf("the driver exited without finishing (%v); stderr:\n%s", d.cmd.ProcessState, d.stderr.String())
	}
	return d.readErr
}

// stateLog is the channel's connectivity states in order.
func (d *driver) stateLog() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, len(d.states))
	for i, s := range d.states {
		out[i] = s.State
	}
	return out
}

// logLines are the grpc-js log lines so far that contain substr.
func (d *driver) logLines(substr string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, l := range d.logs {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// waitLog waits until n log lines contain substr.
func (d *driver) waitLog(ctx context.Context, substr string, n int) error {
	for len(d.logLines(substr)) < n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d grpc-js log lines with %q (have %d): %w", n, substr, len(d.logLines(substr)), ctx.Err())
		case <-d.exited:
			return fmt.Errorf("the driver exited while waiting for %q: %s", substr, d.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// jsStream is one Process call of the driver.
type jsStream struct {
	d      *driver
	id     int
	events chan event
	gone   chan struct{} // the driver exited
}

// open starts a Process call, with a grpc-js deadline when deadline > 0.
func (d *driver) open(deadline time.Duration) (*jsStream, error) {
	d.mu.Lock()
	d.nextID++
	// Room for every message a stream can be answered with here, so the
	// reader never waits on one stream.
	s := &jsStream{d: d, id: d.nextID, events: make(chan event, 256), gone: make(chan struct{})}
	d.streams[s.id] = s
	if d.exitedNow {
		close(s.gone)
	}
	d.mu.Unlock()
	return s, d.send(command{Op: "open", ID: s.id, DeadlineMS: deadline.Milliseconds()})
}

func (s *jsStream) send(m proto.Message) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return err
	}
	return s.d.send(command{Op: "send", ID: s.id, B64: b})
}

func (s *jsStream) end() error    { return s.d.send(command{Op: "end", ID: s.id}) }
func (s *jsStream) cancel() error { return s.d.send(command{Op: "cancel", ID: s.id}) }

// next is the stream's next event: a message or its status.
func (s *jsStream) next(ctx context.Context) (event, error) {
	select {
	case ev := <-s.events:
		return ev, nil
	case <-s.gone:
		select {
		case ev := <-s.events:
			return ev, nil
		default:
		}
		return event{}, fmt.Errorf("stream %d: the driver exited: %s", s.id, s.d.stderr.String())
	case <-ctx.Done():
		return event{}, fmt.Errorf("stream %d: %w", s.id, ctx.Err())
	}
}

// lockedBuffer is the driver's stderr, written by exec's copying goroutine
// while the test may read it for an error message.
type lockedBuffer struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}
