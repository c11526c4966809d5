package extprocfilter

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/infergate/infergate/inference/wire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// DefaultMessageTimeout is Envoy's message_timeout default.
const DefaultMessageTimeout = 200 * time.Millisecond

// Errors an exchange fails with. They are wrapped with detail; match with errors.Is.
var (
	// ErrStream is a gRPC error, a stream that could not be opened, or a
	// server that closed the stream while a response was still owed.
	ErrStream = errors.New("ext_proc stream error")
	// ErrSpurious is a response Envoy did not expect at that point.
	ErrSpurious = errors.New("spurious message")
	// ErrMessageTimeout is Envoy's per-message timeout (not in FULL_DUPLEX_STREAMED).
	ErrMessageTimeout = errors.New("ext_proc message timeout")
	// ErrInvalidMutation is a mutation Envoy rejects; always a 500, even failing open.
	ErrInvalidMutation = errors.New("invalid mutation")
	// ErrClosed is returned by an exchange used after Close.
	ErrClosed = errors.New("ext_proc exchange closed")
)

// FilterConfig describes one envoy.filters.http.ext_proc filter.
type FilterConfig struct {
	// Name identifies the filter in logs and errors.
	Name string
	// Target is the gRPC server address, host:port.
	Target string
	// TLS dials with TLS and skips certificate verification, since endpoint
	// pickers serve self-signed certificates by default; gateways configure
	// their EPP clusters the same way. False dials plaintext.
	TLS bool
	// ClientCert, when not nil, is presented in the TLS handshake when TLS
	// is on, as an Envoy cluster's common_tls_context.tls_certificates
	// (a processor run with --client-ca-file requires one). Setting it
	// without TLS is an error. It must not be modified once the filter is
	// configured.
	ClientCert *tls.Certificate
	// FailureModeAllow is Envoy's failure_mode_allow.
	FailureModeAllow bool
	// ProcessingMode defaults to DefaultProcessingMode(). Body modes NONE,
	// BUFFERED and FULL_DUPLEX_STREAMED are reproduced.
	ProcessingMode *filterv3.ProcessingMode
	// MessageTimeout defaults to DefaultMessageTimeout. Like Envoy, it does
	// not apply to a direction whose body mode is FULL_DUPLEX_STREAMED.
	MessageTimeout time.Duration
	// ForwardMetadata is filter metadata sent in every message's
	// metadata_context, by namespace (e.g. SubsetHintMetadata).
	ForwardMetadata map[string]*structpb.Struct
	// MetadataOptions is Envoy's metadata_options. Nil keeps every namespace
	// the server sets (a convenience of flag-configured tests); non-nil
	// applies Envoy's rule that only the receiving namespaces are kept, so
	// an empty list drops all of the server's dynamic metadata.
	MetadataOptions *MetadataOptions
	// StatusOnError is Envoy's status_on_error: the status of the local
	// reply when the server fails, cannot be reached or times out (Envoy
	// uses it for all three). Zero means Envoy's defaults, 500 (504 for a
	// message timeout).
	StatusOnError int
	// DisableImmediateResponse is Envoy's disable_immediate_response: an
	// immediate response from the server is a spurious message (Envoy
	// closes the stream and goes on as for any spurious message: the
	// failure mode decides) instead of the local reply it asks for.
	DisableImmediateResponse bool
}

// MetadataOptions is ExternalProcessor.metadata_options, untyped namespaces
// only (Envoy does not receive typed metadata either).
type MetadataOptions struct {
	// Forwarding is forwarding_namespaces.untyped: the stream's dynamic
	// metadata namespaces sent to the server in metadata_context. The
	// caller (the proxy, which owns the stream's metadata) selects them and
	// passes them to RequestWithMetadata / ResponseWithMetadata.
	Forwarding []string
	// Receiving is receiving_namespaces.untyped: the namespaces of the
	// server's dynamic_metadata that are kept.
	Receiving []string
}

// DefaultProcessingMode is what gateways configure for endpoint pickers:
// headers SEND, both bodies FULL_DUPLEX_STREAMED, both trailers SEND.
func DefaultProcessingMode() *filterv3.ProcessingMode {
	return &filterv3.ProcessingMode{
		RequestHeaderMode:   filterv3.ProcessingMode_SEND,
		ResponseHeaderMode:  filterv3.ProcessingMode_SEND,
		RequestBodyMode:     filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode:    filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailerMode:  filterv3.ProcessingMode_SEND,
		ResponseTrailerMode: filterv3.ProcessingMode_SEND,
	}
}

// normalize fills defaults and applies Envoy's configuration checks.
func (c FilterConfig) normalize() (FilterConfig, error) {
	if c.Name == "" {
		return c, errors.New("ext_proc filter: name is required")
	}
	if c.Target == "" {
		return c, fmt.Errorf("ext_proc filter %q: target address is required", c.Name)
	}
	if c.ClientCert != nil {
		if !c.TLS {
			return c, fmt.Errorf("ext_proc filter %q: a client certificate needs TLS", c.Name)
		}
		if len(c.ClientCert.Certificate) == 0 {
			return c, fmt.Errorf("ext_proc filter %q: the client certificate holds no certificate", c.Name)
		}
	}
	if c.ProcessingMode == nil {
		c.ProcessingMode = DefaultProcessingMode()
	} else {
		c.ProcessingMode = proto.Clone(c.ProcessingMode).(*filterv3.ProcessingMode)
	}
	if c.MessageTimeout <= 0 {
		c.MessageTimeout = DefaultMessageTimeout
	}
	m := c.ProcessingMode
	for _, hm := range []*filterv3.ProcessingMode_HeaderSendMode{&m.RequestHeaderMode, &m.ResponseHeaderMode} {
		if *hm == filterv3.ProcessingMode_DEFAULT {
			*hm = filterv3.ProcessingMode_SEND
		}
	}
	for _, tm := range []*filterv3.ProcessingMode_HeaderSendMode{&m.RequestTrailerMode, &m.ResponseTrailerMode} {
		if *tm == filterv3.ProcessingMode_DEFAULT {
			*tm = filterv3.ProcessingMode_SKIP
		}
	}
	for _, d := range []struct {
		name    string
		body    filterv3.ProcessingMode_BodySendMode
		trailer filterv3.ProcessingMode_HeaderSendMode
	}{
		{"request", m.RequestBodyMode, m.RequestTrailerMode},
		{"response", m.ResponseBodyMode, m.ResponseTrailerMode},
	} {
		switch d.body {
		case filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_BUFFERED:
		case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
			// Envoy's verifyProcessingModeConfig rejects this combination.
			if d.trailer != filterv3.ProcessingMode_SEND {
				return c, fmt.Errorf("ext_proc filter %q: %s_body_mode FULL_DUPLEX_STREAMED requires %s_trailer_mode SEND", c.Name, d.name, d.name)
			}
		default:
			return c, fmt.Errorf("ext_proc filter %q: %s_body_mode %s is not reproduced by the stand-in", c.Name, d.name, d.body)
		}
	}
	return c, nil
}

// SubsetHintMetadata builds the envoy.lb.subset_hint metadata that asks an
// endpoint picker to choose among endpoints only.
func SubsetHintMetadata(endpoints ...string) map[string]*structpb.Struct {
	list := make([]any, len(endpoints))
	for i, e := range endpoints {
		list[i] = e
	}
	s, err := structpb.NewStruct(map[string]any{wire.SubsetKey: list})
	if err != nil { // unreachable: strings always convert
		panic(err)
	}
	return map[string]*structpb.Struct{wire.SubsetHintNamespace: s}
}

// LocalReply is a response Envoy generates instead of forwarding: the
// server's immediate_response, or the error reply of a failed filter.
type LocalReply struct {
	Status  int
	Headers Headers
	Body    []byte
	// Details is Envoy's response code details (not sent to the client).
	Details string
	// Err is the failure behind a generated reply; nil for immediate_response.
	Err error
}

func (r *LocalReply) Error() string {
	if r.Err != nil {
		return fmt.Sprintf("local reply %d: %v", r.Status, r.Err)
	}
	return fmt.Sprintf("local reply %d (immediate response): %s", r.Status, r.Details)
}

func (r *LocalReply) Unwrap() error { return r.Err }
