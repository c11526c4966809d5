package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLongFunctions(t *testing.T) {
	dir := t.TempDir()
	body := func(n int) string { return strings.Repeat("\t_ = 1\n", n) }
	files := map[string]string{
		"a.go":                "package a\n\nfunc short() {\n" + body(3) + "}\n\ntype T struct{}\n\nfunc (t *T) long() {\n" + body(99) + "}\n",
		"a_test.go":           "package a\n\nfunc testLong() {\n" + body(200) + "}\n",
		"testdata/fixture.go": "package fixture\n\nfunc fixture() {\n" + body(200) + "}\n",
		"b.go":                "package a\n\nfunc exact() {\n" + body(98) + "}\n",
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := longFunctions(dir, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.ToSlash(filepath.Join(dir, "a.go")) + ":11: T.long is 101 lines"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
