package envoysim

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	randomv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/random/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// grpcTarget is where an ext_proc filter (or an EDS stream) naming a
// cluster connects, and how.
type grpcTarget struct {
	addr string // "" when the cluster has no endpoint
	tls  bool
	// verify checks the server's certificate against roots (PEM; empty:
	// the system's) for serverName, as a google_grpc channel with
	// ssl_credentials does; an envoy_grpc cluster here accepts any.
	verify     bool
	roots      string
	serverName string
	// cert is the client certificate of the cluster's tls_certificates
	// (nil: none), certID its certID.
	cert   *tls.Certificate
	certID string
	// sockopts are the cluster's socket options (health-checked processor
	// clusters; the zero value is none).
	sockopts extprocfilter.SocketOptions
	// cl is the cluster when its hosts are health checked: a stream then
	// starts on its first usable host, chosen when it starts.
	cl *cluster
}

// same reports whether t and o connect the same way: the same address,
// transport and client certificate (each build parses certificates anew).
func (t grpcTarget) same(o grpcTarget) bool {
	return t.addr == o.addr && t.tls == o.tls && t.certID == o.certID &&
		t.verify == o.verify && t.roots == o.roots && t.serverName == o.serverName
}

// certID identifies a client certificate by the SHA-256 of its chain (the
// leaf's DER first); "" for none.
func certID(c *tls.Certificate) string {
	if c == nil {
		return ""
	}
	h := sha256.New()
	for _, der := range c.Certificate {
		_ = binary.Write(h, binary.BigEndian, uint32(len(der)))
		h.Write(der)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// edsRef is the load assignment an EDS cluster needs: its name, and the
// cluster that reaches its EDS server ("" for ADS).
type edsRef struct {
	name, source string
	// target is where a google_grpc source connects; empty for a cluster
	// (the cluster's first host).
	target grpcTarget
}

// buildCluster translates a Cluster. It returns the cluster, where an
// ext_proc filter naming it connects, and the load assignment it needs
// (empty when it is not an EDS cluster).
func buildCluster(c *clusterv3.Cluster, res *resources, env buildEnv) (*cluster, grpcTarget, edsRef, error) {
	var tgt grpcTarget
	if err := checkFields("cluster", c); err != nil {
		return nil, tgt, edsRef{}, err
	}
	out := &cluster{name: c.GetName(), connectTimeout: 5 * time.Second}
	// Round robin starts at a random host of a new cluster, so proxies (and
	// rebuilds) do not all send their first request to the same host:
	// RoundRobinLoadBalancer::refreshHostSource starts each host source's
	// index at seed_, which the EdfLoadBalancerBase constructor draws from
	// the random generator (Envoy 1.39, source/extensions/
	// load_balancing_policies/round_robin/round_robin_lb.h, common/
	// load_balancer_impl.cc). The stand-in builds every cluster anew on
	// each update, so without it a fallback would always take the first
	// endpoint.
	out.next.Store(rand.Uint64())
	if d := c.GetConnectTimeout(); d != nil {
		out.connectTimeout = d.AsDuration()
	}
	keepalive, err := tcpKeepalive(c.GetUpstreamConnectionOptions())
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	userTimeout, err := bindSocketOptions(c.GetUpstreamBindConfig())
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	out.sockopts = extprocfilter.SocketOptions{Keepalive: keepalive, UserTimeout: userTimeout}
	sel, err := clusterTransports(c)
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	out.unlisted = sel.pick(nil, nil)
	out.ownTLS = len(sel.matches) == 0 && sel.def.kind == acceptAnyTLS
	if err := clusterFilters(c.GetFilters()); err != nil {
		return nil, tgt, edsRef{}, err
	}
	istio := c.GetMetadata().GetFilterMetadata()["istio"].GetFields()
	out.istioDisableMX, out.istioExternal = istio["disable_mx"].GetBoolValue(), istio["external"].GetBoolValue()
	var eds edsRef
	var cla *endpointv3.ClusterLoadAssignment
	switch c.GetType() {
	case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
		cla = c.GetLoadAssignment()
	case clusterv3.Cluster_EDS:
		if env.static {
			return nil, tgt, edsRef{}, errors.New("type EDS: a static bootstrap has no ADS stream to fetch endpoints from; give the cluster a load_assignment (STATIC, STRICT_DNS or LOGICAL_DNS), or take the configuration over xDS (--xds-server)")
		}
		ec := c.GetEdsClusterConfig()
		if err := checkFields("eds_cluster_config", ec); err != nil {
			return nil, tgt, edsRef{}, err
		}
		src, srcTarget, err := configSource("eds_cluster_config.eds_config", ec.GetEdsConfig(), env)
		if err != nil {
			return nil, tgt, edsRef{}, err
		}
		eds = edsRef{name: ec.GetServiceName(), source: src, target: srcTarget}
		if eds.name == "" {
			eds.name = c.GetName()
		}
		if src == "" {
			cla = res.endpoints[eds.name]
		} else {
			cla = res.side[src][eds.name]
		}
	case clusterv3.Cluster_ORIGINAL_DST:
		if c.GetLoadAssignment() != nil {
			return nil, tgt, edsRef{}, errors.New("ORIGINAL_DST clusters take no load_assignment")
		}
		if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			return nil, tgt, edsRef{}, errors.New("ORIGINAL_DST needs lb_policy CLUSTER_PROVIDED")
		}
		od, err := originalDstSource(c.GetOriginalDstLbConfig())
		if err != nil {
			return nil, tgt, edsRef{}, err
		}
		out.originalDst = od
	default:
		return nil, tgt, edsRef{}, fmt.Errorf("type %s is not implemented by the stand-in", c.GetType())
	}
	// With load_balancing_policy set, Envoy ignores lb_policy (Istio sets
	// CLUSTER_PROVIDED beside override_host).
	if c.GetType() != clusterv3.Cluster_ORIGINAL_DST && c.GetLoadBalancingPolicy() == nil {
		switch c.GetLbPolicy() {
		case clusterv3.Cluster_ROUND_ROBIN, clusterv3.Cluster_LEAST_REQUEST, clusterv3.Cluster_RANDOM:
		default:
			return nil, tgt, edsRef{}, fmt.Errorf("lb_policy %s is not implemented by the stand-in", c.GetLbPolicy())
		}
	}
	if lbp := c.GetLoadBalancingPolicy(); lbp != nil {
		if out.originalDst != nil {
			return nil, tgt, edsRef{}, errors.New("load_balancing_policy on an ORIGINAL_DST cluster")
		}
		oh, err := loadBalancingPolicy("load_balancing_policy", lbp, true)
		if err != nil {
			return nil, tgt, edsRef{}, err
		}
		out.override = oh
	}
	var dnsRefresh time.Duration // STRICT_DNS: a host per address, resolved again
	if c.GetType() == clusterv3.Cluster_STRICT_DNS {
		dnsRefresh = defaultDNSRefresh
		if d := c.GetDnsRefreshRate(); d != nil {
			dnsRefresh = d.AsDuration()
		}
	}
	a, err := clusterEndpoints(cla, sel, env, dnsRefresh)
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	eps := a.endpoints
	out.endpoints, out.members, out.transports = eps, a.members, a.transports
	if sc := c.GetLbSubsetConfig(); sc != nil {
		switch {
		case out.originalDst != nil:
			// Envoy: "cluster: LB policy CLUSTER_PROVIDED cannot be
			// combined with lb_subset_config".
			return nil, tgt, edsRef{}, errors.New("lb_subset_config on an ORIGINAL_DST cluster")
		case out.override != nil:
			return nil, tgt, edsRef{}, errors.New("lb_subset_config with load_balancing_policy is not implemented by the stand-in")
		}
		if out.subsets, err = buildSubsetLB("lb_subset_config", sc); err != nil {
			return nil, tgt, edsRef{}, err
		}
		for _, h := range a.hosts {
			out.subsets.add(h.subsetHost, h.lb)
		}
	}
	hc, err := parseHealthChecks(c)
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	panicAt, err := panicThreshold(c)
	if err != nil {
		return nil, tgt, edsRef{}, err
	}
	if hc != nil && env.health != nil {
		out.health, err = env.health.forCluster(c.GetName(), hc, panicAt, eps, out.target)
		if err != nil {
			return nil, tgt, edsRef{}, err
		}
	}
	if len(eps) > 0 {
		// A gRPC client of this cluster connects to its first host (its
		// first usable one when health checked, chosen per stream).
		tgt = targetOf(eps[0], out.transportFor(eps[0]))
		if out.health != nil {
			tgt.cl = out
		}
	}
	return out, tgt, eds, nil
}

// secretNotSuppliedTarget is a gRPC target that fails at once, standing for
// a host whose transport socket waits for an SDS secret that never comes:
// a filter's stream to it fails (its failure mode decides), an EDS stream
// never connects.
const secretNotSuppliedTarget = "unix:///nonexistent/infergate-envoysim-sds-secret-not-supplied"

// tcpKeepalive reads upstream_connection_options: tcp_keepalive turns the
// kernel's keepalive on, each unset field left at the system's default, as
// Envoy sets only the socket options given (source/common/network/
// socket_option_factory.cc SocketOptionFactory::buildTcpKeepaliveOptions).
func tcpKeepalive(o *clusterv3.UpstreamConnectionOptions) (net.KeepAliveConfig, error) {
	if err := checkFields("upstream_connection_options", o); err != nil {
		return net.KeepAliveConfig{}, err
	}
	k := o.GetTcpKeepalive()
	if k == nil {
		return net.KeepAliveConfig{}, nil
	}
	if err := checkFields("upstream_connection_options.tcp_keepalive", k); err != nil {
		return net.KeepAliveConfig{}, err
	}
	kc := net.KeepAliveConfig{Enable: true, Idle: -1, Interval: -1, Count: -1}
	if v := k.GetKeepaliveTime(); v != nil {
		kc.Idle = time.Duration(v.GetValue()) * time.Second
	}
	if v := k.GetKeepaliveInterval(); v != nil {
		kc.Interval = time.Duration(v.GetValue()) * time.Second
	}
	if v := k.GetKeepaliveProbes(); v != nil {
		kc.Count = int(v.GetValue())
	}
	return kc, nil
}

// bindSocketOptions reads upstream_bind_config: socket options only (no
// address to bind, which Envoy allows since 1.25), and of them only
// TCP_USER_TIMEOUT (level IPPROTO_TCP, name 18) set before bind, which
// the stand-in applies as Envoy does any such literal option
// (source/common/network/socket_option_impl.cc SocketOptionImpl::setOption).
func bindSocketOptions(b *corev3.BindConfig) (time.Duration, error) {
	if b == nil {
		return 0, nil
	}
	if err := checkFields("upstream_bind_config", b); err != nil {
		return 0, err
	}
	var userTimeout time.Duration
	for i, o := range b.GetSocketOptions() {
		where := fmt.Sprintf("upstream_bind_config.socket_options[%d]", i)
		if err := checkFields(where, o); err != nil {
			return 0, err
		}
		if o.GetLevel() != 6 || o.GetName() != 18 || o.GetState() != corev3.SocketOption_STATE_PREBIND || o.GetValue() == nil {
			return 0, fmt.Errorf("%s: only TCP_USER_TIMEOUT (level 6, name 18, an int_value, STATE_PREBIND) is implemented by the stand-in", where)
		}
		userTimeout = time.Duration(o.GetIntValue()) * time.Millisecond
	}
	return userTimeout, nil
}

// tlsConfig is the TLS a client dials t with (nil: plaintext).
func (t grpcTarget) tlsConfig() *tls.Config {
	if !t.tls {
		return nil
	}
	return extprocfilter.TLSConfig(t.cert)
}

// targetOf is how a gRPC client reaches host through its transport socket.
func targetOf(host string, t hostTransport) grpcTarget {
	switch t.kind {
	case acceptAnyTLS:
		return grpcTarget{addr: host, tls: true, cert: t.cert, certID: t.certID}
	case secretNotSupplied:
		return grpcTarget{addr: secretNotSuppliedTarget}
	}
	return grpcTarget{addr: host}
}

// configSource reads an EDS ConfigSource: ADS (""), or an
// api_config_source streaming EDS over gRPC, named by the source it opens a
// stream to: an envoy_grpc cluster of the bootstrap, or a google_grpc
// channel, which needs no cluster (and then its target).
func configSource(where string, cs *corev3.ConfigSource, env buildEnv) (string, grpcTarget, error) {
	var none grpcTarget
	if cs == nil {
		return "", none, fmt.Errorf("%s is required", where)
	}
	if err := checkFields(where, cs); err != nil {
		return "", none, err
	}
	if cs.GetAds() != nil {
		return "", none, nil
	}
	api := cs.GetApiConfigSource()
	if api == nil {
		return "", none, fmt.Errorf("%s: only ads and api_config_source are implemented by the stand-in", where)
	}
	where += ".api_config_source"
	if err := checkFields(where, api); err != nil {
		return "", none, err
	}
	if api.GetApiType() != corev3.ApiConfigSource_GRPC {
		return "", none, fmt.Errorf("%s.api_type %s: only GRPC (state of the world) is implemented by the stand-in", where, api.GetApiType())
	}
	if len(api.GetGrpcServices()) != 1 {
		return "", none, fmt.Errorf("%s: want one grpc_services entry", where)
	}
	gs := api.GetGrpcServices()[0]
	if err := checkFields(where+".grpc_services[0]", gs); err != nil {
		return "", none, err
	}
	if g := gs.GetGoogleGrpc(); g != nil {
		tgt, err := googleGrpcTarget(where+".grpc_services[0].google_grpc", g)
		if err != nil {
			return "", none, err
		}
		return "google_grpc:" + g.GetTargetUri(), tgt, nil
	}
	eg := gs.GetEnvoyGrpc()
	if eg == nil {
		return "", none, fmt.Errorf("%s.grpc_services[0]: want envoy_grpc or google_grpc", where)
	}
	if err := checkFields(where+".grpc_services[0].envoy_grpc", eg); err != nil {
		return "", none, err
	}
	// Envoy takes a non-ADS subscription only from a cluster of the
	// bootstrap that is not EDS (its primary clusters):
	// source/common/config/utility.cc
	// Utility::checkApiConfigSourceSubscriptionBackingCluster and
	// validateClusterName, the set built in cluster_manager_impl.cc
	// (ClusterManagerImpl::init, is_primary_cluster). A cluster CDS sent
	// is never one: the update is rejected (envoyproxy/envoy#12954).
	name := eg.GetClusterName()
	if bc, ok := env.bootstrap[name]; !ok || bc.GetType() == clusterv3.Cluster_EDS {
		return "", none, fmt.Errorf("%s: %s must have a statically defined non-EDS cluster: '%s' does not exist, was added via api, or is an EDS cluster",
			where, "envoy.config.core.v3.ApiConfigSource", name)
	}
	return name, none, nil
}

// googleGrpcTarget is how Envoy's Google gRPC client reaches target_uri
// (source/common/grpc/google_grpc_creds_impl.cc
// CredsUtility::defaultChannelCredentials): without channel_credentials a
// plaintext channel; with ssl_credentials TLS that verifies the server
// against root_certs (the system's when empty) for the target's host name,
// presenting cert_chain and private_key when set. Other credentials and
// call credentials are not reproduced.
func googleGrpcTarget(where string, g *corev3.GrpcService_GoogleGrpc) (grpcTarget, error) {
	var tgt grpcTarget
	if err := checkFields(where, g); err != nil {
		return tgt, err
	}
	target := strings.TrimPrefix(g.GetTargetUri(), "dns:///")
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return tgt, fmt.Errorf("%s.target_uri %q: want host:port (or dns:///host:port): %w", where, g.GetTargetUri(), err)
	}
	tgt = grpcTarget{addr: target}
	cc := g.GetChannelCredentials()
	if cc == nil {
		return tgt, nil
	}
	ssl := cc.GetSslCredentials()
	if ssl == nil {
		return tgt, fmt.Errorf("%s.channel_credentials: only ssl_credentials is implemented by the stand-in", where)
	}
	if err := checkFields(where+".channel_credentials.ssl_credentials", ssl); err != nil {
		return tgt, err
	}
	roots, err := dataSource(where+".channel_credentials.ssl_credentials.root_certs", ssl.GetRootCerts())
	if err != nil {
		return tgt, err
	}
	if len(roots) > 0 && !x509.NewCertPool().AppendCertsFromPEM(roots) {
		return tgt, fmt.Errorf("%s.channel_credentials.ssl_credentials.root_certs: no PEM certificate", where)
	}
	if ssl.GetCertChain() != nil || ssl.GetPrivateKey() != nil {
		cert, err := keyPair(where+".channel_credentials.ssl_credentials", ".cert_chain", ssl.GetCertChain(), ".private_key", ssl.GetPrivateKey())
		if err != nil {
			return tgt, err
		}
		tgt.cert, tgt.certID = cert, certID(cert)
	}
	tgt.tls, tgt.verify, tgt.roots, tgt.serverName = true, true, string(roots), host
	return tgt, nil
}

func originalDstSource(oc *clusterv3.Cluster_OriginalDstLbConfig) (*originalDst, error) {
	if err := checkFields("original_dst_lb_config", oc); err != nil {
		return nil, err
	}
	out := &originalDst{}
	if oc.GetMetadataKey() != nil {
		k, err := metadataKeyOf("original_dst_lb_config.metadata_key", oc.GetMetadataKey())
		if err != nil {
			return nil, err
		}
		out.md = k
	}
	if oc.GetUseHttpHeader() {
		out.header = "x-envoy-original-dst-host" // Envoy's default header
		if name := oc.GetHttpHeaderName(); name != "" {
			out.header = strings.ToLower(name)
		}
	}
	// With neither, only the connection's restored destination, which the
	// stand-in never has.
	return out, nil
}

// loadBalancingPolicy reads Cluster.load_balancing_policy. Envoy uses the
// first policy it supports, and supports many; the stand-in takes the first
// policy and NACKs it unless it is override_host or one of round_robin,
// least_request and random, which all pick among equal hosts (round robin
// here).
func loadBalancingPolicy(where string, lbp *clusterv3.LoadBalancingPolicy, allowOverride bool) (*overrideHost, error) {
	if err := checkFields(where, lbp); err != nil {
		return nil, err
	}
	if len(lbp.GetPolicies()) == 0 {
		return nil, fmt.Errorf("%s: no policies", where)
	}
	p := lbp.GetPolicies()[0]
	pw := where + ".policies[0]"
	if err := checkAll(pw, p, p.GetTypedExtensionConfig()); err != nil {
		return nil, err
	}
	tc := p.GetTypedExtensionConfig().GetTypedConfig()
	msg, err := tc.UnmarshalNew()
	if err != nil {
		return nil, fmt.Errorf("%s: policy %s is not implemented by the stand-in", pw, tc.GetTypeUrl())
	}
	switch m := msg.(type) {
	case *roundrobinv3.RoundRobin, *leastrequestv3.LeastRequest, *randomv3.Random:
		return nil, nil
	case *overridehostv3.OverrideHost:
		if !allowOverride {
			return nil, fmt.Errorf("%s: override_host as a fallback policy", pw)
		}
		return overrideHostOf(pw, m)
	}
	return nil, fmt.Errorf("%s: policy %s is not implemented by the stand-in", pw, tc.GetTypeUrl())
}

func overrideHostOf(where string, m *overridehostv3.OverrideHost) (*overrideHost, error) {
	if err := checkFields(where, m); err != nil {
		return nil, err
	}
	out := &overrideHost{}
	for i, s := range m.GetOverrideHostSources() {
		sw := fmt.Sprintf("%s.override_host_sources[%d]", where, i)
		if err := checkFields(sw, s); err != nil {
			return nil, err
		}
		if s.GetMetadata() != nil {
			k, err := metadataKeyOf(sw+".metadata", s.GetMetadata())
			if err != nil {
				return nil, err
			}
			out.sources = append(out.sources, hostSource{md: k})
			continue
		}
		if s.GetHeader() == "" {
			return nil, fmt.Errorf("%s: neither header nor metadata", sw)
		}
		out.sources = append(out.sources, hostSource{header: strings.ToLower(s.GetHeader())})
	}
	if k := m.GetSelectedHostKey(); k != nil {
		sk, err := metadataKeyOf(where+".selected_host_key", k)
		if err != nil {
			return nil, err
		}
		out.selected = sk
	}
	if fp := m.GetFallbackPolicy(); fp != nil {
		if _, err := loadBalancingPolicy(where+".fallback_policy", fp, false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func metadataKeyOf(where string, k *metadatav3.MetadataKey) (*metadataKey, error) {
	if err := checkFields(where, k); err != nil {
		return nil, err
	}
	out := &metadataKey{namespace: k.GetKey()}
	for i, seg := range k.GetPath() {
		if err := checkFields(fmt.Sprintf("%s.path[%d]", where, i), seg); err != nil {
			return nil, err
		}
		out.path = append(out.path, seg.GetKey())
	}
	if out.namespace == "" || len(out.path) == 0 {
		return nil, fmt.Errorf("%s: want a key and a path", where)
	}
	return out, nil
}

// clientCertificate reads CommonTlsContext.tls_certificates: nil for none.
// Envoy presents the first certificate whose algorithm the server accepts;
// the stand-in takes the first, and since its choice among several could
// differ from Envoy's, it NACKs more than one. The chain and key are read
// when the update is built (a file changed later is read again with the
// next update) and must parse as a PEM pair.
func clientCertificate(where string, tcs []*tlsv3.TlsCertificate) (*tls.Certificate, error) {
	switch len(tcs) {
	case 0:
		return nil, nil
	case 1:
	default:
		return nil, fmt.Errorf("%s: %d certificates; the stand-in presents one and does not implement Envoy's choice among several (the first whose algorithm the server accepts)", where, len(tcs))
	}
	tc := tcs[0]
	where += "[0]"
	if err := checkFields(where, tc); err != nil {
		return nil, err
	}
	return keyPair(where, ".certificate_chain", tc.GetCertificateChain(), ".private_key", tc.GetPrivateKey())
}

// keyPair reads a certificate chain and its private key from two
// DataSources (named chainField and keyField under where), both required.
func keyPair(where, chainField string, chainDS *corev3.DataSource, keyField string, keyDS *corev3.DataSource) (*tls.Certificate, error) {
	chain, err := dataSource(where+chainField, chainDS)
	if err != nil {
		return nil, err
	}
	key, err := dataSource(where+keyField, keyDS)
	if err != nil {
		return nil, err
	}
	if len(chain) == 0 || len(key) == 0 {
		return nil, fmt.Errorf("%s: %s and %s are both required", where, chainField[1:], keyField[1:])
	}
	cert, err := tls.X509KeyPair(chain, key)
	if err != nil {
		return nil, fmt.Errorf("%s: %s and %s: %w", where, chainField[1:], keyField[1:], err)
	}
	return &cert, nil
}

// dataSource reads a DataSource as Envoy does when it loads the
// configuration: inline_bytes, inline_string, or the file named by
// filename, read now. Unset is empty; environment_variable and
// watched_directory are NACKed (xdsRules).
func dataSource(where string, ds *corev3.DataSource) ([]byte, error) {
	if err := checkAll(where, ds); err != nil {
		return nil, err
	}
	switch s := ds.GetSpecifier().(type) {
	case *corev3.DataSource_InlineBytes:
		return s.InlineBytes, nil
	case *corev3.DataSource_InlineString:
		return []byte(s.InlineString), nil
	case *corev3.DataSource_Filename:
		b, err := os.ReadFile(s.Filename)
		if err != nil {
			return nil, fmt.Errorf("%s.filename: %w", where, err)
		}
		return b, nil
	}
	return nil, nil
}

// clusterEndpoints lists the hosts the normal load balancer uses (the
// lowest priority level that has healthy hosts; UNHEALTHY, DRAINING and
// TIMEOUT hosts left out), every host of the assignment, for
// override_host, which Envoy lets pick any host of the cluster, and each
// host's transport socket (sel, by the host's and its locality's
// metadata). Host names are resolved: with dnsRefresh set (STRICT_DNS) to
// a host per address, recorded to be resolved again that often; else to
// the first address (LOGICAL_DNS).
func clusterEndpoints(cla *endpointv3.ClusterLoadAssignment, sel *transportSelector, env buildEnv, dnsRefresh time.Duration) (assignment, error) {
	if cla == nil {
		return assignment{}, nil
	}
	if err := checkFields("load_assignment", cla); err != nil {
		return assignment{}, err
	}
	if len(cla.GetPolicy().GetDropOverloads()) > 0 {
		return assignment{}, errors.New("load_assignment.policy.drop_overloads is not implemented by the stand-in")
	}
	byPriority := map[uint32][]string{}
	a := assignment{members: map[string]bool{}, transports: map[string]hostTransport{}}
	best := ^uint32(0)
	for i, lle := range cla.GetEndpoints() {
		where := fmt.Sprintf("load_assignment.endpoints[%d]", i)
		if err := checkFields(where, lle); err != nil {
			return assignment{}, err
		}
		for j, le := range lle.GetLbEndpoints() {
			ew := fmt.Sprintf("%s.lb_endpoints[%d]", where, j)
			ep := le.GetEndpoint()
			if err := checkAll(ew, le, ep, ep.GetAddress(), ep.GetAddress().GetSocketAddress()); err != nil {
				return assignment{}, err
			}
			sa := ep.GetAddress().GetSocketAddress()
			if sa == nil {
				return assignment{}, fmt.Errorf("%s: want a socket_address", ew)
			}
			ips, err := env.resolve(sa.GetAddress())
			if dnsRefresh > 0 && net.ParseIP(sa.GetAddress()) == nil {
				env.dns.record(sa.GetAddress(), ips, dnsRefresh)
			}
			if err != nil {
				// As Envoy: a name that does not resolve gives the cluster
				// no host (and requests to it "no healthy upstream") until
				// it does.
				env.log.Error(err, "cluster host not resolved", "where", ew)
				continue
			}
			if dnsRefresh == 0 {
				ips = ips[:1]
			}
			for _, ip := range ips {
				hostPort := net.JoinHostPort(ip, strconv.Itoa(int(sa.GetPortValue())))
				a.members[hostPort] = true
				a.transports[hostPort] = sel.pick(le.GetMetadata(), lle.GetMetadata())
				p := lle.GetPriority()
				healthy := true
				switch le.GetHealthStatus() {
				case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_DRAINING, corev3.HealthStatus_TIMEOUT:
					healthy = false
				}
				a.hosts = append(a.hosts, assignedHost{subsetHost: subsetHost{addr: hostPort, priority: p, healthy: healthy},
					lb: le.GetMetadata().GetFilterMetadata()[lbNamespace]})
				if !healthy {
					continue
				}
				byPriority[p] = append(byPriority[p], hostPort)
				best = min(best, p)
			}
		}
	}
	a.endpoints = byPriority[best]
	return a, nil
}
