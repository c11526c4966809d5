package poolfile

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	cases := []struct {
		name, text, wantErr string
	}{
		{"ok", "name: p\nendpoints:\n- address: 10.0.0.1:8000\n  engine: vllm\n  labels: {a: b}\nobjectives:\n- {name: batch, priority: -1}\n", ""},
		{"hostname", "endpoints:\n- address: sim.local:8000\n", "endpoints[0]: address \"sim.local:8000\": host must be an IP address"},
		{"no port", "endpoints:\n- address: 10.0.0.1\n", "endpoints[0]: address \"10.0.0.1\""},
		{"duplicate", "endpoints:\n- address: 10.0.0.1:1\n- address: 10.0.0.1:1\n", "endpoints[1].address: 10.0.0.1:1 listed twice"},
		{"bad engine", "endpoints:\n- address: 10.0.0.1:1\n  engine: tgi\n", `unknown engine "tgi"`},
		{"unknown field", "endpoint:\n- address: 10.0.0.1:1\n", `unknown field "endpoint"`},
		{"objective without name", "endpoints: []\nobjectives:\n- priority: 1\n", "objectives[0].name: required"},
		{"objective twice", "endpoints: []\nobjectives:\n- {name: a}\n- {name: a}\n", `objectives[1].name: "a" listed twice`},
		{"empty", "", "empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parse([]byte(tc.text))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if objs := f.objectives(); len(f.specs("")) != 1 || len(objs) != 1 || objs[0].Name != "batch" || objs[0].Priority != -1 {
					t.Fatalf("parsed %+v", f)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}
