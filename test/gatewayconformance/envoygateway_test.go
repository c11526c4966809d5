package gatewayconformance

import (
	"testing"

	"github.com/infergate/infergate/conformance/gateway"
	"github.com/infergate/infergate/test/gatewaytest"
)

// TestEnvoyGatewayWithExtension: Envoy Gateway v1.9.1 with infergate's
// extension server passes the gateway profile.
func TestEnvoyGatewayWithExtension(t *testing.T) {
	l := startLive(t, gatewaytest.EnvoyGatewayCRDs(t))
	gatewaytest.StartEnvoyGateway(t, l.Cluster, gatewaytest.EnvoyGateway{Extension: startExtension(t, l), GatewayNamespaceMode: true})
	gatewayClassFor(t, l, gatewaytest.EnvoyGatewayController)
	stop := envoyGatewayProxies(t, l, true)
	defer stop()
	r := &run{Live: l, name: "envoy-gateway-infergate", version: "v1.9.1"}
	gateway.Run(t, r.options(t))
}
