package epp

import (
	"fmt"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
)

// TestLBMetadataShared: the envoy.lb metadata of a destination names it,
// is the same message each time it is asked for (built once), stays right
// past the cache's bound, and marshals concurrently (go test -race).
func TestLBMetadataShared(t *testing.T) {
	p := &Picker{}
	dest := func(v string) string {
		md := p.lbMetadata(v)
		return md.GetFields()[LBNamespace].GetStructValue().GetFields()[DestinationHeader].GetStringValue()
	}
	if got := dest("10.0.0.1:8000"); got != "10.0.0.1:8000" {
		t.Fatalf("destination %q", got)
	}
	if p.lbMetadata("10.0.0.1:8000") != p.lbMetadata("10.0.0.1:8000") {
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
	md := p.lbMetadata("10.0.0.3:8000")
	want, err := proto.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				// As the server's codec does: size, then marshal with it.
				_ = proto.Size(md)
				if got, err := (proto.MarshalOptions{UseCachedSize: true}).Marshal(md); err != nil || string(got) != string(want) {
					t.Errorf("concurrent marshal: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}
