package payload_test

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/inference/wire"
)

// TestPolicyBodyLimitAppliesAsChunksArrive: the policy's maxBodyBytes
// refuses an upload at the chunk that passes it, while the body is still
// open, instead of buffering up to the server's (larger) limit and
// deciding at the end; a stalled oversized upload then holds nothing.
func TestPolicyBodyLimitAppliesAsChunksArrive(t *testing.T) {
	r := newRig(t, []byte(`{"limits":{"maxBodyBytes":1000}}`))
	conn, err := grpc.NewClient(r.svc.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *extprocv3.ProcessingRequest) {
		t.Helper()
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: "content-type", RawValue: []byte("application/json")},
		}}}},
	})
	chunk := make([]byte, 600)
	for range 2 { // the second chunk passes 1000 bytes; the body stays open
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk}}})
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("no answer while the body is open: %v", err)
	}
	ir := resp.GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 413 {
		t.Fatalf("want immediate 413, got %v", resp)
	}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == wire.DropReasonHeader && string(h.GetHeader().GetRawValue()) == "request-too-large" {
			return
		}
	}
	t.Fatalf("drop reason not request-too-large: %v", ir.GetHeaders())
}
