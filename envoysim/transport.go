package envoysim

import (
	"crypto/tls"
	"errors"
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rawbufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

const (
	rawBufferType = "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"
	// transportSocketMatchKey is the filter_metadata namespace of endpoint
	// and locality metadata that transport_socket_matches read.
	transportSocketMatchKey = "envoy.transport_socket_match"
)

// transportKind is how a connection to a host is made.
type transportKind uint8

const (
	// plaintext: no transport socket, or raw_buffer.
	plaintext transportKind = iota
	// acceptAnyTLS: an UpstreamTlsContext the stand-in reproduces (empty
	// validation context, optionally one inline client certificate).
	acceptAnyTLS
	// secretNotSupplied: an UpstreamTlsContext whose certificate or
	// validation context comes from SDS. The stand-in has no SDS client,
	// so the secret never arrives, and Envoy builds such a socket as a
	// NotReadySslSocket: every connection through it fails before any byte
	// is exchanged ("Secret is not supplied by SDS"). Istio's auto mTLS
	// (transport_socket_matches tlsMode: istio) is the common case.
	secretNotSupplied
)

// hostTransport is the transport socket of connections to one host.
type hostTransport struct {
	kind   transportKind
	cert   *tls.Certificate // acceptAnyTLS: the client certificate, or nil
	certID string
	// name says where it was configured, for messages.
	name string
}

// errSecretNotSupplied is the transport failure of a connection through a
// socket whose SDS secret never arrived: Envoy's NotReadySslSocket
// failure reason.
var errSecretNotSupplied = errors.New("TLS error: Secret is not supplied by SDS")

// transportSelector is a cluster's transport_socket_matches and its
// transport_socket, which choose the socket per host as Envoy's
// TransportSocketMatcherImpl does: the first match whose criteria are all
// in the host's envoy.transport_socket_match metadata, else the first
// whose criteria are all in its locality's, else the cluster's
// transport_socket (plaintext when unset). A match with no criteria
// matches every host.
type transportSelector struct {
	matches []socketMatch
	def     hostTransport
}

type socketMatch struct {
	criteria  map[string]*structpb.Value
	transport hostTransport
}

// matches is Envoy's Config::Metadata::metadataLabelMatch: every criterion
// is a key of the namespace with an equal value.
func (m socketMatch) matches(md *corev3.Metadata) bool {
	fields := md.GetFilterMetadata()[transportSocketMatchKey].GetFields()
	for k, want := range m.criteria {
		got, ok := fields[k]
		if !ok || !proto.Equal(got, want) {
			return false
		}
	}
	return true
}

// pick chooses the socket of a host from its metadata and its locality's.
func (s *transportSelector) pick(host, locality *corev3.Metadata) hostTransport {
	for _, m := range s.matches {
		if m.matches(host) {
			return m.transport
		}
	}
	for _, m := range s.matches {
		if m.matches(locality) {
			return m.transport
		}
	}
	return s.def
}

// clusterTransports reads Cluster.transport_socket and
// transport_socket_matches.
func clusterTransports(c *clusterv3.Cluster) (*transportSelector, error) {
	if c.GetTransportSocketMatcher() != nil {
		return nil, errors.New("transport_socket_matcher is not implemented by the stand-in")
	}
	s := &transportSelector{def: hostTransport{name: "transport_socket"}}
	if ts := c.GetTransportSocket(); ts != nil {
		t, err := transportSocket("transport_socket", ts)
		if err != nil {
			return nil, err
		}
		s.def = t
	}
	for i, m := range c.GetTransportSocketMatches() {
		where := fmt.Sprintf("transport_socket_matches[%d] %q", i, m.GetName())
		if err := checkFields(where, m); err != nil {
			return nil, err
		}
		if m.GetTransportSocket() == nil {
			return nil, fmt.Errorf("%s: transport_socket is required", where)
		}
		t, err := transportSocket(where+".transport_socket", m.GetTransportSocket())
		if err != nil {
			return nil, err
		}
		t.name = where
		s.matches = append(s.matches, socketMatch{criteria: m.GetMatch().GetFields(), transport: t})
	}
	return s, nil
}

// transportSocket reads one TransportSocket: raw_buffer, or TLS.
func transportSocket(where string, ts *corev3.TransportSocket) (hostTransport, error) {
	out := hostTransport{name: where}
	if err := checkFields(where, ts); err != nil {
		return out, err
	}
	switch url := ts.GetTypedConfig().GetTypeUrl(); url {
	case rawBufferType:
		rb := &rawbufferv3.RawBuffer{}
		if err := ts.GetTypedConfig().UnmarshalTo(rb); err != nil {
			return out, fmt.Errorf("%s: %w", where, err)
		}
		return out, checkFields(where, rb)
	case upstreamTLSType:
	default:
		return out, fmt.Errorf("%s %s is not implemented by the stand-in", where, url)
	}
	utc := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(utc); err != nil {
		return out, fmt.Errorf("%s: %w", where, err)
	}
	if needsSDS(utc.GetCommonTlsContext()) {
		// No connection through it is ever made; the rest of the context
		// cannot change anything.
		out.kind = secretNotSupplied
		return out, nil
	}
	ctc := utc.GetCommonTlsContext()
	if err := checkAll(where, utc, ctc, ctc.GetTlsParams()); err != nil {
		return out, err
	}
	if vc := ctc.GetValidationContext(); vc != nil && proto.Size(vc) > 0 {
		return out, fmt.Errorf("%s: certificate validation (validation_context) is not implemented by the stand-in; it accepts any certificate, as with an empty validation context", where)
	}
	if err := tlsVersions(where+".common_tls_context.tls_params", ctc.GetTlsParams()); err != nil {
		return out, err
	}
	cert, err := clientCertificate(where+".common_tls_context.tls_certificates", ctc.GetTlsCertificates())
	if err != nil {
		return out, err
	}
	out.kind, out.cert, out.certID = acceptAnyTLS, cert, certID(cert)
	return out, nil
}

// needsSDS reports whether a TLS context takes a certificate or its
// validation context from SDS.
func needsSDS(ctc *tlsv3.CommonTlsContext) bool {
	return len(ctc.GetTlsCertificateSdsSecretConfigs()) > 0 || ctc.GetValidationContextSdsSecretConfig() != nil ||
		ctc.GetCombinedValidationContext().GetValidationContextSdsSecretConfig() != nil
}

// tlsVersions accepts the protocol versions the stand-in's TLS client
// negotiates, which are Envoy's client defaults: TLS 1.2 to 1.3.
func tlsVersions(where string, p *tlsv3.TlsParameters) error {
	switch p.GetTlsMinimumProtocolVersion() {
	case tlsv3.TlsParameters_TLS_AUTO, tlsv3.TlsParameters_TLSv1_2:
	default:
		return fmt.Errorf("%s.tls_minimum_protocol_version %s: the stand-in negotiates TLS 1.2 to 1.3 (Envoy's client defaults) only", where, p.GetTlsMinimumProtocolVersion())
	}
	switch p.GetTlsMaximumProtocolVersion() {
	case tlsv3.TlsParameters_TLS_AUTO, tlsv3.TlsParameters_TLSv1_3:
	default:
		return fmt.Errorf("%s.tls_maximum_protocol_version %s: the stand-in negotiates TLS 1.2 to 1.3 (Envoy's client defaults) only", where, p.GetTlsMaximumProtocolVersion())
	}
	return nil
}

// istioMXTCPType is the config of Istio's TCP metadata exchange, which
// Istio sends as a TypedStruct.
const istioMXTCPType = "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange"

// clusterFilters reads Cluster.filters, upstream network filters, which
// see every byte of every connection to the cluster's hosts. The only one
// accepted is Istio's TCP metadata exchange (istio.metadata_exchange):
// it acts only on a connection whose negotiated ALPN is its protocol
// (istio-peer-exchange), exchanging workload metadata for telemetry;
// on any other connection it passes every byte through
// (metadata_exchange.cc, conn_state_ Invalid). The stand-in's upstream
// connections negotiate no ALPN (plaintext) or h2 (gRPC over TLS), so a
// protocol other than those leaves it inert.
func clusterFilters(fs []*clusterv3.Filter) error {
	for i, f := range fs {
		where := fmt.Sprintf("filters[%d] %q", i, f.GetName())
		if err := checkFields(where, f); err != nil {
			return err
		}
		url, v, err := typedStruct(where, f.GetTypedConfig())
		if err != nil {
			return err
		}
		if url != istioMXTCPType {
			return fmt.Errorf("%s: upstream network filter %s is not implemented by the stand-in", where, typeURLOf(f.GetTypedConfig(), url))
		}
		protocol := ""
		for k, val := range v.GetFields() {
			switch k {
			case "protocol":
				protocol = val.GetStringValue()
			case "enable_discovery", "enableDiscovery":
				// Workload discovery of the peer, for telemetry: only when
				// the exchange runs.
			default:
				return fmt.Errorf("%s: MetadataExchange.%s is not implemented by the stand-in", where, k)
			}
		}
		if protocol == "" || protocol == "h2" {
			return fmt.Errorf("%s: MetadataExchange.protocol %q: the stand-in's connections negotiate that ALPN, on which the exchange would run", where, protocol)
		}
	}
	return nil
}
