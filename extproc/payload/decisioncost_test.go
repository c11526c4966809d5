package payload_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/inference/policy"
	"github.com/infergate/infergate/inference/wire"
)

// TestDecisionCostIsThePolicys: the processor charges a decision what
// its policy says deciding the body takes (policy.WorkBytes), so with the
// buffer budget set to the guardrails' work for a body plus the body (less
// than a decision needs even alone: a sixteenth of the budget is kept for
// small requests), that body is refused 413 under guardrails and
// forwarded under a policy that reads no text.
func TestDecisionCostIsThePolicys(t *testing.T) {
	const guardrails = `{"pii":[{"name":"email","detector":"email","action":"mask"}]}`
	body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat("Summarise the report. Mail jane@example.com. ", 5000)))
	pol, err := policy.Compile(mustDecode(t, guardrails))
	if err != nil {
		t.Fatal(err)
	}
	cost := pol.WorkBytes(len(body))
	if cost <= 1<<20 {
		t.Fatalf("the body costs %d bytes to decide: small decisions (up to 1 MiB) are never refused; make it larger", cost)
	}
	budget := cost + int64(len(body))
	for _, tc := range []struct {
		name, config string
		want         int
	}{
		{"guardrails", guardrails, 413},
		{"model headers only", `{}`, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRigWith(t, []byte(tc.config), func(c *payload.Config) {
				c.KeepStreamOptions = true
				c.Server.Limits.BufferBudgetBytes = budget
			})
			res := r.request(t, body, 16<<10)
			got := outcome(res)
			if got.Status != tc.want {
				t.Fatalf("status %d, want %d (%s)", got.Status, tc.want, got.Body)
			}
			if tc.want == 413 && got.Headers[wire.DropReasonHeader] != "request-too-large" {
				t.Fatalf("drop reason %q, want request-too-large", got.Headers[wire.DropReasonHeader])
			}
		})
	}
}

func mustDecode(t *testing.T, js string) *policy.Config {
	t.Helper()
	c, err := policy.DecodeJSON([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
