// Package h2spec runs h2spec, the HTTP/2 conformance client, against the
// payload processor on both ext_proc transports (grpc-go and infergate's
// own h2), in plain text and over TLS, with stock requests (GET) and with
// gRPC-shaped ones (POST, application/grpc, te: trailers, the Process
// method's path; hack/h2spec.sh says how). The picker is served by the
// same two transports and is not run again.
//
// grpc-go is the bar: h2 must pass every case grpc-go passes, and every
// case h2 does not pass is listed below with why it cannot apply to a
// gRPC server. grpc-go's own failures are printed, not asserted: they are
// another project's to fix.
package h2spec

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/test/childproc"
	"github.com/infergate/infergate/test/gatewaytest"
)

// processPath is the method a gateway calls on an ext_proc server.
const processPath = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"

// noResponseBody are the cases that need the server to answer a request
// without a body with DATA: a gRPC call without a request message ends
// with its status alone (trailers-only), so there is no DATA to observe.
// h2spec skips the ones that measure the answer first
// (spec.ServerDataLength) and fails the others.
const noResponseBody = "needs DATA in the answer to a request without a body; a gRPC call without a request message is answered by its status alone"

// noConcurrencyLimit: the case opens the announced stream limit plus one
// with END_STREAM under a zero window and waits for the extra one to be
// refused. Both transports announce --max-streams-per-connection, but a
// gRPC call without a request message is answered by its status alone
// (HEADERS, which no window holds back) as it arrives, so the streams
// open never add up to the limit. TestPerConnectionStreamLimit
// (extproc/server) and TestMaxConcurrentStreams (extproc/h2server) test
// the refusal with streams that stay open.
const noConcurrencyLimit = "each stream, a gRPC call without a request message, is answered by its status at once, so the streams open never reach the announced limit"

// resetFirst: the case's request is a GET, which is answered at once (405,
// grpc-status INTERNAL, as grpc-go answers it) with the stream reset while
// the client may still be sending; RFC 9113 section 5.1 has frames on a
// stream the server reset ignored, so the error the case waits for for
// the frame it sends next never comes.
const resetFirst = "the GET was answered 405 and its stream reset before the frame under test, which RFC 9113 section 5.1 then has ignored"

// notApplicable are the cases h2 may fail or skip, with why; the stock
// shape (GET) adds stockNotApplicable.
var notApplicable = map[string]string{
	"generic/2/2":   noResponseBody,
	"generic/2/3":   noResponseBody,
	"http2/6.5.3/1": noResponseBody,
	"http2/6.9.1/1": noResponseBody,
	"http2/6.9.2/1": noResponseBody,
	"http2/6.9.2/2": noResponseBody,
	"http2/5.1.2/1": noConcurrencyLimit,
}

var stockNotApplicable = map[string]string{
	"http2/5.1/8":     resetFirst,
	"http2/6.9.1/3":   resetFirst,
	"http2/8.1.2.6/1": resetFirst,
	"http2/8.1.2.6/2": resetFirst,
}

// whyNot says why case id cannot pass on a gRPC server with requests of
// shape, if it is listed.
func whyNot(shape, id string) (string, bool) {
	if why, ok := notApplicable[id]; ok {
		return why, true
	}
	why, ok := stockNotApplicable[id]
	return why, ok && shape == "stock"
}

// run is one h2spec run: a transport, TLS or not, a request shape.
type run struct {
	transport string // grpc or h2
	tls       bool
	shape     string // grpc or stock
}

func (r run) name() string {
	sec := "plain"
	if r.tls {
		sec = "tls"
	}
	return r.transport + "/" + sec + "/" + r.shape
}

// outcome is a case's result: pass, fail or skip, and h2spec's message.
type outcome struct {
	result, detail, title string
}

func TestH2spec(t *testing.T) {
	h2spec := gatewaytest.Built(t, "INFERGATE_H2SPEC", "h2spec.sh")
	bin := childproc.Command(t, "infergate")
	var runs []run
	for _, transport := range []string{"grpc", "h2"} {
		for _, tls := range []bool{false, true} {
			for _, shape := range []string{"grpc", "stock"} {
				runs = append(runs, run{transport, tls, shape})
			}
		}
	}
	// The runs wait on h2spec's per-case timeout far more than they
	// compute: all of them at once (t.Parallel would run GOMAXPROCS).
	addrs := make([]string, len(runs))
	for i, r := range runs {
		addrs[i] = startPayload(t, bin, r)
	}
	results := make([]map[string]outcome, len(runs))
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() { results[i], errs[i] = h2specRun(h2spec, addrs[i], r) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", runs[i].name(), err)
		}
	}
	if t.Failed() {
		return
	}

	var table strings.Builder
	fmt.Fprintf(&table, "| transport | TLS | requests | cases | passed | skipped | failed |\n|---|---|---|---:|---:|---:|---:|\n")
	byName := map[string]map[string]outcome{}
	for i, r := range runs {
		byName[r.name()] = results[i]
		n := map[string]int{}
		for _, o := range results[i] {
			n[o.result]++
		}
		fmt.Fprintf(&table, "| %s | %t | %s | %d | %d | %d | %d |\n", r.transport, r.tls, r.shape, len(results[i]), n["pass"], n["skip"], n["fail"])
	}
	t.Logf("h2spec against the payload processor (strict cases included):\n%s", table.String())

	for _, r := range runs {
		if r.transport != "h2" {
			continue
		}
		ours := byName[r.name()]
		bar := byName[run{"grpc", r.tls, r.shape}.name()]
		var listed []string
		for _, id := range sortedIDs(ours) {
			o := ours[id]
			if o.result == "pass" {
				continue
			}
			if _, ok := whyNot(r.shape, id); ok {
				listed = append(listed, o.result+" "+id)
			} else {
				t.Errorf("%s: %s %s (%s): %s", r.name(), o.result, id, o.title, o.detail)
			}
			if bar[id].result == "pass" {
				t.Errorf("%s: %s %s (%s), which grpc-go passes: %s", r.name(), o.result, id, o.title, o.detail)
			}
		}
		for _, id := range sortedIDs(bar) {
			if _, ok := ours[id]; !ok {
				t.Errorf("%s: case %s ran against grpc-go but not against h2", r.name(), id)
			}
		}
		t.Logf("%s, not applicable (listed with why in this file): %s", r.name(), strings.Join(listed, ", "))
	}
	for _, r := range runs {
		if r.transport != "grpc" {
			continue
		}
		var failed []string
		for _, id := range sortedIDs(byName[r.name()]) {
			if o := byName[r.name()][id]; o.result == "fail" {
				failed = append(failed, id)
			}
		}
		t.Logf("grpc-go (the bar, not asserted), %s fails %d: %s", r.name(), len(failed), strings.Join(failed, " "))
	}
}

// h2specRun runs h2spec (every case, strict ones too) against the
// processor at addr; it returns each case's outcome by id
// (package/position, e.g. http2/5.1/8).
func h2specRun(h2spec, addr string, r run) (map[string]outcome, error) {
	host, port, _ := net.SplitHostPort(addr)
	dir, err := os.MkdirTemp("", "h2spec")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	report := filepath.Join(dir, "report.xml")
	args := []string{"--host", host, "--port", port, "--path", processPath, "--strict", "--timeout", "2", "--junit-report", report}
	if r.tls {
		args = append(args, "--tls", "--insecure")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h2spec, args...)
	cmd.Env = os.Environ()
	if r.shape == "grpc" {
		cmd.Env = append(cmd.Env, "H2SPEC_GRPC=1")
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) { // 1: some case failed
		return nil, fmt.Errorf("h2spec %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	results, err := readReport(report)
	if err != nil {
		return nil, fmt.Errorf("%w\nh2spec's output:\n%s", err, out)
	}
	if len(results) < 146 {
		return nil, fmt.Errorf("h2spec ran %d cases, fewer than the 146 of v2.2.1:\n%s", len(results), out)
	}
	return results, nil
}

// startPayload runs `infergate payload` on free loopback ports until the
// test ends and returns its ext_proc address once it reports ready.
func startPayload(t *testing.T, bin string, r run) string {
	t.Helper()
	p, err := childproc.StartProcessor(context.Background(), childproc.ProcessorConfig{Binary: bin, Command: "payload",
		Args: []string{"--extproc-transport", r.transport}, TLS: r.tls, Log: filepath.Join(t.TempDir(), "payload.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(40 * time.Second) }) // past the 30 s drain
	return p.GRPCAddr
}

// junit is the part of h2spec's JUnit report read here.
type junit struct {
	Suites []struct {
		Package string `xml:"package,attr"`
		Cases   []struct {
			Title   string    `xml:"classname,attr"`
			Failure *xmlText  `xml:"failure"`
			Error   *xmlText  `xml:"error"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

type xmlText struct {
	Text string `xml:",chardata"`
}

// readReport reads h2spec's JUnit report: each case by its suite's
// package and its position in the suite, as h2spec numbers them.
func readReport(path string) (map[string]outcome, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("h2spec's report: %w", err)
	}
	var rep junit
	if err := xml.Unmarshal(raw, &rep); err != nil {
		return nil, fmt.Errorf("h2spec's report %s: %w", path, err)
	}
	results := map[string]outcome{}
	for _, s := range rep.Suites {
		for i, c := range s.Cases {
			o := outcome{result: "pass", title: c.Title}
			switch {
			case c.Failure != nil:
				o.result, o.detail = "fail", c.Failure.Text
			case c.Error != nil:
				o.result, o.detail = "fail", c.Error.Text
			case c.Skipped != nil:
				o.result = "skip"
			}
			o.detail = strings.Join(strings.Fields(o.detail), " ")
			results[fmt.Sprintf("%s/%d", s.Package, i+1)] = o
		}
	}
	return results, nil
}

func sortedIDs(m map[string]outcome) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
