package scheduling

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/infergate/infergate/extproc/epp/datastore"
	"github.com/infergate/infergate/inference/wire"
)

// Filter plugin types.
const (
	LabelSelectorFilterType = "label-selector-filter"
	HeaderTestingFilterType = "header-based-testing-filter"
)

// labelSelectorFilter keeps the endpoints whose labels match, as a
// Kubernetes label selector does.
type labelSelectorFilter struct {
	named
	match map[string]string
	exprs []labelExpr
}

type labelExpr struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

func newLabelSelectorFilter(id named, params json.RawMessage) (Plugin, error) {
	var p struct {
		MatchLabels      map[string]string `json:"matchLabels"`
		MatchExpressions []labelExpr       `json:"matchExpressions"`
	}
	if err := DecodeParams(params, &p); err != nil {
		return nil, err
	}
	if len(p.MatchLabels) == 0 && len(p.MatchExpressions) == 0 {
		return nil, fmt.Errorf("parameters: matchLabels or matchExpressions is required")
	}
	for i, e := range p.MatchExpressions {
		switch e.Operator {
		case "In", "NotIn":
			if len(e.Values) == 0 {
				return nil, fmt.Errorf("parameters.matchExpressions[%d]: operator %s needs values", i, e.Operator)
			}
		case "Exists", "DoesNotExist":
		default:
			return nil, fmt.Errorf("parameters.matchExpressions[%d].operator: %q (want In, NotIn, Exists or DoesNotExist)", i, e.Operator)
		}
	}
	return &labelSelectorFilter{named: id, match: p.MatchLabels, exprs: p.MatchExpressions}, nil
}

func (f *labelSelectorFilter) Filter(_ context.Context, _ *Request, eps []Endpoint) []Endpoint {
	out := make([]Endpoint, 0, len(eps))
	for _, e := range eps {
		if f.matches(e.Labels) {
			out = append(out, e)
		}
	}
	return out
}

func (f *labelSelectorFilter) matches(labels map[string]string) bool {
	for k, v := range f.match {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range f.exprs {
		v, ok := labels[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		}
	}
	return true
}

// headerTestingFilter keeps only the endpoints a request names in
// wire.EndpointSelectionHeader, a comma-separated list of IPs or ip:port.
// It exists for tests: conformance suites use it to steer requests, and
// the routing benchmark's oracle to apply its hand split through the same
// path as every other picker. Any client can steer its own request with
// the header, so production profiles leave it out; the payload processor
// removes a client's copy, so steering works only on a path without it.
type headerTestingFilter struct{ named }

// Filter keeps the named endpoints; a request naming none of the
// candidates keeps none, so it is answered 503 rather than routed
// somewhere the test did not ask for. A request without the header (or
// with an empty one) keeps them all, as the upstream conformance suite's
// picker does: its body-less status probes name no endpoint.
func (headerTestingFilter) Filter(_ context.Context, req *Request, eps []Endpoint) []Endpoint {
	list := req.Headers[wire.EndpointSelectionHeader]
	if strings.TrimSpace(list) == "" {
		return eps
	}
	set := datastore.NewAddressSet()
	set.AddList(list)
	out := make([]Endpoint, 0, 1)
	for _, e := range eps {
		if set.Allows(e.Endpoint) {
			out = append(out, e)
		}
	}
	return out
}
