package gatewaytest

import (
	"fmt"
	"testing"

	"github.com/infergate/infergate/sim"
	"github.com/infergate/infergate/test/loopback"
)

// ModelServers runs n simulators named <name>-<i> as a pool's pods, each
// at PodAddr(i):port, until the test ends; it returns their names by
// ip:port.
func ModelServers(t *testing.T, name string, n, port int) map[string]string {
	t.Helper()
	byAddr := map[string]string{}
	for i := range n {
		s, err := sim.New(sim.Config{Name: fmt.Sprintf("%s-%d", name, i), TimeScale: 50})
		if err != nil {
			t.Fatal(err)
		}
		byAddr[loopback.ServeAt(t, fmt.Sprintf("%s:%d", PodAddr(i), port), s.Serve)] = fmt.Sprintf("%s-%d", name, i)
	}
	return byAddr
}
