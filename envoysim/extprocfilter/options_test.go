package extprocfilter

import (
	"errors"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/envoysim/fakeproc"
	"github.com/infergate/infergate/inference/wire"
)

// metadataServer answers the request headers with dynamic metadata in two
// namespaces and records the metadata_context of every message.
func metadataServer(c *fakeproc.Conn) error {
	for {
		req, err := c.Recv()
		if err != nil {
			return nil
		}
		switch req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			r := fakeproc.HeadersResp(false, nil)
			r.DynamicMetadata, _ = structpb.NewStruct(map[string]any{
				wire.LBNamespace: map[string]any{wire.DestinationEndpointKey: "10.0.0.1:8000"},
				"io.example":     map[string]any{"k": "v"},
			})
			if err := c.Send(r); err != nil {
				return err
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			if err := c.Send(fakeproc.HeadersResp(true, nil)); err != nil {
				return err
			}
		}
	}
}

func TestMetadataOptions(t *testing.T) {
	fs := fakeproc.Start(t, metadataServer)
	mode := DefaultProcessingMode()
	mode.RequestBodyMode, mode.ResponseBodyMode = 0, 0
	for _, tc := range []struct {
		name string
		opts *MetadataOptions
		want []string // namespaces kept
	}{
		{"nil keeps every namespace", nil, []string{"io.example", wire.LBNamespace}},
		{"receiving envoy.lb only", &MetadataOptions{Receiving: []string{wire.LBNamespace}}, []string{wire.LBNamespace}},
		{"no receiving namespaces drops all", &MetadataOptions{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, FilterConfig{Target: fs.Addr, ProcessingMode: mode, MetadataOptions: tc.opts})
			ex := c.Open(fakeproc.Ctx(t))
			defer ex.Close()
			if _, _, err := ex.Request(Request{}.headers(), nil); err != nil {
				t.Fatal(err)
			}
			got := ex.DynamicMetadata()
			if len(got) != len(tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
			for _, ns := range tc.want {
				if got[ns] == nil {
					t.Errorf("namespace %s dropped", ns)
				}
			}
		})
	}
}

func TestForwardedMetadata(t *testing.T) {
	fs := fakeproc.Start(t, metadataServer)
	mode := DefaultProcessingMode()
	mode.RequestBodyMode, mode.ResponseBodyMode = 0, 0
	c := newClient(t, FilterConfig{Target: fs.Addr, ProcessingMode: mode, ForwardMetadata: SubsetHintMetadata("10.0.0.9:1")})
	ex := c.Open(fakeproc.Ctx(t))
	defer ex.Close()
	reqMD := map[string]*structpb.Struct{"io.request": {}}
	if _, _, err := ex.RequestWithMetadata(Request{}.headers(), nil, reqMD); err != nil {
		t.Fatal(err)
	}
	// No served endpoint in md: unlike Response, nothing is added.
	if _, _, err := ex.ResponseWithMetadata(Response{}.headers(), nil, map[string]*structpb.Struct{"io.response": {}}); err != nil {
		t.Fatal(err)
	}
	msgs := fs.Messages()
	if len(msgs) != 2 {
		t.Fatalf("%d messages", len(msgs))
	}
	for i, want := range []string{"io.request", "io.response"} {
		fm := msgs[i].GetMetadataContext().GetFilterMetadata()
		if len(fm) != 1 || fm[want] == nil {
			t.Errorf("message %d metadata_context = %v, want only %s (ForwardMetadata is replaced)", i, fm, want)
		}
	}
}

func TestStatusOnError(t *testing.T) {
	crash := func(c *fakeproc.Conn) error {
		_, _ = c.Recv()
		return errors.New("picker crashed")
	}
	fs := fakeproc.Start(t, crash)
	for _, tc := range []struct {
		name   string
		status int
		want   int
	}{
		{"default", 0, 500},
		{"status_on_error 503", 503, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, FilterConfig{Target: fs.Addr, StatusOnError: tc.status})
			res, err := c.Run(fakeproc.Ctx(t), Request{Body: [][]byte{[]byte("{}")}})
			if err != nil {
				t.Fatal(err)
			}
			if res.LocalReply == nil || res.LocalReply.Status != tc.want {
				t.Fatalf("local reply %v, want %d", res.LocalReply, tc.want)
			}
		})
	}
}

func TestSharedConn(t *testing.T) {
	fs := fakeproc.Start(t, metadataServer)
	conn, err := Dial(fs.Addr, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mode := DefaultProcessingMode()
	mode.RequestBodyMode, mode.ResponseBodyMode = 0, 0
	for i := range 2 {
		c, err := NewClientConn(FilterConfig{Name: "shared", ProcessingMode: mode}, conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Run(fakeproc.Ctx(t), Request{}); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := conn.GetState().String(); got == "SHUTDOWN" {
		t.Fatal("closing a client closed the shared channel")
	}
}
