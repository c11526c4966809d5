package envoysim

import (
	"slices"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/infergate/infergate/envoysim/extprocfilter"
)

func TestParseFilterFlag(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    extprocfilter.FilterConfig
		hosts   []string
		wantErr string
	}{
		{in: "epp=127.0.0.1:9002+127.0.0.2:9002,failure-mode=FailOpen", want: extprocfilter.FilterConfig{Name: "epp", Target: "127.0.0.1:9002", FailureModeAllow: true},
			hosts: []string{"127.0.0.1:9002", "127.0.0.2:9002"}},
		{in: "epp=127.0.0.1:9002+", wantErr: "address"},
		{in: "epp=127.0.0.1:9002", want: extprocfilter.FilterConfig{Name: "epp", Target: "127.0.0.1:9002"}},
		{in: "epp=127.0.0.1:9002,failure-mode=FailOpen,tls=true", want: extprocfilter.FilterConfig{Name: "epp", Target: "127.0.0.1:9002", FailureModeAllow: true, TLS: true}},
		{in: "payload=localhost:9004,failure-mode=FailClose,tls=false", want: extprocfilter.FilterConfig{Name: "payload", Target: "localhost:9004"}},
		{in: "127.0.0.1:9002", wantErr: "want name=host:port"},
		{in: "epp=127.0.0.1", wantErr: "address"},
		{in: "epp=127.0.0.1:0", wantErr: "invalid port"},
		{in: "epp=127.0.0.1:9002,failure-mode=open", wantErr: "FailOpen or FailClose"},
		{in: "epp=127.0.0.1:9002,tls=maybe", wantErr: "true or false"},
		{in: "epp=127.0.0.1:9002,mode=x", wantErr: "unknown option"},
		{in: "epp=127.0.0.1:9002,response-body=sometimes", wantErr: "streamed or none"},
	} {
		got, hosts, err := ParseFilterFlag(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if tc.hosts == nil {
			tc.hosts = []string{tc.want.Target}
		}
		if err != nil || !slices.Equal(hosts, tc.hosts) || got.Name != tc.want.Name || got.Target != tc.want.Target || got.FailureModeAllow != tc.want.FailureModeAllow || got.TLS != tc.want.TLS {
			t.Errorf("%q: got %+v, %v", tc.in, got, err)
		}
	}
	fc, _, err := ParseFilterFlag("epp=127.0.0.1:9002,response-body=none")
	if err != nil || fc.ProcessingMode.GetResponseBodyMode() != filterv3.ProcessingMode_NONE ||
		fc.ProcessingMode.GetResponseTrailerMode() != filterv3.ProcessingMode_SKIP ||
		fc.ProcessingMode.GetRequestBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Fatalf("response-body=none: %+v, %v", fc.ProcessingMode, err)
	}
}
