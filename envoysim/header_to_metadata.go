package envoysim

import (
	"errors"
	"fmt"
	"strings"

	headertometadatav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

// headerToMetadataType is envoy.filters.http.header_to_metadata's config.
const headerToMetadataType = "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config"

// headerToMetadataNamespace is where the filter writes when a rule names no
// namespace: its own name (decideNamespace).
const headerToMetadataNamespace = "envoy.filters.http.header_to_metadata"

// maxMetadataValue is MAX_HEADER_VALUE_LEN: a longer value is not written.
const maxMetadataValue = 8 * 1024

// headerRule is one request_rules entry: a header's value (every instance,
// joined with ",") written as a string into the stream's dynamic metadata
// when the header is present, or a fixed value when it is missing.
type headerRule struct {
	header           string
	remove           bool
	present, missing *metadataWrite
}

// metadataWrite is a KeyValuePair: where to write, and the fixed value
// ("": the header's).
type metadataWrite struct {
	namespace, key, value string
}

// headerToMetadataFilter reads envoy.filters.http.header_to_metadata with
// request rules on headers, string values. Envoy's own rejections (Rule
// and Config constructors in filter_config.cc) are NACKs with its reason;
// what the stand-in does not reproduce (cookies, regex rewrites, NUMBER,
// PROTOBUF_VALUE and BASE64 values, response rules) is NACKed too.
func headerToMetadataFilter(where string, hf *hcmv3.HttpFilter) (extProcFilter, error) {
	cfg := &headertometadatav3.Config{}
	if err := hf.GetTypedConfig().UnmarshalTo(cfg); err != nil {
		return extProcFilter{}, fmt.Errorf("%s: %w", where, err)
	}
	if err := checkFields(where, cfg); err != nil {
		return extProcFilter{}, err
	}
	if len(cfg.GetResponseRules()) > 0 {
		return extProcFilter{}, fmt.Errorf("%s: response_rules are not implemented by the stand-in", where)
	}
	out := extProcFilter{name: hf.GetName(), disabled: hf.GetDisabled()}
	for i, r := range cfg.GetRequestRules() {
		rw := fmt.Sprintf("%s.request_rules[%d]", where, i)
		rule, err := buildHeaderRule(rw, r)
		if err != nil {
			return extProcFilter{}, err
		}
		out.headerRules = append(out.headerRules, rule)
	}
	return out, nil
}

func buildHeaderRule(where string, r *headertometadatav3.Config_Rule) (headerRule, error) {
	if err := checkAll(where, r, r.GetOnHeaderPresent(), r.GetOnHeaderMissing()); err != nil {
		return headerRule{}, err
	}
	switch {
	case r.GetCookie() != "" && r.GetHeader() != "":
		return headerRule{}, fmt.Errorf("%s: Cannot specify both header and cookie in the same rule (Envoy rejects it)", where)
	case r.GetCookie() != "":
		return headerRule{}, fmt.Errorf("%s: cookie rules are not implemented by the stand-in", where)
	case r.GetHeader() == "":
		return headerRule{}, fmt.Errorf("%s: One of Cookie or Header option needs to be specified (Envoy rejects it)", where)
	case r.GetOnHeaderPresent() == nil && r.GetOnHeaderMissing() == nil:
		return headerRule{}, fmt.Errorf("%s: rule for header '%s' has neither `on_header_present` nor `on_header_missing` set (Envoy rejects it)", where, r.GetHeader())
	case r.GetOnHeaderMissing() != nil && r.GetOnHeaderMissing().GetValue() == "":
		return headerRule{}, fmt.Errorf("%s: Cannot specify on_header_missing rule with an empty value (Envoy rejects it)", where)
	}
	out := headerRule{header: strings.ToLower(r.GetHeader()), remove: r.GetRemove()}
	var err error
	if out.present, err = buildMetadataWrite(where+".on_header_present", r.GetOnHeaderPresent()); err != nil {
		return headerRule{}, err
	}
	if out.missing, err = buildMetadataWrite(where+".on_header_missing", r.GetOnHeaderMissing()); err != nil {
		return headerRule{}, err
	}
	return out, nil
}

func buildMetadataWrite(where string, kv *headertometadatav3.Config_KeyValuePair) (*metadataWrite, error) {
	switch {
	case kv == nil:
		return nil, nil
	case kv.GetKey() == "":
		return nil, errors.New(where + ".key: must not be empty (Envoy's validation)")
	case kv.GetRegexValueRewrite() != nil && kv.GetValue() != "":
		return nil, fmt.Errorf("%s: Cannot specify both value and regex_value_rewrite (Envoy rejects it)", where)
	case kv.GetRegexValueRewrite() != nil:
		return nil, fmt.Errorf("%s.regex_value_rewrite is not implemented by the stand-in", where)
	case kv.GetType() != headertometadatav3.Config_STRING:
		return nil, fmt.Errorf("%s.type %s is not implemented by the stand-in", where, kv.GetType())
	case kv.GetEncode() != headertometadatav3.Config_NONE:
		return nil, fmt.Errorf("%s.encode %s is not implemented by the stand-in", where, kv.GetEncode())
	}
	ns := kv.GetMetadataNamespace()
	if ns == "" {
		ns = headerToMetadataNamespace
	}
	return &metadataWrite{namespace: ns, key: kv.GetKey(), value: kv.GetValue()}, nil
}

// applyHeaderRules is the filter's decodeHeaders (writeHeaderToMetadata):
// each rule in order reads the headers as the filters before it left them
// (a removed header is gone for the rules after it) and writes what it
// found; the returned metadata is what the filter sets on the stream, by
// namespace.
func applyHeaderRules(rules []headerRule, h extprocfilter.Headers) (extprocfilter.Headers, map[string]*structpb.Struct) {
	md := map[string]*structpb.Struct{}
	cloned := false
	for _, r := range rules {
		vals := h.Values(r.header)
		w, value := r.missing, ""
		if len(vals) > 0 {
			// HeaderValueSelector::extract: every instance, joined with ","
			// (getAllOfHeaderAsString), then the header removed if asked.
			w, value = r.present, strings.Join(vals, ",")
			if r.remove {
				if !cloned {
					h, cloned = h.Clone(), true
				}
				h.Del(r.header)
			}
		}
		if w == nil {
			continue
		}
		if w.value != "" {
			value = w.value
		}
		// applyKeyValue and addMetadata: an empty value or one of 8 KiB or
		// more is not written.
		if value == "" || len(value) >= maxMetadataValue {
			continue
		}
		s := md[w.namespace]
		if s == nil {
			s = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			md[w.namespace] = s
		}
		s.Fields[w.key] = structpb.NewStringValue(value)
	}
	return h, md
}
