// Package gatewayconformance runs the gateway profile of infergate's
// conformance suite (conformance/gateway: the upstream InferencePool suite)
// against real gateway control planes on a live test cluster
// (test/livecluster): Envoy Gateway v1.9.1 with infergate's extension,
// plain Envoy Gateway v1.9.1, whose failures the report must show, Istio's
// pilot-discovery and kgateway v2.2.0. The Gateways' Envoy is the stand-in,
// configured over xDS by the control plane and bound to the address of the
// Envoy Pod the control plane deployed.
//
// With $INFERGATE_CONFORMANCE_REPORTS set (make conformance-reports), each
// run's report is written under that folder, as
// <implementation>/<version>-default-gateway-report.yaml;
// $INFERGATE_CONFORMANCE_RUN_TEST runs one test (its ShortName).
package gatewayconformance

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/infergate/infergate/test/gatewaytest"
	"github.com/infergate/infergate/test/livecluster"
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard()) // the extension runs in the test binary
	os.Exit(gatewaytest.Main(m, []string{"--net", "--mount", "--propagation", "private"}, setUpNamespace))
}

func setUpNamespace() error {
	if err := gatewaytest.SetUpBridge(); err != nil {
		return err
	}
	// Envoy Gateway reads its certificates from /certs and, in
	// gateway-namespace mode, its service-account credentials from the
	// in-cluster path.
	if err := gatewaytest.PrivateMounts("/certs", gatewaytest.InClusterCredentials); err != nil {
		return err
	}
	return livecluster.SetUpAddresses()
}
