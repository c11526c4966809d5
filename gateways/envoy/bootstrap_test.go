package envoy

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/infergate/infergate/gateways/internal/xdsbuild"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// validateAll runs Envoy's proto validation on m and on every message
// packed in an Any inside it, at any depth: Validate on the bootstrap
// alone stops at the typed configs.
func validateAll(t *testing.T, m proto.Message) {
	t.Helper()
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			t.Fatalf("%s: %v", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var walk func(protoreflect.Message)
	walk = func(rm protoreflect.Message) {
		if a, ok := rm.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				t.Fatalf("unpack %s: %v", a.GetTypeUrl(), err)
			}
			validateAll(t, inner)
			return
		}
		rm.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range v.List().Len() {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message())
					return true
				})
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				walk(v.Message())
			}
			return true
		})
	}
	walk(m.ProtoReflect())
}

func twoPools() Config {
	return Config{
		Payload: &Processor{Address: "infergate-payload.infergate.svc.cluster.local:9004"},
		Pools: []Pool{
			{Name: "llama", Picker: Processor{Address: "llama-epp.models.svc.cluster.local:9002", FailOpen: true},
				Endpoints: []string{"10.0.0.1:8000", "10.0.0.2:8000"}, Models: []string{"meta-llama/Llama-3.1-8B-Instruct"}},
			// A picker without grpc.health.v1 (GAIE's by default): a
			// connect-only check.
			{Name: "qwen", Picker: Processor{Address: "qwen-epp.models.svc.cluster.local:9002", HealthCheck: xdsbuild.HealthTCP}},
		},
		ClientCert: &xdsbuild.ClientCert{ChainPEM: []byte("-----BEGIN CERTIFICATE-----\n"), KeyPEM: []byte("-----BEGIN PRIVATE KEY-----\n")},
	}
}

// TestBootstrapGolden renders two pools behind the payload processor and
// compares with the golden file (go test -update rewrites it), after
// Envoy's validation of every message.
func TestBootstrapGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"one-pool", Config{Pools: []Pool{{Name: "pool", Picker: Processor{Address: "pool-epp:9002"}}}}},
		{"two-pools", twoPools()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Bootstrap(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			validateAll(t, b)
			got, err := Marshal(b)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tc.name+".json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -update writes it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs from the rendering (go test -update rewrites it); got:\n%s", golden, got)
			}
			// The golden file reads back as the same bootstrap.
			back := &bootstrapv3.Bootstrap{}
			if err := protojson.Unmarshal(want, back); err != nil || !proto.Equal(back, b) {
				t.Fatalf("the golden file does not read back: %v", err)
			}
		})
	}
}

func TestBootstrapRefusesBadConfigs(t *testing.T) {
	pool := func(edit func(*Pool)) []Pool {
		p := Pool{Name: "pool", Picker: Processor{Address: "epp:9002"}}
		edit(&p)
		return []Pool{p}
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no pool", Config{}, "pools: at least one"},
		{"bad name", Config{Pools: pool(func(p *Pool) { p.Name = "a/b" })}, `pools[0].name: "a/b"`},
		{"picker without port", Config{Pools: pool(func(p *Pool) { p.Picker.Address = "epp" })}, "picker: address"},
		{"FailOpen without endpoints", Config{Pools: pool(func(p *Pool) { p.Picker.FailOpen = true })}, "pools[0].endpoints: a FailOpen pool"},
		{"bad endpoint", Config{Pools: pool(func(p *Pool) { p.Endpoints = []string{"10.0.0.1:0"} })}, "pools[0].endpoints[0]"},
		{"models without the payload processor", Config{Pools: pool(func(p *Pool) { p.Models = []string{"m"} })}, "pools[0].models: routing by model needs the payload processor"},
		{"catch-all not last", Config{Payload: &Processor{Address: "p:9004"}, Pools: []Pool{
			{Name: "a", Picker: Processor{Address: "a:9002"}}, {Name: "b", Picker: Processor{Address: "b:9002"}, Models: []string{"m"}},
		}}, "pools[0]: a pool without models takes every request"},
		{"duplicate names", Config{Payload: &Processor{Address: "p:9004"}, Pools: []Pool{
			{Name: "a", Picker: Processor{Address: "a:9002"}, Models: []string{"m"}}, {Name: "a", Picker: Processor{Address: "b:9002"}},
		}}, `pools[1].name: "a" is used twice`},
		{"bad listen", Config{Listen: "8080", Pools: pool(func(*Pool) {})}, "listen:"},
		{"unknown health check", Config{Pools: pool(func(p *Pool) { p.Picker.HealthCheck = "http" })}, `picker: healthCheck: "http": want grpc or tcp`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Bootstrap(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestMarshalIsStable: protojson varies its white space on purpose; the
// rendering must not, or the golden files and users' diffs would churn.
func TestMarshalIsStable(t *testing.T) {
	b, err := Bootstrap(twoPools())
	if err != nil {
		t.Fatal(err)
	}
	first, err := Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		again, _ := Marshal(b)
		if !bytes.Equal(first, again) {
			t.Fatal("two renderings of one bootstrap differ")
		}
	}
	if !json.Valid(first) {
		t.Fatal("not JSON")
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("gateway.yaml", `
listen: 0.0.0.0:8081
routeTimeout: 5m
payload: {address: "payload:9004"}
pools:
- name: llama
  picker: {address: "llama-epp:9002", failOpen: true}
  endpoints: ["10.0.0.1:8000"]
  models: [meta-llama/Llama-3.1-8B-Instruct]
- name: rest
  picker: {address: "rest-epp:9002", plaintext: true}
`)
	c, err := LoadConfig(good)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "0.0.0.0:8081" || c.RouteTimeout.Minutes() != 5 || c.Payload == nil || len(c.Pools) != 2 ||
		!c.Pools[0].Picker.FailOpen || !c.Pools[1].Picker.Plaintext {
		t.Fatalf("read %+v", c)
	}
	for _, tc := range []struct{ name, text, want string }{
		{"unknown field", "pools: []\nlisten_port: 1\n", `unknown field "listen_port"`},
		{"bad timeout", "routeTimeout: soon\npools: [{name: a, picker: {address: 'a:1'}}]\n", `routeTimeout: "soon"`},
		{"invalid pool", "pools: [{name: a, picker: {address: 'a'}}]\n", "picker: address"},
		{"missing key file", "pools: [{name: a, picker: {address: 'a:1'}}]\nclientCertificate: {certFile: /nonexistent.crt, keyFile: k}\n", "clientCertificate.certFile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := write(strings.ReplaceAll(tc.name, " ", "-")+".yaml", tc.text)
			_, err := LoadConfig(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("err = %v, want the file and %q", err, tc.want)
			}
		})
	}
}
