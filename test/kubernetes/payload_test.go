package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/infergate/infergate/envoysim/extprocfilter"
	"github.com/infergate/infergate/extproc/payload"
	"github.com/infergate/infergate/extproc/server"
)

// baseOf asks the payload processor, over real gRPC, which base model a
// request for model is routed to.
func baseOf(t *testing.T, c *extprocfilter.Client, model string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ex := c.Open(ctx)
	defer ex.Close()
	res, err := ex.RunRequest(extprocfilter.Request{Body: [][]byte{[]byte(`{"model":"` + model + `","prompt":"x"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalReply != nil {
		return fmt.Sprintf("rejected %d", res.LocalReply.Status)
	}
	return res.Headers.Get("x-gateway-base-model-name")
}

func adapterConfigMap(ns, name, base, adapters string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{payload.ManagedLabel: "true"}},
		Data:       map[string]string{payload.BaseModelKey: base, payload.AdaptersKey: adapters},
	}
}

// TestPayloadAdaptersFromConfigMaps runs the payload processor with its
// adapter map fed by labelled ConfigMaps: adding, editing and removing one
// changes where an adapter's requests go, an unlabelled ConfigMap counts
// for nothing, and entries merge with the config file's.
func TestPayloadAdaptersFromConfigMaps(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	file := filepath.Join(t.TempDir(), "payload.yaml")
	if err := os.WriteFile(file, []byte("models:\n  bases:\n  - name: qwen\n    adapters: [qwen-sql]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc, err := payload.New(payload.Config{
		Server:     server.Options{GRPCAddr: "127.0.0.1:0", DrainTimeout: time.Second},
		ConfigFile: file, ConfigPoll: 20 * time.Millisecond,
		ConfigMapNamespace: ns, RestConfig: fx.env.Config, Logger: logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("payload processor: %v", err)
		}
	})
	c, err := extprocfilter.NewClient(extprocfilter.FilterConfig{Name: "payload", Target: svc.GRPCAddr(), MessageTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	wantBase := func(model, base string) func() error {
		return func() error {
			if got := baseOf(t, c, model); got != base {
				return fmt.Errorf("%s → %q, want %q", model, got, base)
			}
			return nil
		}
	}

	// From the file alone; an unknown adapter passes through as itself.
	eventually(t, "file entries", wantBase("qwen-sql", "qwen"))
	eventually(t, "unknown adapter", wantBase("sql-lora", "sql-lora"))

	a := adapterConfigMap(ns, "llama-adapters", "llama", "- sql-lora\n")
	if err := fx.client.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	unlabelled := adapterConfigMap(ns, "not-managed", "mistral", "- tweet-lora\n")
	unlabelled.Labels = nil
	if err := fx.client.Create(ctx, unlabelled); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ConfigMap added", wantBase("sql-lora", "llama"))
	eventually(t, "file entries kept", wantBase("qwen-sql", "qwen"))
	if got := baseOf(t, c, "tweet-lora"); got != "tweet-lora" {
		t.Errorf("an unlabelled ConfigMap was read: tweet-lora → %q", got)
	}

	// A second ConfigMap for the same base adds to it.
	if err := fx.client.Create(ctx, adapterConfigMap(ns, "llama-more", "llama", "[food-review]")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "second ConfigMap", wantBase("food-review", "llama"))

	// Editing moves an adapter; removing forgets it.
	a.Data[payload.AdaptersKey] = "- sql-lora-v2\n"
	if err := fx.client.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ConfigMap edited", wantBase("sql-lora-v2", "llama"))
	eventually(t, "old entry gone", wantBase("sql-lora", "sql-lora"))
	if err := fx.client.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ConfigMap removed", wantBase("sql-lora-v2", "sql-lora-v2"))
	eventually(t, "the other stays", wantBase("food-review", "llama"))

	// A ConfigMap that conflicts with the file (qwen-sql under llama) is
	// refused as a whole; the last good map stays.
	if err := fx.client.Create(ctx, adapterConfigMap(ns, "conflict", "llama", "- qwen-sql\n- new-lora\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	for model, base := range map[string]string{"qwen-sql": "qwen", "food-review": "llama", "new-lora": "new-lora"} {
		if err := wantBase(model, base)(); err != nil {
			t.Error(errors.New("after a conflicting ConfigMap: " + err.Error()))
		}
	}
}
