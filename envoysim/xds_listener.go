package envoysim

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

func buildListener(l *listenerv3.Listener, res *resources, clusters map[string]*cluster, targets map[string]grpcTarget, env buildEnv) (*builtListener, error) {
	if err := checkFields("listener", l); err != nil {
		return nil, err
	}
	sa := l.GetAddress().GetSocketAddress()
	if err := checkAll("address", l.GetAddress(), sa); err != nil {
		return nil, err
	}
	if sa == nil || sa.GetProtocol() != corev3.SocketAddress_TCP {
		return nil, errors.New("address: want a TCP socket_address")
	}
	for i, lf := range l.GetListenerFilters() {
		if err := checkFields(fmt.Sprintf("listener_filters[%d]", i), lf); err != nil {
			return nil, err
		}
		if _, ok := passThroughListenerFilters[lf.GetTypedConfig().GetTypeUrl()]; !ok {
			return nil, fmt.Errorf("listener_filters[%d] %q (%s) is not implemented by the stand-in", i, lf.GetName(), lf.GetTypedConfig().GetTypeUrl())
		}
	}
	// One plaintext HTTP chain: filter_chains[0], or default_filter_chain
	// alone (what Envoy Gateway renders), which then takes every connection.
	fc, where := l.GetDefaultFilterChain(), "default_filter_chain"
	switch n := len(l.GetFilterChains()); {
	case n == 1 && fc == nil:
		fc, where = l.GetFilterChains()[0], "filter_chains[0]"
	case n != 0 || fc == nil:
		return nil, fmt.Errorf("filter_chains: the stand-in serves one plaintext HTTP filter chain (filter_chains[0] or default_filter_chain), got %d and a default: %t", n, fc != nil)
	}
	if err := checkAll(where, fc, fc.GetFilterChainMatch()); err != nil {
		return nil, err
	}
	if tp := fc.GetFilterChainMatch().GetTransportProtocol(); tp != "" && tp != "raw_buffer" {
		return nil, fmt.Errorf("%s.filter_chain_match.transport_protocol %q: the stand-in serves plaintext only", where, tp)
	}
	if len(fc.GetFilters()) != 1 || fc.GetFilters()[0].GetTypedConfig().GetTypeUrl() != httpConnectionManagerType {
		return nil, fmt.Errorf("%s.filters: want exactly one envoy.filters.network.http_connection_manager", where)
	}
	nf := fc.GetFilters()[0]
	if err := checkFields(where+".filters[0]", nf); err != nil {
		return nil, err
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := nf.GetTypedConfig().UnmarshalTo(hcm); err != nil {
		return nil, fmt.Errorf("http_connection_manager: %w", err)
	}
	bl := &builtListener{name: l.GetName(), port: sa.GetPortValue(),
		addr: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))}
	bufferLimit := defaultBufferLimit
	if b := l.GetPerConnectionBufferLimitBytes(); b != nil {
		bufferLimit = int(b.GetValue())
	}
	t, rds, ready, err := buildHCM(hcm, res, clusters, targets, env, bufferLimit)
	if err != nil {
		return nil, fmt.Errorf("http_connection_manager: %w", err)
	}
	bl.table, bl.rds, bl.ready = t, rds, ready
	return bl, nil
}

func buildHCM(hcm *hcmv3.HttpConnectionManager, res *resources, clusters map[string]*cluster, targets map[string]grpcTarget, env buildEnv, bufferLimit int) (*table, string, bool, error) {
	if err := checkFields("http_connection_manager", hcm); err != nil {
		return nil, "", false, err
	}
	switch hcm.GetCodecType() {
	case hcmv3.HttpConnectionManager_AUTO, hcmv3.HttpConnectionManager_HTTP1:
	default:
		return nil, "", false, fmt.Errorf("codec_type %s: the stand-in serves HTTP/1.1", hcm.GetCodecType())
	}
	var procs []extProcFilter
	passThrough := map[string]bool{}
	routerSeen := false
	for i, hf := range hcm.GetHttpFilters() {
		where := fmt.Sprintf("http_filters[%d] %q", i, hf.GetName())
		if err := checkFields(where, hf); err != nil {
			return nil, "", false, err
		}
		if routerSeen {
			return nil, "", false, fmt.Errorf("%s: after the router, which must be the last filter", where)
		}
		tc := hf.GetTypedConfig()
		// Istio sends its own filters' configs in TypedStructs.
		inner, tsValue, err := typedStruct(where, tc)
		if err != nil {
			return nil, "", false, err
		}
		switch url := tc.GetTypeUrl(); {
		case inner == peerMetadataType:
			if tsValue == nil {
				return nil, "", false, fmt.Errorf("%s: %s is read from a TypedStruct only", where, peerMetadataType)
			}
			pm, err := peerMetadataConfig(where, tsValue, env.node)
			if err != nil {
				return nil, "", false, err
			}
			procs = append(procs, extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled(), peer: pm})
		case passThroughHTTPFilters[inner].reason != "":
			if err := checkPassThrough(where, passThroughHTTPFilters[inner], tc, tsValue); err != nil {
				return nil, "", false, err
			}
			passThrough[hf.GetName()] = true
		case tsValue != nil:
			return nil, "", false, fmt.Errorf("%s: filter type %s is not implemented by the stand-in", where, typeURLOf(tc, inner))
		case url == routerType:
			r := &routerv3.Router{}
			if err := tc.UnmarshalTo(r); err != nil {
				return nil, "", false, fmt.Errorf("%s: %w", where, err)
			}
			if err := checkFields(where, r); err != nil {
				return nil, "", false, err
			}
			routerSeen = true
		case url == extProcType:
			ep := &extprocfilterv3.ExternalProcessor{}
			if err := tc.UnmarshalTo(ep); err != nil {
				return nil, "", false, fmt.Errorf("%s: %w", where, err)
			}
			if err := checkExtProc(where, ep); err != nil {
				return nil, "", false, err
			}
			procs = append(procs, extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled(), proto: ep})
		case url == headerMutationType:
			hm, err := headerMutationFilter(where, hf)
			if err != nil {
				return nil, "", false, err
			}
			procs = append(procs, hm)
		case url == headerToMetadataType:
			hm, err := headerToMetadataFilter(where, hf)
			if err != nil {
				return nil, "", false, err
			}
			procs = append(procs, hm)
		case url == healthCheckType:
			hc, err := healthCheckFilter(where, hf)
			if err != nil {
				return nil, "", false, err
			}
			procs = append(procs, hc)
		default:
			return nil, "", false, fmt.Errorf("%s: filter type %s is not implemented by the stand-in", where, url)
		}
	}
	if !routerSeen {
		return nil, "", false, errors.New("http_filters: no envoy.filters.http.router")
	}
	streamIdle := defaultStreamIdleTimeout
	if d := hcm.GetStreamIdleTimeout(); d != nil {
		streamIdle = d.AsDuration()
	}
	t := &table{clusters: clusters, proxy100Continue: hcm.GetProxy_100Continue(), bufferLimit: bufferLimit, streamIdle: streamIdle,
		keepXFCC: hcm.GetForwardClientCertDetails() == hcmv3.HttpConnectionManager_ALWAYS_FORWARD_ONLY}
	for _, p := range procs {
		if p.proto == nil {
			t.filters = append(t.filters, &httpFilter{name: p.name, healthCheck: p.healthCheck, removeRequestHeaders: p.removeRequestHeaders,
				peer: p.peer, headerRules: p.headerRules, disabled: p.disabled})
			continue
		}
		f := &httpFilter{name: p.name, rematch: true}
		switch {
		case p.proto.GetDisableClearRouteCache():
			f.rematch = false
		case p.proto.GetRouteCacheAction() == extprocfilterv3.ExternalProcessor_RETAIN:
			f.rematch = false
		case p.proto.GetRouteCacheAction() == extprocfilterv3.ExternalProcessor_CLEAR:
			f.alwaysRematch = true
		}
		c, err := extProcClient(p, nil, targets, env)
		if err != nil {
			return nil, "", false, err
		}
		f.client, f.disabled = c, p.disabled
		t.filters = append(t.filters, f)
	}
	var rc *routev3.RouteConfiguration
	rds := ""
	switch {
	case hcm.GetRouteConfig() != nil:
		rc = hcm.GetRouteConfig()
	case hcm.GetRds() != nil:
		if err := checkFields("rds", hcm.GetRds()); err != nil {
			return nil, "", false, err
		}
		if env.static {
			return nil, "", false, errors.New("rds: a static bootstrap has no ADS stream to fetch routes from; inline the route configuration as route_config, or take the configuration over xDS (--xds-server)")
		}
		if src, _, err := configSource("rds.config_source", hcm.GetRds().GetConfigSource(), env); err != nil || src != "" {
			return nil, "", false, fmt.Errorf("rds.config_source: only ADS is implemented by the stand-in for routes (%v)", err)
		}
		rds = hcm.GetRds().GetRouteConfigName()
		rc = res.routes[rds]
		if rc == nil {
			return t, rds, false, nil // warming until RDS delivers it
		}
	default:
		return nil, "", false, errors.New("neither route_config nor rds")
	}
	hb := &hcmBuild{procs: procs, passThrough: passThrough, table: t, targets: targets, env: env}
	routes, err := hb.routes(rc)
	if err != nil {
		return nil, "", false, fmt.Errorf("route configuration %q: %w", rc.GetName(), err)
	}
	t.routes = routes
	return t, rds, true, nil
}
