package childproc

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// WaitReady polls a child processor's gRPC health port (plain text) until
// its "readiness" service is SERVING, or fails after timeout.
func WaitReady(ctx context.Context, addr string, timeout time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ctx.Err() != nil {
			return fmt.Errorf("%s did not report ready: %w", addr, context.Cause(ctx))
		}
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
	return fmt.Errorf("%s did not report ready within %s", addr, timeout)
}
