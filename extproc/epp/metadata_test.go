package epp

import (
	"fmt"
	"testing"

	"github.com/infergate/infergate/extproc/server"
	"github.com/infergate/infergate/inference/wire"
)

// TestLBMetadataShared: the envoy.lb metadata of a destination names it,
// is the same encoding each time it is asked for (built once), and stays
// right past the cache's bound.
func TestLBMetadataShared(t *testing.T) {
	p := &Picker{}
	get := func(v string) *server.EncodedMetadata {
		md, err := p.lbMetadata(v)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		return md
	}
	dest := func(v string) string {
		return get(v).Struct().GetFields()[wire.LBNamespace].GetStructValue().GetFields()[wire.DestinationEndpointKey].GetStringValue()
	}
	if got := dest("10.0.0.1:8000"); got != "10.0.0.1:8000" {
		t.Fatalf("destination %q", got)
	}
	if first, again := get("10.0.0.1:8000"), get("10.0.0.1:8000"); first != again {
		t.Error("the same destination built twice")
	}
	if got := dest("10.0.0.1:8000,10.0.0.2:8000"); got != "10.0.0.1:8000,10.0.0.2:8000" {
		t.Errorf("fallback list: destination %q", got)
	}
	for i := range maxCachedMetadata + 10 {
		v := fmt.Sprintf("10.1.%d.%d:8000", i/256, i%256)
		if got := dest(v); got != v {
			t.Fatalf("entry %d: destination %q, want %q", i, got, v)
		}
	}
	if n := p.lbCached.Load(); n > maxCachedMetadata {
		t.Errorf("%d entries cached, bound %d", n, maxCachedMetadata)
	}
}
