package gatewaytest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/envoysim"
	"github.com/infergate/infergate/inference/wire"
)

// Reply is what a request through a Gateway's stand-in (run with
// DebugMetadata) came back with.
type Reply struct {
	Status int
	// Upstream is the endpoint the stand-in sent the request to.
	Upstream string
	// Pod is the model server that answered (its x-inference-pod).
	Pod string
	// Picked is the endpoint the request's envoy.lb metadata names.
	Picked string
	// Reason is the picker's or processor's drop reason, if it refused.
	Reason string
	Body   string
}

// Send sends method url (with body as JSON when not empty) and returns
// what came back.
func Send(t *testing.T, method, url, body string) Reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(Ctx(t), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var lb struct {
		Dest string `json:"x-gateway-destination-endpoint"`
	}
	_ = json.Unmarshal([]byte(resp.Header.Get(envoysim.DebugMetadataHeader)), &lb)
	return Reply{Status: resp.StatusCode, Upstream: resp.Header.Get(envoysim.UpstreamHeader), Pod: resp.Header.Get("x-inference-pod"),
		Picked: lb.Dest, Reason: resp.Header.Get(wire.DropReasonHeader), Body: string(b)}
}
