package server

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
)

// byteQuantity is a flag of a number of bytes, written as a plain count
// (16777216) or as a Kubernetes quantity (512Mi, 1Gi, 500M, 1e9): a
// container's memory limit is written as a quantity in the pod spec, and a
// flag derived from it can then be written the same way. The value stays
// an int64 in the Flags.
type byteQuantity struct{ p *int64 }

var _ pflag.Value = byteQuantity{}

func (q byteQuantity) String() string {
	if q.p == nil {
		return "0"
	}
	return strconv.FormatInt(*q.p, 10)
}

// Type names the value in --help.
func (byteQuantity) Type() string { return "quantity" }

// Set refuses what is not a whole, non-negative number of bytes within
// int64: pflag reports the error with the flag named and the value
// quoted, and the command stops before anything listens.
func (q byteQuantity) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*q.p = n
	return nil
}

// maxBytes (4Ei) is the largest count a byte flag takes: ParseQuantity
// clamps what is over int64 to its largest value, which would pass for a
// count that was written, so a bound below it tells the two apart.
const maxBytes = 1 << 62

// parseBytes reads a byte count or a Kubernetes quantity.
func parseBytes(s string) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		if unit, ok := strings.CutSuffix(s, "B"); ok {
			if _, uerr := resource.ParseQuantity(unit); uerr == nil {
				// 512MiB, 500MB: the unit a human writes, not Kubernetes's.
				return 0, fmt.Errorf("not a byte count or a Kubernetes quantity: write %s, without the B", unit)
			}
		}
		return 0, fmt.Errorf("not a byte count or a Kubernetes quantity (such as 16777216, 512Mi, 1Gi or 500M): %w", err)
	}
	if q.Sign() < 0 {
		return 0, fmt.Errorf("%s is negative", s)
	}
	if q.Cmp(*resource.NewQuantity(maxBytes, resource.BinarySI)) > 0 {
		return 0, fmt.Errorf("%s is over 4Ei, the most a byte flag takes", s)
	}
	// Value rounds a fraction up; the quantity must be that whole number.
	n := q.Value()
	if q.Cmp(*resource.NewQuantity(n, resource.DecimalSI)) != 0 {
		return 0, fmt.Errorf("%s is not a whole number of bytes", s)
	}
	return n, nil
}

// bytesVar binds a byte flag, written as a count or a quantity, to p,
// with p's value as its default.
func bytesVar(fs *pflag.FlagSet, p *int64, name string, value int64, usage string) {
	*p = value
	fs.Var(byteQuantity{p}, name, usage)
}
