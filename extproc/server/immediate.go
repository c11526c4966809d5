package server

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/infergate/infergate/inference"
	"github.com/infergate/infergate/inference/wire"
)

// ImmediateResponse turns a rejection into an ext_proc immediate response:
// the status, a drop-reason header, and a JSON error body.
func ImmediateResponse(r *Rejection) *extprocv3.ProcessingResponse {
	body := inference.ErrorJSON(r.Status, r.Reason, r.Message)
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		rawHeader("content-type", "application/json"),
	}}
	if r.Reason != "" {
		hm.SetHeaders = append(hm.SetHeaders, rawHeader(wire.DropReasonHeader, r.Reason))
	}
	for _, h := range r.Headers {
		hm.SetHeaders = append(hm.SetHeaders, rawHeader(h.Name, h.Value))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(r.Status)},
			Headers: hm,
			Body:    body,
			Details: r.Reason,
		},
	}}
}

func rawHeader(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: name, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}
