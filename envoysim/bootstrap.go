package envoysim

import (
	"errors"
	"fmt"
	"os"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	// Types a bootstrap's typed_config may name that the rest of the
	// package does not import, registered so that LoadBootstrap can parse
	// them: the pass-through listener and HTTP filters, and what plain-Envoy
	// bootstraps put in fields the stand-in ignores (access loggers, HTTP
	// protocol options). The build decides whether each is accepted.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/grpc_stats/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// LoadBootstrap reads an Envoy bootstrap file, YAML or JSON (what
// `envoy -c` takes, typed_config entries with their "@type"), and checks it
// with the generated validation Envoy's own proto constraints come from.
// Every error names the file. Whether the stand-in can serve it is decided
// by NewNode and Run.
func LoadBootstrap(path string) (*bootstrapv3.Bootstrap, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("bootstrap %s: YAML: %w", path, err)
	}
	bs := &bootstrapv3.Bootstrap{}
	// protojson resolves "@type" from the registered types; unknown fields
	// are errors. Its positions are in the JSON form of the file.
	if err := protojson.Unmarshal(js, bs); err != nil {
		return nil, fmt.Errorf("bootstrap %s (as JSON): %w", path, err)
	}
	if err := bs.Validate(); err != nil {
		return nil, fmt.Errorf("bootstrap %s: %w", path, err)
	}
	return bs, nil
}

// staticResources reads a bootstrap as the stand-in serves it: its
// static_resources listeners and clusters (route configurations travel
// inline in the connection managers), under the same field rules as xDS
// resources (xdsRules). It checks the bootstrap itself; the resources are
// checked when they are built.
func staticResources(bs *bootstrapv3.Bootstrap) (*resources, error) {
	if err := checkFields("bootstrap", bs); err != nil {
		return nil, err
	}
	if bs.GetDynamicResources() != nil {
		return nil, errors.New("bootstrap: dynamic_resources: use --xds-server (NodeConfig.XDS); the stand-in does not mix a bootstrap with xDS")
	}
	sr := bs.GetStaticResources()
	if err := checkAll("bootstrap static_resources", sr); err != nil {
		return nil, err
	}
	if len(sr.GetSecrets()) > 0 {
		return nil, errors.New("bootstrap: static_resources.secrets: secrets are not implemented by the stand-in (a client certificate goes inline in the cluster's transport_socket tls_certificates)")
	}
	res := &resources{
		listeners: map[string]*listenerv3.Listener{}, routes: map[string]*routev3.RouteConfiguration{},
		clusters: map[string]*clusterv3.Cluster{}, endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
		side: map[string]map[string]*endpointv3.ClusterLoadAssignment{},
	}
	for i, l := range sr.GetListeners() {
		if _, dup := res.listeners[l.GetName()]; dup {
			return nil, fmt.Errorf("bootstrap: static_resources.listeners[%d]: listener %q is defined twice", i, l.GetName())
		}
		res.listeners[l.GetName()] = l
	}
	for i, c := range sr.GetClusters() {
		if _, dup := res.clusters[c.GetName()]; dup {
			return nil, fmt.Errorf("bootstrap: static_resources.clusters[%d]: cluster %q is defined twice", i, c.GetName())
		}
		res.clusters[c.GetName()] = c
	}
	return res, nil
}
