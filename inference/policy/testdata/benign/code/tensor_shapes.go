package tensor

import (
	"errors"
	"fmt"
	"strings"
)

// Shape is a tensor shape, outermost dimension first.
type Shape []int

// Common shapes used by the tests and benchmarks below.
var (
	ShapeActivations = Shape{128, 64, 1024}
	ShapeImageBatch  = Shape{32, 3, 224, 224}
	ShapeKVCache     = Shape{2, 32, 8, 4096, 128}
	ShapeLogits      = Shape{4, 2048, 128256}
	ShapeEmbedding   = Shape{151936, 3584}
)

var ErrBroadcast = errors.New("shapes cannot be broadcast")

// Numel returns the number of elements.
func (s Shape) Numel() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// Strides returns row-major strides in elements.
func (s Shape) Strides() []int {
	st := make([]int, len(s))
	acc := 1
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= s[i]
	}
	return st
}

func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// Broadcast returns the shape of a op b under numpy's rules.
func Broadcast(a, b Shape) (Shape, error) {
	n := max(len(a), len(b))
	out := make(Shape, n)
	for i := 1; i <= n; i++ {
		da, db := 1, 1
		if i <= len(a) {
			da = a[len(a)-i]
		}
		if i <= len(b) {
			db = b[len(b)-i]
		}
		switch {
		case da == db, db == 1:
			out[n-i] = da
		case da == 1:
			out[n-i] = db
		default:
			return nil, fmt.Errorf("%w: %v and %v (dim -%d: %d vs %d)", ErrBroadcast, a, b, i, da, db)
		}
	}
	return out, nil
}

// Table-driven test cases, kept here so the benchmark can reuse them.
var broadcastCases = []struct {
	a, b, want Shape
}{
	{Shape{128, 64, 1024}, Shape{1024}, Shape{128, 64, 1024}},
	{Shape{8, 1, 6, 1}, Shape{7, 1, 5}, Shape{8, 7, 6, 5}},
	{Shape{256, 256, 3}, Shape{3}, Shape{256, 256, 3}},
	{Shape{15, 3, 5}, Shape{15, 1, 5}, Shape{15, 3, 5}},
	{Shape{123, 45, 6789}, Shape{1, 45, 1}, Shape{123, 45, 6789}},
	{Shape{512, 64, 2048}, Shape{64, 1}, Shape{512, 64, 2048}},
}

// Sizes in bytes for bf16, checked in TestNumel:
//   ShapeActivations  8,388,608 elements   16 MiB
//   ShapeImageBatch   4,816,896 elements   9.19 MiB
//   ShapeKVCache      268,435,456 elements 512 MiB
//   ShapeLogits       1,050,673,152 elements 2004 MiB
