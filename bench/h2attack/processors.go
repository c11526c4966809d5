package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/infergate/infergate/sim"
)

// processorFlags are the flags a processor needs beyond the listeners',
// and a stop for what they point at: the payload processor needs none
// (it sets the model headers with no policy); the picker needs a pool,
// here two simulated model servers in this process, shared by every
// picker the run starts (the attacks hit the picker's ext_proc listener,
// not its endpoints).
func processorFlags(ctx context.Context, processor, dir string) ([]string, func(), error) {
	switch processor {
	case "payload":
		return nil, func() {}, nil
	case "epp":
	default:
		return nil, nil, fmt.Errorf("processor %q: want payload or epp", processor)
	}
	ctx, cancel := context.WithCancel(ctx)
	var pool strings.Builder
	pool.WriteString("endpoints:\n")
	for i := range 2 {
		s, err := sim.New(sim.Config{Name: fmt.Sprintf("sim-%d", i)})
		if err != nil {
			cancel()
			return nil, nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			cancel()
			return nil, nil, err
		}
		go func() { _ = s.Serve(ctx, ln) }()
		fmt.Fprintf(&pool, "- address: %s\n  name: sim-%d\n", ln.Addr(), i)
	}
	file := filepath.Join(dir, "pool.yaml")
	if err := os.WriteFile(file, []byte(pool.String()), 0o600); err != nil {
		cancel()
		return nil, nil, fmt.Errorf("pool file: %w", err)
	}
	return []string{"--pool-file", file}, cancel, nil
}
