package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	if err := write(&strings.Builder{}, dir); err == nil {
		t.Fatal("an empty folder made a table")
	}
	impl := filepath.Join(dir, "envoy-gateway")
	if err := os.MkdirAll(impl, 0o755); err != nil {
		t.Fatal(err)
	}
	report := `apiVersion: gateway.networking.k8s.io/v1
kind: ConformanceReport
gatewayAPIInferenceExtensionVersion: v1.6.0
implementation: {organization: infergate, project: envoy-gateway, url: u, version: v1.9.1, contact: ["@x"]}
date: "2026-12-01T00:00:00Z"
gatewayAPIVersion: v1.6.1
gatewayAPIChannel: standard
mode: default
profiles:
- name: Gateway
  summary: Core tests failed with 2 test failures.
  core:
    result: failure
    statistics: {Passed: 12, Failed: 2, Skipped: 0}
    failedTests: [InferencePoolAccepted, GatewayFollowingEPPRouting]
`
	if err := os.WriteFile(filepath.Join(impl, "v1.9.1-default-gateway-report.yaml"), []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := write(&out, dir); err != nil {
		t.Fatal(err)
	}
	want := "| envoy-gateway | v1.9.1 | Gateway | failure | 12 | 2 | 0 | InferencePoolAccepted, GatewayFollowingEPPRouting | [v1.9.1-default-gateway-report.yaml](envoy-gateway/v1.9.1-default-gateway-report.yaml) |"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("table:\n%s\nwant the row\n%s", out.String(), want)
	}
}
