package epp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/conformance/epp"
	"github.com/infergate/infergate/conformance/internal/brokentest"
	"github.com/infergate/infergate/conformance/internal/reportdir"
	"github.com/infergate/infergate/conformance/report"
	"github.com/infergate/infergate/envoysim/fakeproc"
	eppsvc "github.com/infergate/infergate/extproc/epp"
	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/wire"
	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/loopback"
)

var cfg = &epp.Config{}

var _ = epp.Register(cfg)

var _ = ReportAfterSuite("write report for the parent test", func(r Report) {
	Expect(brokentest.WriteReport(r)).To(Succeed())
})

// The upstream-format report of a run against infergate's picker, for make
// conformance-reports (nothing is written without $INFERGATE_CONFORMANCE_REPORTS).
var _ = ReportAfterSuite("upstream-format report", func(r Report) {
	if brokentest.Variant() == "" {
		Expect(reportdir.Write("infergate-epp", report.Profile(report.EPPProfile, r, "epp"))).To(Succeed())
	}
})

// TestConformance runs the epp profile against infergate's picker, or, in a
// child process, against a broken picker variant.
func TestConformance(t *testing.T) {
	if v := brokentest.Variant(); v != "" {
		d, ok := variants[v]
		if !ok {
			t.Fatalf("unknown broken variant %q", v)
		}
		endpoints := []string{"127.0.0.11:8000", "127.0.0.12:8000", "127.0.0.13:8000"}
		*cfg = epp.Config{Address: startBroken(t, endpoints, d.defects), TLS: true, Endpoints: endpoints, Extensions: true,
			MaxBodyBytes: bodyLimit}
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
			TLS: server.TLSOptions{Enabled: true}, DrainTimeout: 2 * time.Second, Limits: server.Limits{MaxRequestBodyBytes: bodyLimit}},
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
	return epp.Config{Address: s.GRPCAddr(), TLS: true, Endpoints: endpoints, Extensions: true, MaxBodyBytes: bodyLimit}
}

// bodyLimit is the request body limit the pickers under test are given.
const bodyLimit = 256 << 10

// defects of a broken picker.
type defects struct {
	noMetadata          bool // header only, no envoy.lb metadata
	appendHeader        bool // appends the pick to a client-sent header
	noClearRouteCache   bool
	dropFirstChunk      bool // forwards a multi-chunk body without its first chunk
	ignoreListHint      bool
	ignoreStringHint    bool
	exactMatchOnly      bool // a port-less IP in a hint matches nothing
	pickAnyWhenNoMatch  bool // no 503 for a hint matching nothing
	noHealth            bool
	noLivenessReadiness bool // health for the ext_proc service only
	bodilessRefused     bool // 400 for a request without a body
	oneChunk            bool // hands the body back in one chunk, whatever its size
	pickMalformed       bool // picks for malformed JSON
	noSizeLimit         bool // picks for a body over bodyLimit
}

var variants = map[string]struct {
	defects defects
	fail    []string // the specs that must fail, all others must pass
}{
	"metadata-spoof-comma-health": {
		defects{noMetadata: true, appendHeader: true, ignoreStringHint: true, noHealth: true},
		[]string{epp.SpecPick, epp.SpecAntiSpoof, epp.SpecSubsetComma, epp.SpecHealth, epp.SpecHealthServices},
	},
	"bodiless-chunk-json-limit-liveness": {
		defects{bodilessRefused: true, oneChunk: true, pickMalformed: true, noSizeLimit: true, noLivenessReadiness: true},
		[]string{epp.SpecBodiless, epp.SpecLargeBody, epp.SpecMalformedJSON, epp.SpecTooLarge, epp.SpecHealthServices},
	},
	"routecache-chunks-iponly-503": {
		defects{noClearRouteCache: true, dropFirstChunk: true, exactMatchOnly: true, pickAnyWhenNoMatch: true},
		[]string{epp.SpecClearRouteCache, epp.SpecChunkedBody, epp.SpecLargeBody, epp.SpecSubsetIPOnly, epp.SpecSubsetNoMatch, epp.SpecSubsetEmpty},
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
	all := []string{epp.SpecPick, epp.SpecClearRouteCache, epp.SpecChunkedBody, epp.SpecAntiSpoof, epp.SpecSubsetList,
		epp.SpecSubsetNoMatch, epp.SpecSubsetEmpty, epp.SpecSubsetComma, epp.SpecSubsetIPOnly, epp.SpecHealth,
		epp.SpecHealthServices, epp.SpecBodiless, epp.SpecLargeBody, epp.SpecMalformedJSON, epp.SpecTooLarge}
	fail := map[string][]string{}
	for name, v := range variants {
		fail[name] = v.fail
	}
	brokentest.Check(t, all, fail)
}

// startBroken serves a scripted picker with the given defects on TLS.
func startBroken(t *testing.T, endpoints []string, d defects) string {
	t.Helper()
	var health []string
	switch {
	case d.noHealth:
	case d.noLivenessReadiness:
		health = []string{epp.ExtProcHealthService}
	default:
		health = []string{epp.ExtProcHealthService, epp.LivenessHealthService, epp.ReadinessHealthService}
	}
	return brokentest.Serve(t, func(gs *grpc.Server) {
		extprocv3.RegisterExternalProcessorServer(gs, &brokenPicker{endpoints: endpoints, d: d})
	}, health...)
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
				if p.d.bodilessRefused {
					return srv.Send(fakeproc.Immediate(400, "a body is required"))
				}
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
			whole := bytes.Join(chunks, nil)
			switch {
			case len(whole) > bodyLimit && !p.d.noSizeLimit:
				return srv.Send(fakeproc.Immediate(413, "request body too large"))
			case !json.Valid(whole) && !p.d.pickMalformed:
				return srv.Send(fakeproc.Immediate(400, "malformed JSON"))
			}
			ok, err := answer()
			if err != nil || !ok {
				return err
			}
			if p.d.oneChunk {
				chunks = [][]byte{whole}
			}
			if err := brokentest.SendBody(srv, chunks, p.d.dropFirstChunk); err != nil {
				return err
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
