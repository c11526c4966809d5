package epp_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/conformance/epp"
	eppsvc "github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/extproctest/fakeproc"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/internal/testcert"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/loopback"
)

// In a child process started by TestBrokenPickersFailTheirSpecs, brokenEnv
// names the broken picker variant to run the suite against and reportEnv the
// file the ginkgo report is written to.
const (
	brokenEnv = "INFERGATE_CONFORMANCE_BROKEN"
	reportEnv = "INFERGATE_CONFORMANCE_REPORT"
)

var cfg = &epp.Config{}

var _ = epp.Register(cfg)

var _ = ReportAfterSuite("write report for the parent test", func(r Report) {
	path := os.Getenv(reportEnv)
	if path == "" {
		return
	}
	b, err := json.Marshal(r)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(path, b, 0o600)).To(Succeed())
})

// TestConformance runs the epp profile against infergate's picker, or, in a
// child process, against a broken picker variant.
func TestConformance(t *testing.T) {
	if v := os.Getenv(brokenEnv); v != "" {
		d, ok := variants[v]
		if !ok {
			t.Fatalf("unknown broken variant %q", v)
		}
		endpoints := []string{"127.0.0.11:8000", "127.0.0.12:8000", "127.0.0.13:8000"}
		*cfg = epp.Config{Address: startBroken(t, endpoints, d.defects), TLS: true, Endpoints: endpoints, Extensions: true}
	} else {
		*cfg = startInfergate(t)
	}
	RegisterFailHandler(Fail)
	RunSpecs(t, "InferencePool conformance: epp")
}

// startInfergate runs infergate's picker in-process, TLS on, over a pool
// file of three simulated model servers on distinct loopback IPs.
func startInfergate(t *testing.T) epp.Config {
	t.Helper()
	var endpoints []string
	var sb strings.Builder
	sb.WriteString("name: conformance\nendpoints:\n")
	for i := range 3 {
		name := fmt.Sprintf("sim-%d", i)
		s, err := sim.New(sim.Config{Name: name, TimeScale: 50})
		if err != nil {
			t.Fatal(err)
		}
		addr := loopback.ServeAt(t, fmt.Sprintf("127.0.0.%d:0", 21+i), s.Serve)
		endpoints = append(endpoints, addr)
		fmt.Fprintf(&sb, "- address: %s\n  name: %s\n", addr, name)
	}
	pool := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(pool, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := eppsvc.NewService(eppsvc.Config{
		Server: server.Options{GRPCAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			TLS: server.TLSOptions{Enabled: true}, DrainTimeout: 2 * time.Second},
		PoolFile:         pool,
		PoolFilePoll:     time.Second,
		MetricsStaleness: 2 * time.Second,
		Logger:           logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return epp.Config{Address: s.GRPCAddr(), TLS: true, Endpoints: endpoints, Extensions: true}
}

// defects of a broken picker.
type defects struct {
	noMetadata         bool // header only, no envoy.lb metadata
	appendHeader       bool // appends the pick to a client-sent header
	noClearRouteCache  bool
	dropFirstChunk     bool // forwards a multi-chunk body without its first chunk
	ignoreListHint     bool
	ignoreStringHint   bool
	exactMatchOnly     bool // a port-less IP in a hint matches nothing
	pickAnyWhenNoMatch bool // no 503 for a hint matching nothing
	noHealth           bool
}

var variants = map[string]struct {
	defects defects
	fail    []string // the specs that must fail, all others must pass
}{
	"metadata-spoof-comma-health": {
		defects{noMetadata: true, appendHeader: true, ignoreStringHint: true, noHealth: true},
		[]string{epp.SpecPick, epp.SpecAntiSpoof, epp.SpecSubsetComma, epp.SpecHealth},
	},
	"routecache-chunks-iponly-503": {
		defects{noClearRouteCache: true, dropFirstChunk: true, exactMatchOnly: true, pickAnyWhenNoMatch: true},
		[]string{epp.SpecClearRouteCache, epp.SpecChunkedBody, epp.SpecSubsetIPOnly, epp.SpecSubsetNoMatch, epp.SpecSubsetEmpty},
	},
	"list-hint-ignored": {
		defects{ignoreListHint: true},
		[]string{epp.SpecSubsetList, epp.SpecSubsetIPOnly, epp.SpecSubsetNoMatch, epp.SpecSubsetEmpty},
	},
}

// TestBrokenPickersFailTheirSpecs runs the suite in a child process against
// each broken picker variant and checks from the ginkgo report that exactly
// the specs covering its defects fail, each with a message naming the
// behaviour, and that every other spec passes.
func TestBrokenPickersFailTheirSpecs(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("child process")
	}
	all := []string{epp.SpecPick, epp.SpecClearRouteCache, epp.SpecChunkedBody, epp.SpecAntiSpoof, epp.SpecSubsetList,
		epp.SpecSubsetNoMatch, epp.SpecSubsetEmpty, epp.SpecSubsetComma, epp.SpecSubsetIPOnly, epp.SpecHealth}
	covered := map[string]bool{}
	for name, v := range variants {
		t.Run(name, func(t *testing.T) {
			report := filepath.Join(t.TempDir(), "report.json")
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformance$", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name, reportEnv+"="+report)
			out, err := cmd.CombinedOutput()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) {
				t.Fatalf("the suite against a broken picker must fail, got err %v\n%s", err, out)
			}
			b, err := os.ReadFile(report)
			if err != nil {
				t.Fatalf("no report: %v\n%s", err, out)
			}
			var r types.Report
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			states := map[string]types.SpecState{}
			for _, s := range r.SpecReports {
				if s.LeafNodeType == types.NodeTypeIt {
					states[s.LeafNodeText] = s.State
					if s.State == types.SpecStateFailed {
						t.Logf("%s: %s", s.LeafNodeText, s.Failure.Message)
					}
				}
			}
			for _, spec := range all {
				want := types.SpecStatePassed
				if slices.Contains(v.fail, spec) {
					want = types.SpecStateFailed
					covered[spec] = true
				}
				if states[spec] != want {
					t.Errorf("spec %q: state %v, want %v", spec, states[spec], want)
				}
			}
			if len(states) != len(all) {
				t.Errorf("report has %d specs, want %d: %v", len(states), len(all), states)
			}
		})
	}
	for _, spec := range all {
		if !covered[spec] {
			t.Errorf("no broken variant makes spec %q fail", spec)
		}
	}
}

// startBroken serves a scripted picker with the given defects on TLS.
func startBroken(t *testing.T, endpoints []string, d defects) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cert := testcert.NewCA(t, "broken-epp").Server(t)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	extprocv3.RegisterExternalProcessorServer(gs, &brokenPicker{endpoints: endpoints, d: d})
	if !d.noHealth {
		hs := health.NewServer()
		hs.SetServingStatus(epp.ExtProcHealthService, healthpb.HealthCheckResponse_SERVING)
		healthpb.RegisterHealthServer(gs, hs)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

type brokenPicker struct {
	extprocv3.UnimplementedExternalProcessorServer
	endpoints []string
	d         defects
}

func (p *brokenPicker) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	var chunks [][]byte
	var answered bool
	var hint []string
	hinted := false
	answer := func() (bool, error) {
		answered = true
		pick := p.endpoints[0]
		if hinted {
			var eligible []string
			for _, e := range p.endpoints {
				ip, _, _ := net.SplitHostPort(e)
				for _, h := range hint {
					if h == e || (!p.d.exactMatchOnly && h == ip) {
						eligible = append(eligible, e)
						break
					}
				}
			}
			switch {
			case len(eligible) > 0:
				pick = eligible[0]
			case !p.d.pickAnyWhenNoMatch:
				return false, srv.Send(fakeproc.Immediate(503, "no eligible endpoint"))
			}
		}
		cr := &extprocv3.CommonResponse{ClearRouteCache: !p.d.noClearRouteCache, HeaderMutation: fakeproc.SetHeaders(wire.DestinationEndpointKey, pick)}
		if p.d.appendHeader {
			cr.HeaderMutation.SetHeaders[0].Append = wrapperspb.Bool(true)
		}
		r := fakeproc.HeadersResp(false, cr)
		if !p.d.noMetadata {
			r.DynamicMetadata = fakeproc.LBMetadata(wire.DestinationEndpointKey, pick)
		}
		return true, srv.Send(r)
	}
	for {
		req, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch v := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if h := req.GetMetadataContext().GetFilterMetadata()[wire.SubsetHintNamespace].GetFields()[wire.SubsetKey]; h != nil {
				if l := h.GetListValue(); l != nil && !p.d.ignoreListHint {
					hinted = true
					for _, x := range l.GetValues() {
						hint = append(hint, x.GetStringValue())
					}
				}
				if sv, ok := h.GetKind().(*structpb.Value_StringValue); ok && !p.d.ignoreStringHint {
					hinted = true
					for _, e := range strings.Split(sv.StringValue, ",") {
						hint = append(hint, strings.TrimSpace(e))
					}
				}
			}
			if v.RequestHeaders.GetEndOfStream() {
				if _, err := answer(); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			if len(v.RequestBody.GetBody()) > 0 {
				chunks = append(chunks, v.RequestBody.GetBody())
			}
			if !v.RequestBody.GetEndOfStream() || answered {
				continue
			}
			ok, err := answer()
			if err != nil || !ok {
				return err
			}
			if len(chunks) == 0 {
				chunks = [][]byte{nil}
			}
			if p.d.dropFirstChunk && len(chunks) > 1 {
				chunks = chunks[1:]
			}
			for i, c := range chunks {
				if err := srv.Send(fakeproc.Streamed(false, c, i == len(chunks)-1)); err != nil {
					return err
				}
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			if err := srv.Send(fakeproc.TrailersResp(false, nil)); err != nil {
				return err
			}
		default:
			return fmt.Errorf("broken picker: unexpected message %T", v)
		}
	}
}
