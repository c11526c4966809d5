package scheduling

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/infergate/infergate/inference/wire"
)

func TestLabelSelectorFilter(t *testing.T) {
	eps := []Endpoint{
		ep("10.0.0.1:1", nil, map[string]string{"gpu": "a100", "zone": "a"}),
		ep("10.0.0.2:1", nil, map[string]string{"gpu": "h100", "zone": "b"}),
		ep("10.0.0.3:1", nil, map[string]string{"gpu": "a100"}),
	}
	cases := []struct {
		params string
		want   []string
	}{
		{`{"matchLabels":{"gpu":"a100"}}`, []string{"10.0.0.1:1", "10.0.0.3:1"}},
		{`{"matchExpressions":[{"key":"zone","operator":"Exists"}]}`, []string{"10.0.0.1:1", "10.0.0.2:1"}},
		{`{"matchExpressions":[{"key":"zone","operator":"DoesNotExist"}]}`, []string{"10.0.0.3:1"}},
		{`{"matchExpressions":[{"key":"gpu","operator":"In","values":["h100","b200"]}]}`, []string{"10.0.0.2:1"}},
		{`{"matchLabels":{"gpu":"a100"},"matchExpressions":[{"key":"zone","operator":"NotIn","values":["a"]}]}`, []string{"10.0.0.3:1"}},
		{`{"matchLabels":{"gpu":"tpu"}}`, nil},
	}
	for _, tc := range cases {
		t.Run(tc.params, func(t *testing.T) {
			got := build(t, "label-selector-filter", tc.params).(Filter).Filter(context.Background(), &Request{}, eps)
			if len(got) != len(tc.want) {
				t.Fatalf("kept %d endpoints, want %v", len(got), tc.want)
			}
			for i := range got {
				if got[i].Address != tc.want[i] {
					t.Fatalf("kept %s, want %v", got[i].Address, tc.want)
				}
			}
		})
	}
	if _, err := Builtins()["label-selector-filter"]("f", json.RawMessage(`{"matchExpressions":[{"key":"a","operator":"Near"}]}`)); err == nil {
		t.Error("unknown operator accepted")
	}
}

func TestHeaderTestingFilter(t *testing.T) {
	eps := []Endpoint{
		ep("10.0.0.1:8000", nil, nil),
		ep("10.0.0.1:8001", nil, nil), // a second data-parallel rank of the same pod
		ep("10.0.0.2:8000", nil, nil),
		ep("[fd00::3]:8000", nil, nil),
	}
	cases := []struct {
		name   string
		header *string
		want   []string
	}{
		{"no header keeps all", nil, []string{"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "[fd00::3]:8000"}},
		{"empty header keeps all", ptr(" "), []string{"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "[fd00::3]:8000"}},
		{"exact ip:port", ptr("10.0.0.2:8000"), []string{"10.0.0.2:8000"}},
		{"ip alone keeps every rank", ptr("10.0.0.1"), []string{"10.0.0.1:8000", "10.0.0.1:8001"}},
		{"list with spaces", ptr(" 10.0.0.1:8001 , 10.0.0.2:8000"), []string{"10.0.0.1:8001", "10.0.0.2:8000"}},
		{"ipv6 spelt differently", ptr("[fd00:0::3]:8000"), []string{"[fd00::3]:8000"}},
		{"wrong port", ptr("10.0.0.2:9000"), nil},
		{"unknown ip", ptr("256.256.256.256"), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := &Request{Headers: map[string]string{}}
			if tc.header != nil {
				req.Headers[wire.EndpointSelectionHeader] = *tc.header
			}
			got := build(t, HeaderTestingFilterType, "").(Filter).Filter(context.Background(), req, eps)
			var addrs []string
			for _, e := range got {
				addrs = append(addrs, e.Address)
			}
			if fmt.Sprint(addrs) != fmt.Sprint(tc.want) {
				t.Fatalf("kept %v, want %v", addrs, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
