package envoysim

import (
	"encoding/base64"
	"fmt"
	"strings"

	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// Filters of Istio's own proxy (istio/proxy) that istiod puts in a
// gateway's configuration. Their config types have no Go package here;
// Istio sends most of them as TypedStructs.

const (
	udpaTypedStructType = "type.googleapis.com/udpa.type.v1.TypedStruct"
	xdsTypedStructType  = "type.googleapis.com/xds.type.v3.TypedStruct"
)

// typedStruct unwraps a TypedStruct (udpa.type.v1 or xds.type.v3; both
// are type_url = 1, value = 2): the type it stands for and its value. Any
// other config is returned as its own type URL with a nil value. The
// message is decoded by hand: its Go package is not a dependency here.
func typedStruct(where string, a *anypb.Any) (string, *structpb.Struct, error) {
	switch a.GetTypeUrl() {
	case udpaTypedStructType, xdsTypedStructType:
	default:
		return a.GetTypeUrl(), nil, nil
	}
	name := a.GetTypeUrl()[strings.LastIndexByte(a.GetTypeUrl(), '/')+1:]
	var url string
	value := &structpb.Struct{}
	b := a.GetValue()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", nil, fmt.Errorf("%s: %s: %w", where, name, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			return "", nil, fmt.Errorf("%s: %s field %d is not interpreted by the stand-in", where, name, num)
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return "", nil, fmt.Errorf("%s: %s: %w", where, name, protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 {
			url = string(v)
			continue
		}
		if err := proto.Unmarshal(v, value); err != nil {
			return "", nil, fmt.Errorf("%s: %s.value: %w", where, name, err)
		}
	}
	if !strings.Contains(url, "/") {
		url = "type.googleapis.com/" + url
	}
	return url, value, nil
}

// typeURLOf names a config in messages: the type it stands for, and the
// TypedStruct around it if there is one.
func typeURLOf(a *anypb.Any, inner string) string {
	if a.GetTypeUrl() == inner {
		return inner
	}
	return inner + " (in a TypedStruct)"
}

// passThroughFilter is an HTTP filter that, as configured, passes every
// request and response unchanged; the stand-in leaves it out of the chain.
type passThroughFilter struct {
	reason string
	// config, when set, makes the filter pass-through only with an empty
	// config: any field set is a NACK, since the filter would act.
	config func() proto.Message
}

// passThroughHTTPFilters by config type URL. Their per-route configs are
// NACKed (hcmBuild.route). Read-only.
var passThroughHTTPFilters = map[string]passThroughFilter{
	"type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig": {
		reason: "statistics, and filter state for access logs (emit_filter_state); requests and responses pass unchanged",
	},
	"type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors": {
		reason: "acts only on routes with a CORS policy (VirtualHost and RouteAction cors, per-route configs: NACKed)",
		config: func() proto.Message { return &corsv3.Cors{} },
	},
	"type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault": {
		reason: "without delay, abort or response_rate_limit it injects no fault (per-route configs: NACKed)",
		config: func() proto.Message { return &faultv3.HTTPFault{} },
	},
	// istio.alpn sets the ALPN offered by TLS handshakes of the request's
	// upstream connections (for Istio mTLS to sidecars).
	"type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig": {
		reason: "sets the ALPN of upstream TLS handshakes; the stand-in routes to plaintext hosts only (a routed host with TLS is NACKed, one needing an SDS secret fails before any handshake)",
	},
	// istio.stats: Istio's request metrics.
	"type.googleapis.com/stats.PluginConfig": {
		reason: "records metrics; it changes no request or response",
	},
}

// checkPassThrough NACKs the config of a pass-through filter that would act.
func checkPassThrough(where string, pt passThroughFilter, a *anypb.Any, v *structpb.Struct) error {
	if pt.config == nil {
		return nil
	}
	if v != nil {
		if len(v.GetFields()) > 0 {
			return fmt.Errorf("%s: a TypedStruct config that sets fields is not implemented by the stand-in for this filter", where)
		}
		return nil
	}
	m := pt.config()
	if err := a.UnmarshalTo(m); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return checkFields(where, m)
}

// Istio's HTTP metadata exchange: io.istio.http.peer_metadata.Config
// (istio/proxy source/extensions/filters/http/peer_metadata), named
// istio.metadata_exchange in a gateway's chain.
const (
	peerMetadataType = "type.googleapis.com/io.istio.http.peer_metadata.Config"
	// The headers it exchanges (Headers::get().ExchangeMetadataHeader, ...Id).
	peerMetadataHeader   = "x-envoy-peer-metadata"
	peerMetadataIDHeader = "x-envoy-peer-metadata-id"
)

// nodeInfo is the local node as the filters see it (Envoy's LocalInfo).
type nodeInfo struct {
	id       string
	metadata *structpb.Struct
}

// peerMetadataFilter is Istio's peer_metadata HTTP filter. On the request
// path (decodeHeaders), downstream discovery by istio_headers notes and
// removes the client's exchange headers, then upstream propagation sets
// them to this node's: the id is Node.id, the value the base64 of the
// node's workload metadata as a deterministically serialised Struct
// (peerMetadataValue). On the response path (encodeHeaders), upstream
// discovery by istio_headers removes the upstream's exchange headers, then
// downstream propagation answers a client that sent them with this
// node's. workload_discovery only sets filter state for telemetry (and the
// stand-in has no workload metadata to find a peer in); discovered peers
// only feed telemetry. Propagation skips clusters whose istio metadata
// says disable_mx, or, with skip_external_clusters, external (or the
// PassthroughCluster).
type peerMetadataFilter struct {
	downstreamDiscovery bool // istio_headers in downstream_discovery
	upstreamDiscovery   bool // istio_headers in upstream_discovery
	// upstream and downstream propagation by istio_headers: one entry per
	// method, its skip_external_clusters.
	upstreamPropagation   []bool
	downstreamPropagation []bool
	id, value             string
}

// peerCtx is what one request's downstream discovery saw.
type peerCtx struct {
	idReceived, valueReceived bool
}

// peerMetadataConfig reads the filter's config from its TypedStruct value.
func peerMetadataConfig(where string, v *structpb.Struct, node nodeInfo) (*peerMetadataFilter, error) {
	f := &peerMetadataFilter{id: node.id}
	labels := map[string]bool{}
	for k, val := range v.GetFields() {
		fw := where + "." + k
		var err error
		switch k {
		case "downstream_discovery", "downstreamDiscovery":
			f.downstreamDiscovery, err = peerDiscovery(fw, val)
		case "upstream_discovery", "upstreamDiscovery":
			f.upstreamDiscovery, err = peerDiscovery(fw, val)
		case "downstream_propagation", "downstreamPropagation":
			f.downstreamPropagation, err = peerPropagation(fw, val)
		case "upstream_propagation", "upstreamPropagation":
			f.upstreamPropagation, err = peerPropagation(fw, val)
		case "shared_with_upstream", "sharedWithUpstream":
			// Shares the discovered peer's filter state with the upstream
			// connection, for telemetry.
		case "additional_labels", "additionalLabels":
			for _, l := range val.GetListValue().GetValues() {
				labels[l.GetStringValue()] = true
			}
		default:
			err = fmt.Errorf("%s: peer_metadata Config.%s is not implemented by the stand-in", where, k)
		}
		if err != nil {
			return nil, err
		}
	}
	if len(f.upstreamPropagation)+len(f.downstreamPropagation) > 0 {
		if node.id == "" {
			return nil, fmt.Errorf("%s: propagation sends the node's id, and this node has none", where)
		}
		v, err := peerMetadataValue(node.metadata, labels)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		f.value = v
	}
	return f, nil
}

// peerMethod reads one DiscoveryMethod or PropagationMethod: a struct
// with one method key.
func peerMethod(where string, m *structpb.Value) (string, *structpb.Struct, error) {
	s := m.GetStructValue()
	if s == nil || len(s.GetFields()) != 1 {
		return "", nil, fmt.Errorf("%s: want one method per entry", where)
	}
	for k, v := range s.GetFields() {
		return k, v.GetStructValue(), nil
	}
	return "", nil, nil
}

func peerDiscovery(where string, list *structpb.Value) (bool, error) {
	istioHeaders := false
	for i, m := range list.GetListValue().GetValues() {
		mw := fmt.Sprintf("%s[%d]", where, i)
		k, cfg, err := peerMethod(mw, m)
		if err != nil {
			return false, err
		}
		switch k {
		case "istio_headers", "istioHeaders":
			// skip_external_clusters is read by propagation only.
			for f := range cfg.GetFields() {
				if f != "skip_external_clusters" && f != "skipExternalClusters" {
					return false, fmt.Errorf("%s: IstioHeaders.%s is not implemented by the stand-in", mw, f)
				}
			}
			istioHeaders = true
		case "workload_discovery", "workloadDiscovery":
			if len(cfg.GetFields()) > 0 {
				return false, fmt.Errorf("%s: WorkloadDiscovery with fields is not implemented by the stand-in", mw)
			}
		default:
			// baggage (deprecated) reads and removes the baggage header.
			return false, fmt.Errorf("%s: discovery method %s is not implemented by the stand-in", mw, k)
		}
	}
	return istioHeaders, nil
}

func peerPropagation(where string, list *structpb.Value) ([]bool, error) {
	var out []bool
	for i, m := range list.GetListValue().GetValues() {
		mw := fmt.Sprintf("%s[%d]", where, i)
		k, cfg, err := peerMethod(mw, m)
		if err != nil {
			return nil, err
		}
		if k != "istio_headers" && k != "istioHeaders" {
			return nil, fmt.Errorf("%s: propagation method %s is not implemented by the stand-in", mw, k)
		}
		skip := false
		for f, v := range cfg.GetFields() {
			if f != "skip_external_clusters" && f != "skipExternalClusters" {
				return nil, fmt.Errorf("%s: IstioHeaders.%s is not implemented by the stand-in", mw, f)
			}
			skip = v.GetBoolValue()
		}
		out = append(out, skip)
	}
	return out, nil
}

// propagates reports whether any propagation entry sends the headers for
// a request bound to cluster (nil: none, or one that does not exist),
// named name (MXPropagationMethod::skipMXHeaders).
func propagates(entries []bool, name string, c *cluster) bool {
	for _, skipExternal := range entries {
		if !skipMX(skipExternal, name, c) {
			return true
		}
	}
	return false
}

func skipMX(skipExternal bool, name string, c *cluster) bool {
	if c == nil {
		return false
	}
	if skipExternal && (name == "PassthroughCluster" || c.istioExternal) {
		return true
	}
	return c.istioDisableMX
}

// onRequest is the filter's decodeHeaders; c is the cluster of the route
// the request is on (nil: none).
func (f *peerMetadataFilter) onRequest(h extprocfilter.Headers, name string, c *cluster) (extprocfilter.Headers, peerCtx) {
	var pc peerCtx
	if !f.downstreamDiscovery && !propagates(f.upstreamPropagation, name, c) {
		return h, pc
	}
	h = h.Clone()
	if f.downstreamDiscovery {
		pc.idReceived, pc.valueReceived = h.Has(peerMetadataIDHeader), h.Has(peerMetadataHeader)
		h.Del(peerMetadataIDHeader)
		h.Del(peerMetadataHeader)
	}
	if propagates(f.upstreamPropagation, name, c) {
		h.Set(peerMetadataIDHeader, f.id)
		h.Set(peerMetadataHeader, f.value)
	}
	return h, pc
}

// onResponse is the filter's encodeHeaders.
func (f *peerMetadataFilter) onResponse(h extprocfilter.Headers, pc peerCtx, name string, c *cluster) extprocfilter.Headers {
	down := propagates(f.downstreamPropagation, name, c)
	if !f.upstreamDiscovery && !(down && (pc.idReceived || pc.valueReceived)) {
		return h
	}
	h = h.Clone()
	if f.upstreamDiscovery {
		h.Del(peerMetadataIDHeader)
		h.Del(peerMetadataHeader)
	}
	if down {
		if pc.idReceived {
			h.Set(peerMetadataIDHeader, f.id)
		}
		if pc.valueReceived {
			h.Set(peerMetadataHeader, f.value)
		}
	}
	return h
}

// Istio's node metadata fields and labels (istio/proxy
// extensions/common/metadata_object.h).
const (
	mdInstance  = "NAME"
	mdNamespace = "NAMESPACE"
	mdCluster   = "CLUSTER_ID"
	mdIdentity  = "IDENTITY"
	mdOwner     = "OWNER"
	mdWorkload  = "WORKLOAD_NAME"
	mdLabels    = "LABELS"
	mdRegion    = "REGION"
	mdZone      = "AVAILABILITY_ZONE"

	labelCanonicalName     = "service.istio.io/canonical-name"
	labelCanonicalRevision = "service.istio.io/canonical-revision"
	labelAppQualified      = "app.kubernetes.io/name"
	labelApp               = "app"
	labelVersionQualified  = "app.kubernetes.io/version"
	labelVersion           = "version"
	ownerPrefix            = "kubernetes://apis/apps/v1/namespaces/"
)

// peerMetadataValue is the x-envoy-peer-metadata value a node sends:
// convertWorkloadMetadataToStruct(convertStructToWorkloadMetadata(node
// metadata, additional labels)), serialised deterministically, in
// base64 (istio/proxy metadata_object.cc, peer_metadata filter.cc
// MXPropagationMethod::computeValue).
func peerMetadataValue(md *structpb.Struct, additional map[string]bool) (string, error) {
	str := func(k string) string { return md.GetFields()[k].GetStringValue() }
	instance, namespace, owner, workload := str(mdInstance), str(mdNamespace), str(mdOwner), str(mdWorkload)
	clusterID, identity, region, zone := str(mdCluster), str(mdIdentity), str(mdRegion), str(mdZone)
	var canonicalName, canonicalRevision, app, version string
	extra := map[string]string{}
	for k, v := range md.GetFields()[mdLabels].GetStructValue().GetFields() {
		s := v.GetStringValue()
		switch {
		case k == labelCanonicalName:
			canonicalName = s
		case k == labelCanonicalRevision:
			canonicalRevision = s
		case k == labelAppQualified:
			app = s
		case k == labelApp:
			if _, ok := md.GetFields()[mdLabels].GetStructValue().GetFields()[labelAppQualified]; !ok {
				app = s
			}
		case k == labelVersionQualified:
			version = s
		case k == labelVersion:
			if _, ok := md.GetFields()[mdLabels].GetStructValue().GetFields()[labelVersionQualified]; !ok {
				version = s
			}
		case additional[k]:
			extra[k] = s
		}
	}
	out := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	set := func(k, v string) {
		if v != "" {
			out.Fields[k] = structpb.NewStringValue(v)
		}
	}
	set(mdInstance, instance)
	set(mdNamespace, namespace)
	set(mdWorkload, workload)
	set(mdCluster, clusterID)
	set(mdIdentity, identity)
	labels := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range map[string]string{labelCanonicalName: canonicalName, labelCanonicalRevision: canonicalRevision, labelApp: app, labelVersion: version} {
		if v != "" {
			labels.Fields[k] = structpb.NewStringValue(v)
		}
	}
	for k, v := range extra {
		labels.Fields[k] = structpb.NewStringValue(v)
	}
	out.Fields[mdLabels] = structpb.NewStructValue(labels)
	if suffix := workloadType(owner, workload); suffix != "" {
		out.Fields[mdOwner] = structpb.NewStringValue(ownerPrefix + namespace + "/" + suffix + "s/" + workload)
	}
	set(mdRegion, region)
	set(mdZone, zone)
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(out)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// workloadType is parseOwner: the kind in ".../<kind>s/<workload>" when it
// is one Istio knows, else "".
func workloadType(owner, workload string) string {
	if len(owner) <= len(workload)+2 {
		return ""
	}
	owner = owner[:len(owner)-len(workload)-2]
	i := strings.LastIndexByte(owner, '/')
	if i < 0 {
		return ""
	}
	switch kind := owner[i+1:]; kind {
	case "pod", "deployment", "job", "cronjob":
		return kind
	}
	return ""
}
