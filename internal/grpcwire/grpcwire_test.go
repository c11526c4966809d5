package grpcwire

import (
	"bytes"
	"errors"
	"testing"
)

func TestSplit(t *testing.T) {
	one := append(prefixed("hello"), prefixed("")...)
	for _, tc := range []struct {
		name      string
		in        []byte
		msg, rest string
		ok        bool
		err       error
	}{
		{"empty", nil, "", "", false, nil},
		{"part of a prefix", []byte{0, 0, 0}, "", "\x00\x00\x00", false, nil},
		{"part of a message", prefixed("hello")[:7], "", "\x00\x00\x00\x00\x05he", false, nil},
		{"two messages", one, "hello", "\x00\x00\x00\x00\x00", true, nil},
		{"an empty message", prefixed(""), "", "", true, nil},
		{"compressed", []byte{1, 0, 0, 0, 1, 'x'}, "", "\x01\x00\x00\x00\x01x", false, ErrCompressed},
		{"a length past 2 GiB", []byte{0, 0xff, 0xff, 0xff, 0xff}, "", "\x00\xff\xff\xff\xff", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, rest, ok, err := Split(tc.in)
			if string(msg) != tc.msg || string(rest) != tc.rest || ok != tc.ok || !errors.Is(err, tc.err) {
				t.Fatalf("Split = %q, %q, %v, %v; want %q, %q, %v, %v", msg, rest, ok, err, tc.msg, tc.rest, tc.ok, tc.err)
			}
		})
	}
}

func TestPrefixLength(t *testing.T) {
	for _, n := range []int{0, 1, 5, 1 << 16, 1<<31 - 1} {
		p := Prefix(n)
		got, err := Length(p[:])
		if err != nil || int(got) != n {
			t.Errorf("Length(Prefix(%d)) = %d, %v", n, got, err)
		}
	}
}

func prefixed(s string) []byte {
	p := Prefix(len(s))
	return append(p[:], s...)
}

func FuzzSplit(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 2, 'h', 'i', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		msg, rest, ok, err := Split(b)
		if err != nil || !ok {
			if !bytes.Equal(rest, b) {
				t.Fatal("rest is not the input when no message was split")
			}
			return
		}
		p := Prefix(len(msg))
		if !bytes.Equal(append(append(p[:], msg...), rest...), b) {
			t.Fatalf("prefix+msg+rest is not the input")
		}
	})
}
