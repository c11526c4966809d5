package main

import (
	"context"
	"testing"
	"time"

	"github.com/infergate/infergate/test/childproc"
)

// TestShapes runs every shape at a twentieth of its figures against the
// payload processor on grpc-go and on h2, a fresh process each, and
// holds every run to the bounds: memory well inside the limit, and the
// well-behaved requests on their own connection forwarded. The stream
// caps shrink with the counts (--max-streams 400, 100 per connection), so
// that the 500 held streams would take the whole process without the
// per-connection limit. The memory bound is as tight here as at full
// scale for the 15 MiB uploads (nine of them fill the budget at any
// count), loose for the rest; what else can fail is a shape that starves
// the well-behaved connection (a stream limit shared across connections,
// a head-of-line block, a budget held by announcements) or one that does
// not reach the processor at all. The costly shapes' bodies shrink with
// the scale too (a 0.4 MiB dense prompt, 50,000 addresses, 35,000 cards),
// so that each is decided (or refused at the policy's bound on findings)
// in a fraction of a second.
func TestShapes(t *testing.T) {
	bin := childproc.Command(t, "infergate")
	o := options{binary: bin, scale: 0.05, measure: 300 * time.Millisecond,
		processorArgs: []string{"--max-streams", "400", "--max-streams-per-connection", "100"}}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, s := range shapes() {
		for _, tr := range []string{"grpc", "h2"} {
			t.Run(s.name+"/"+tr, func(t *testing.T) {
				r, err := runOne(ctx, o, s, tr)
				if err != nil {
					t.Fatal(err)
				}
				t.Log(r.row())
				if !r.within() {
					t.Errorf("out of bounds: peak RSS %d MiB, %d of %d well-behaved requests forwarded (%d refused, %d failed)",
						r.peakRSS>>20, len(r.during.lat), r.during.attempts, r.during.refused, r.during.failed)
				}
				if r.during.attempts == 0 || r.reached == 0 {
					t.Errorf("the shape did not run: %q, %d well-behaved attempts", r.pressure, r.during.attempts)
				}
			})
		}
	}
}
