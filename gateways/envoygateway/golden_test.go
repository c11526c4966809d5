package envoygateway

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestTranslationGolden keeps what the extension adds to Envoy Gateway's
// translation (a pool's route, cluster and filter, the payload processor,
// the client certificate) in a golden file per shape, so that a change to
// the rendered xDS is seen in review: go test -update rewrites them.
func TestTranslationGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"pool", Config{}},
		{"pool-eds-payload-clientcert", Config{
			EDS:        &EDSServer{Address: "infergate-egext.infergate.svc.cluster.local:5005", TLS: true},
			Payload:    &Payload{Address: "infergate-payload.infergate.svc.cluster.local:9004", TLS: true},
			ClientCert: &ClientCert{ChainPEM: []byte("-----BEGIN CERTIFICATE-----\n"), KeyPEM: []byte("-----BEGIN PRIVATE KEY-----\n")},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, l, rc, nc := poolTranslation(t, "10.0.0.1:8000", "10.0.0.2:8000")
			clusters, listeners, err := ModifyTranslation(context.Background(), []*clusterv3.Cluster{nc}, []*listenerv3.Listener{l}, []*routev3.RouteConfiguration{rc}, tc.cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			var docs []json.RawMessage
			for _, m := range append(append([]proto.Message{rc}, asMessages(clusters)...), asMessages(listeners)...) {
				raw, err := protojson.Marshal(m)
				if err != nil {
					t.Fatal(err)
				}
				docs = append(docs, raw)
			}
			all, err := json.Marshal(docs)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			// protojson varies its spacing on purpose: indent afresh.
			if err := json.Indent(&got, all, "", "  "); err != nil {
				t.Fatal(err)
			}
			got.WriteByte('\n')
			golden := filepath.Join("testdata", tc.name+".json")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -update writes it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("%s differs from the translation (go test -update rewrites it); got:\n%s", golden, got.Bytes())
			}
		})
	}
}

func asMessages[M proto.Message](ms []M) []proto.Message {
	out := make([]proto.Message, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}
