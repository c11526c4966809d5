package payload

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/policy"
)

// noConfigDocuments are YAML files that hold no value: each would load as
// a policy without guardrails.
var noConfigDocuments = []struct{ name, data string }{
	{"empty", ""},
	{"blank lines", "\n  \n"},
	{"only a comment", "# guardrails: see the wiki\n"},
	{"document start", "---\n"},
	{"document start and end", "--- # policy\n...\n"},
	{"null", "null\n"},
	{"tilde", "~\n"},
	{"empty first document", "---\n---\nlimits: {maxTokens: 1}\n"},
}

// cutShortDocuments are files that end after a section's key: each would
// load as a policy without that section's rules.
var cutShortDocuments = []struct{ name, data string }{
	{"after pii", "limits: {maxTokens: 1}\npii:\n"},
	{"after deny", "pii: [{name: email, detector: email, action: mask}]\ndeny:\n"},
	{"after models", "models:\n"},
}

func writeConfig(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStartRefusesNoConfigDocument: a file that holds no value stops the
// processor at start-up with the file named, as a broken one does.
func TestStartRefusesNoConfigDocument(t *testing.T) {
	for _, doc := range noConfigDocuments {
		t.Run(doc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "payload.yaml")
			writeConfig(t, path, doc.data)
			svc, err := New(Config{Server: server.Options{GRPCAddr: "127.0.0.1:0"}, ConfigFile: path, Logger: logr.Discard()})
			if err == nil {
				stop(t, svc)
				t.Fatal("the processor started without guardrails")
			}
			if !errors.Is(err, policy.ErrNoConfig) || !strings.Contains(err.Error(), path) {
				t.Errorf("err = %v, want ErrNoConfig naming %s", err, path)
			}
		})
	}
}

// TestCutShortDocumentsAreRefused: a file that ends after a section's key
// stops the processor at start-up, and an edit that does is refused with
// the last good policy kept: a truncated write must not drop guardrails.
func TestCutShortDocumentsAreRefused(t *testing.T) {
	dir := t.TempDir()
	for _, doc := range cutShortDocuments {
		t.Run("start/"+doc.name, func(t *testing.T) {
			path := filepath.Join(dir, "start.yaml")
			writeConfig(t, path, doc.data)
			svc, err := New(Config{Server: server.Options{GRPCAddr: "127.0.0.1:0"}, ConfigFile: path, Logger: logr.Discard()})
			if err == nil {
				stop(t, svc)
				t.Fatal("the processor started on a file cut short")
			}
			if !errors.Is(err, policy.ErrNullField) || !strings.Contains(err.Error(), path) {
				t.Errorf("err = %v, want ErrNullField naming %s", err, path)
			}
		})
	}
	path := filepath.Join(dir, "reload.yaml")
	writeConfig(t, path, "pii: [{name: email, detector: email, action: mask}]\n")
	svc, err := New(Config{Server: server.Options{GRPCAddr: "127.0.0.1:0"}, ConfigFile: path, ConfigPoll: time.Hour, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	stop(t, svc)
	good := svc.proc.policy.Load()
	for _, doc := range cutShortDocuments {
		t.Run("reload/"+doc.name, func(t *testing.T) {
			errorsBefore := reloadErrors(t, svc)
			writeConfig(t, path, doc.data)
			svc.reloadFile()
			if svc.proc.policy.Load() != good {
				t.Error("the policy was replaced by a file cut short")
			}
			if got := reloadErrors(t, svc); got != errorsBefore+1 {
				t.Errorf("reload errors %v, want %v", got, errorsBefore+1)
			}
		})
	}
}

// TestReloadRefusesNoConfigDocument: a file edited to hold no value is
// refused like a broken edit (counted as a reload error), and the last
// good policy stays; {} still clears the policy on purpose.
func TestReloadRefusesNoConfigDocument(t *testing.T) {
	path := filepath.Join(t.TempDir(), "payload.yaml")
	writeConfig(t, path, "models:\n  allow: [llama-*]\n")
	// The watcher never fires in this test; reloadFile is called directly
	// so each edit is read exactly once.
	svc, err := New(Config{Server: server.Options{GRPCAddr: "127.0.0.1:0"}, ConfigFile: path, ConfigPoll: time.Hour, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	stop(t, svc)
	good := svc.proc.policy.Load()
	for _, doc := range noConfigDocuments {
		t.Run(doc.name, func(t *testing.T) {
			errorsBefore := reloadErrors(t, svc)
			writeConfig(t, path, doc.data)
			svc.reloadFile()
			if svc.proc.policy.Load() != good {
				t.Error("the policy was replaced")
			}
			if got := reloadErrors(t, svc); got != errorsBefore+1 {
				t.Errorf("reload errors %v, want %v", got, errorsBefore+1)
			}
		})
	}
	writeConfig(t, path, "{}\n")
	svc.reloadFile()
	if svc.proc.policy.Load() == good {
		t.Error("{} did not replace the policy")
	}
}

// stop runs the service until the test ends, so its listeners close.
func stop(t *testing.T, svc *Service) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("processor stopped with %v", err)
		}
	})
}

func reloadErrors(t *testing.T, svc *Service) float64 {
	t.Helper()
	var m dto.Metric
	if err := svc.m.reloads.WithLabelValues("error").Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
