package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/childproc"
)

// TestActiveActivePickersRouteAsOneThroughACrash: the two picker replicas
// behind the gateway's round robin route as one picker would: new
// prefixes spread over both pods, and every later request for a prefix
// goes to the pod that has it, whichever replica takes it. One replica
// crashes; its replacement, joining the survivor, is given its index and
// sends every prefix home from its first request.
func TestActiveActivePickersRouteAsOneThroughACrash(t *testing.T) {
	c := newCluster(t)
	gw := c.gateways[1].base // FailClose: a request is answered only through a pick
	pickers := c.svcs[pickerName]
	for _, r := range pickers.replicas() {
		waitMetric(t, r, "infergate_epp_peers", 1)
	}

	const prefixes = 16
	home := map[int]string{}
	perPod := map[string]int{}
	for i := range prefixes {
		home[i] = ask(t, gw, i)
		perPod[home[i]]++
	}
	for _, n := range perPod {
		if len(perPod) != 2 || n < prefixes/2-2 || n > prefixes/2+2 {
			t.Fatalf("%d new prefixes through two replicas landed %v on the pods; want them spread as one picker spreads them", prefixes, perPod)
		}
	}
	stray := func(round string) {
		t.Helper()
		for i := range prefixes {
			if got := ask(t, gw, i); got != home[i] {
				t.Errorf("%s: prefix %d went to %s, its home is %s", round, i, got, home[i])
			}
		}
	}
	for round := range 2 {
		stray(fmt.Sprintf("round %d", round+1))
	}
	for _, r := range pickers.replicas() {
		m := metrics(t, r)
		if m["infergate_epp_peer_decisions_received_total"] == 0 {
			t.Errorf("replica %s learned no decision of its peer", r.ip)
		}
		t.Logf("replica %s: %v decisions learned from its peer, index agreed %v, differed %v", r.ip,
			m["infergate_epp_peer_decisions_received_total"],
			m[`infergate_epp_peer_decisions_total{index="agreed"}`], m[`infergate_epp_peer_decisions_total{index="differed"}`])
	}

	c.crash(pickers)
	fresh := pickers.replicas()[len(pickers.replicas())-1]
	if m := metrics(t, fresh); m[`infergate_epp_peer_state_merges_total{result="ok"}`] < 1 {
		t.Fatalf("the replacement merged no state on joining: %v", m[`infergate_epp_peer_state_merges_total{result="ok"}`])
	}
	// Until its health check takes the dead replica out, the gateway's
	// streams to it fail (FailClose; TestPickerCrash bounds that); until
	// it resolves the Service again and checks the new replica, the
	// survivor takes every stream; then both do.
	deadline := time.Now().Add(dnsRefresh + recoveryBound)
	for childproc.Sum(metrics(t, fresh), "infergate_epp_decisions_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the gateway never sent the replacement a request")
		}
		if pod, err := try(gw, 0); err == nil && pod != home[0] {
			t.Errorf("while a replica was down, prefix 0 went to %s, its home is %s", pod, home[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := childproc.Sum(metrics(t, fresh), "infergate_epp_decisions_total")
	stray("after the crash")
	if took := childproc.Sum(metrics(t, fresh), "infergate_epp_decisions_total") - before; took < prefixes/4 {
		t.Errorf("the replacement took %v of %d requests; want its share of the round robin", took, prefixes)
	}
}

// ask sends prefix i's prompt through the gateway and returns the pod
// that answered; anything but a 200 ends the test.
func ask(t *testing.T, base string, i int) string {
	t.Helper()
	pod, err := try(base, i)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// try sends prefix i's prompt (about 4 KB of its own text, then a question
// of this request's) and returns the pod that answered it.
func try(base string, i int) (string, error) {
	prompt := strings.Repeat(fmt.Sprintf("Prefix %d is the long shared context of this conversation. ", i), 64) + fmt.Sprintf("Question %d?", time.Now().UnixNano())
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4}`, sim.DefaultModel, prompt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("prefix %d: %d %s", i, resp.StatusCode, b)
	}
	return resp.Header.Get("x-inference-pod"), nil
}

func metrics(t *testing.T, r *replica) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := childproc.Metrics(ctx, r.p.MetricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// waitMetric waits until the replica's gauge name reaches want.
func waitMetric(t *testing.T, r *replica, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for metrics(t, r)[name] < want {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s: %s is %v after 15 s, want %v", r.ip, name, metrics(t, r)[name], want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
