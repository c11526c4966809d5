package envoysim

import (
	"fmt"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	healthcheckv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/health_check/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// extProcFilter is one ext_proc filter's listener-level config, or (proto
// nil) a health check, header mutation, header-to-metadata or Istio
// metadata exchange filter.
type extProcFilter struct {
	name                 string
	disabled             bool // HttpFilter.disabled
	proto                *extprocfilterv3.ExternalProcessor
	healthCheck          []headerMatch
	removeRequestHeaders []string
	peer                 *peerMetadataFilter
	headerRules          []headerRule
}

// headerMutationFilter reads envoy.filters.http.header_mutation when all
// it does is remove request headers (what the Envoy Gateway extension uses
// to drop a client's x-gateway-destination-endpoint before the picker).
func headerMutationFilter(where string, hf *hcmv3.HttpFilter) (extProcFilter, error) {
	hm := &headermutationv3.HeaderMutation{}
	if err := hf.GetTypedConfig().UnmarshalTo(hm); err != nil {
		return extProcFilter{}, fmt.Errorf("%s: %w", where, err)
	}
	if err := checkAll(where, hm, hm.GetMutations()); err != nil {
		return extProcFilter{}, err
	}
	out := extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled()}
	for i, m := range hm.GetMutations().GetRequestMutations() {
		if err := checkFields(fmt.Sprintf("%s.mutations.request_mutations[%d]", where, i), m); err != nil {
			return extProcFilter{}, err
		}
		out.removeRequestHeaders = append(out.removeRequestHeaders, strings.ToLower(m.GetRemove()))
	}
	return out, nil
}

// healthCheckFilter reads envoy.filters.http.health_check in
// non-pass-through mode: a request matching every header is answered 200 by
// the filter itself (Envoy Gateway's readiness listener uses it).
func healthCheckFilter(where string, hf *hcmv3.HttpFilter) (extProcFilter, error) {
	hc := &healthcheckv3.HealthCheck{}
	if err := hf.GetTypedConfig().UnmarshalTo(hc); err != nil {
		return extProcFilter{}, fmt.Errorf("%s: %w", where, err)
	}
	if err := checkFields(where, hc); err != nil {
		return extProcFilter{}, err
	}
	if hc.GetPassThroughMode().GetValue() {
		return extProcFilter{}, fmt.Errorf("%s: pass_through_mode is not implemented by the stand-in", where)
	}
	if len(hc.GetHeaders()) == 0 {
		return extProcFilter{}, fmt.Errorf("%s: a health check without headers would answer every request", where)
	}
	out := extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled()}
	for i, h := range hc.GetHeaders() {
		hm, err := buildHeaderMatch(fmt.Sprintf("%s.headers[%d]", where, i), h)
		if err != nil {
			return extProcFilter{}, err
		}
		out.healthCheck = append(out.healthCheck, hm)
	}
	return out, nil
}

// checkExtProc NACKs ExternalProcessor settings the stand-in does not reproduce.
func checkExtProc(where string, ep *extprocfilterv3.ExternalProcessor) error {
	if err := checkAll(where, ep, ep.GetGrpcService(), ep.GetGrpcService().GetEnvoyGrpc(), ep.GetProcessingMode(),
		ep.GetMetadataOptions(), ep.GetMetadataOptions().GetForwardingNamespaces(), ep.GetMetadataOptions().GetReceivingNamespaces(),
		ep.GetMutationRules()); err != nil {
		return err
	}
	if ep.GetGrpcService().GetEnvoyGrpc() == nil {
		return fmt.Errorf("%s: grpc_service.envoy_grpc is required (google_grpc and http_service are not implemented)", where)
	}
	if ep.GetDisableClearRouteCache() && ep.GetRouteCacheAction() != extprocfilterv3.ExternalProcessor_DEFAULT {
		// Envoy rejects the pair.
		return fmt.Errorf("%s: only one of disable_clear_route_cache and route_cache_action may be set", where)
	}
	mr := ep.GetMutationRules()
	if mr.GetAllowAllRouting().GetValue() || mr.GetAllowEnvoy().GetValue() || mr.GetDisallowSystem().GetValue() ||
		mr.GetDisallowAll().GetValue() || mr.GetDisallowIsError().GetValue() {
		return fmt.Errorf("%s: mutation_rules other than Envoy's defaults are not implemented by the stand-in", where)
	}
	if ep.GetAllowModeOverride() {
		m := ep.GetProcessingMode()
		if m.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED || m.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			// Envoy ignores mode overrides in FULL_DUPLEX_STREAMED; elsewhere they change the exchange.
			return fmt.Errorf("%s: allow_mode_override is implemented only where Envoy ignores it (both bodies FULL_DUPLEX_STREAMED)", where)
		}
	}
	return nil
}

// routeOverrides is ExtProcPerRoute merged over the levels that carry one
// (route configuration, virtual host, route), as Envoy's ext_proc merges
// them: disabled from the most specific level, every other setting from the
// most specific level that sets it.
type routeOverrides struct {
	disabled   bool
	mode       *extprocfilterv3.ProcessingMode
	grpc       *corev3.GrpcService
	forwarding *extprocfilterv3.MetadataOptions_MetadataNamespaces
	receiving  *extprocfilterv3.MetadataOptions_MetadataNamespaces
	failOpen   *bool
}

// merge applies a more specific level.
func (o *routeOverrides) merge(pr *extprocfilterv3.ExtProcPerRoute) {
	o.disabled = pr.GetDisabled()
	ov := pr.GetOverrides()
	if ov.GetProcessingMode() != nil {
		o.mode = ov.GetProcessingMode()
	}
	if ov.GetGrpcService() != nil {
		o.grpc = ov.GetGrpcService()
	}
	if mo := ov.GetMetadataOptions(); mo != nil {
		if mo.GetForwardingNamespaces() != nil {
			o.forwarding = mo.GetForwardingNamespaces()
		}
		if mo.GetReceivingNamespaces() != nil {
			o.receiving = mo.GetReceivingNamespaces()
		}
	}
	if fo := ov.GetFailureModeAllow(); fo != nil {
		v := fo.GetValue()
		o.failOpen = &v
	}
}

// extProcClient makes the client for filter p on one route: the listener's
// config with the route's merged overrides applied (nil: none).
func extProcClient(p extProcFilter, ov *routeOverrides, targets map[string]grpcTarget, env buildEnv) (*extprocfilter.Client, error) {
	ep := p.proto
	mode, gs, failOpen := ep.GetProcessingMode(), ep.GetGrpcService(), ep.GetFailureModeAllow()
	fwd, rcv := ep.GetMetadataOptions().GetForwardingNamespaces(), ep.GetMetadataOptions().GetReceivingNamespaces()
	if ov != nil {
		if ov.mode != nil {
			mode = ov.mode
		}
		if ov.grpc != nil {
			gs = ov.grpc
		}
		if ov.forwarding != nil {
			fwd = ov.forwarding
		}
		if ov.receiving != nil {
			rcv = ov.receiving
		}
		if ov.failOpen != nil {
			failOpen = *ov.failOpen
		}
	}
	if mode == nil {
		// ProcessingMode's own defaults: headers SEND, bodies NONE, trailers SKIP.
		mode = &extprocfilterv3.ProcessingMode{}
	}
	cfg := extprocfilter.FilterConfig{
		Name:             p.name,
		FailureModeAllow: failOpen,
		ProcessingMode:   mode,
		MetadataOptions:  &extprocfilter.MetadataOptions{Forwarding: fwd.GetUntyped(), Receiving: rcv.GetUntyped()},
		StatusOnError:    int(ep.GetStatusOnError().GetCode()),
		// Not in ExtProcOverrides: always the listener filter's.
		DisableImmediateResponse: ep.GetDisableImmediateResponse(),
	}
	if d := ep.GetMessageTimeout(); d != nil {
		cfg.MessageTimeout = d.AsDuration()
	}
	cluster := gs.GetEnvoyGrpc().GetClusterName()
	tgt, ok := targets[cluster]
	if !ok || tgt.addr == "" {
		// Envoy's stream start fails at once, before the request reaches
		// the filter, so the filter's failure mode decides even with a
		// body (async_client_impl.cc AsyncStreamImpl::initialize: no
		// thread-local cluster, or the router's "no healthy upstream"
		// reset inside sendHeaders).
		why := fmt.Errorf("cluster %q has no healthy host", cluster)
		if !ok {
			why = fmt.Errorf("cluster %q not found", cluster)
		}
		cfg.Target = "cluster:" + cluster
		return extprocfilter.NewClientStarting(cfg, func() (*grpc.ClientConn, error) { return nil, why })
	}
	cfg.Target, cfg.TLS, cfg.ClientCert = tgt.addr, tgt.tls, tgt.cert
	if tgt.cl != nil {
		return healthAwareClient(cfg, cluster, tgt.cl, env)
	}
	c, err := env.clientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("ext_proc filter %q (cluster %q): %w", p.name, cluster, err)
	}
	return c, nil
}

// routeFilters is the chain state and ext_proc client of every filter on a
// route whose typed_per_filter_config levels (least specific first) are
// levels.
func (hb *hcmBuild) routeFilters(where string, levels []map[string]*anypb.Any) ([]chainState, []*extprocfilter.Client, error) {
	for _, level := range levels {
		for name := range level {
			if hb.passThrough[name] {
				return nil, nil, fmt.Errorf("%s: typed_per_filter_config[%q]: per-route config of a pass-through filter is not implemented by the stand-in", where, name)
			}
		}
	}
	var chain []chainState
	var filters []*extprocfilter.Client
	for i, p := range hb.procs {
		if p.proto == nil {
			for _, level := range levels {
				if _, ok := level[p.name]; ok {
					return nil, nil, fmt.Errorf("%s: typed_per_filter_config[%q]: per-route config of this filter is not implemented by the stand-in", where, p.name)
				}
			}
			chain = append(chain, chainDefault)
			filters = append(filters, nil)
			continue
		}
		state, c, err := routeFilter(where, p, hb.table.filters[i].client, levels, hb.targets, hb.env)
		if err != nil {
			return nil, nil, err
		}
		chain = append(chain, state)
		filters = append(filters, c)
	}
	return chain, filters, nil
}

// routeFilter reads the typed_per_filter_config entries for filter p on a
// route, least specific first (route configuration, virtual host, route).
// It returns whether the most specific entry puts the filter in the chain
// (Envoy decides the chain from the route a request starts on: any entry
// enables a filter HttpFilter.disabled left out, FilterConfig.disabled
// removes it), and the ext_proc client for the route (nil when
// ExtProcPerRoute.disabled).
func routeFilter(where string, p extProcFilter, listenerClient *extprocfilter.Client, levels []map[string]*anypb.Any, targets map[string]grpcTarget, env buildEnv) (chainState, *extprocfilter.Client, error) {
	where = fmt.Sprintf("%s.typed_per_filter_config[%q]", where, p.name)
	state := chainDefault
	var ov *routeOverrides
	for _, level := range levels {
		cfg, ok := level[p.name]
		if !ok {
			continue
		}
		if cfg.GetTypeUrl() == filterConfigType {
			fc := &routev3.FilterConfig{}
			if err := cfg.UnmarshalTo(fc); err != nil {
				return 0, nil, fmt.Errorf("%s: %w", where, err)
			}
			if err := checkFields(where, fc); err != nil {
				return 0, nil, err
			}
			switch {
			case fc.GetDisabled():
				state = chainDisabled
				continue
			case fc.GetConfig() == nil:
				return 0, nil, fmt.Errorf("%s: empty FilterConfig (Envoy rejects an empty per filter configuration)", where)
			case fc.GetConfig().GetTypeUrl() == "":
				// An empty config enables the filter with its listener config.
				state = chainEnabled
				continue
			}
			cfg = fc.GetConfig()
		}
		if cfg.GetTypeUrl() != extProcPerRouteType {
			return 0, nil, fmt.Errorf("%s: type %s is not implemented by the stand-in", where, cfg.GetTypeUrl())
		}
		pr := &extprocfilterv3.ExtProcPerRoute{}
		if err := cfg.UnmarshalTo(pr); err != nil {
			return 0, nil, fmt.Errorf("%s: %w", where, err)
		}
		o := pr.GetOverrides()
		if err := checkAll(where, pr, o, o.GetProcessingMode(), o.GetGrpcService(), o.GetGrpcService().GetEnvoyGrpc(),
			o.GetMetadataOptions(), o.GetMetadataOptions().GetForwardingNamespaces(), o.GetMetadataOptions().GetReceivingNamespaces()); err != nil {
			return 0, nil, err
		}
		if !pr.GetDisabled() && o == nil {
			return 0, nil, fmt.Errorf("%s: ExtProcPerRoute needs disabled: true or overrides", where)
		}
		if o.GetGrpcService() != nil && o.GetGrpcService().GetEnvoyGrpc() == nil {
			return 0, nil, fmt.Errorf("%s: overrides.grpc_service.envoy_grpc is required (google_grpc and http_service are not implemented for ext_proc)", where)
		}
		if ov == nil {
			ov = &routeOverrides{}
		}
		ov.merge(pr)
		state = chainEnabled
	}
	switch {
	case ov == nil:
		return state, listenerClient, nil
	case ov.disabled:
		return state, nil, nil
	}
	c, err := extProcClient(p, ov, targets, env)
	return state, c, err
}
