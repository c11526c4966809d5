package ociimage_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/infergate/infergate/internal/ociimage"
)

const testVersion = "9.9.9-imagetest"

// binary is infergate built the way `make image` builds it, once for the
// package: a build takes a minute on two cores.
var binary string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "ociimage-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "infergate")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w -X main.version="+testVersion, "-o", binary, "github.com/infergate/infergate/cmd/infergate")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, b)
			return 1
		}
		return m.Run()
	}())
}

func options(bin string) ociimage.Options {
	return ociimage.Options{Binary: bin, Version: testVersion, Repository: "example.test/infergate", Source: "https://example.test/infergate"}
}

// TestImageRunsAsNonRootAndItsBinaryWorks writes the image as an OCI layout
// and a tarball, reads both back from disk as a runtime would, and checks
// what a cluster relies on: the config, the user, the entrypoint, and that
// the binary taken out of the layer runs.
func TestImageRunsAsNonRootAndItsBinaryWorks(t *testing.T) {
	o := options(binary)
	ref, err := o.Ref()
	if err != nil {
		t.Fatal(err)
	}
	img, err := ociimage.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "oci")
	if err := ociimage.WriteLayout(dir, ref, img); err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "image.tar")
	if err := ociimage.WriteTarball(tarPath, ref, img); err != nil {
		t.Fatal(err)
	}

	// The layout's index names the image by its tag.
	index, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(index, &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "example.test/infergate:"+testVersion {
		t.Fatalf("layout index %s", index)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	fromLayout, err := p.Image(idx.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	fromTar, err := tarball.ImageFromPath(tarPath, &ref)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	for name, got := range map[string]v1.Image{"layout": fromLayout, "tarball": fromTar} {
		d, err := got.Digest()
		if err != nil || d != want {
			t.Fatalf("%s image digest %v (%v), built %v", name, d, err, want)
		}
	}

	cf, err := fromLayout.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Fatalf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if got := cf.Config.User; got != "65532:65532" {
		t.Fatalf("user %q, want 65532:65532", got)
	}
	if got := strings.Join(cf.Config.Entrypoint, " "); got != "/infergate" {
		t.Fatalf("entrypoint %q", got)
	}
	if got := cf.Config.Labels["org.opencontainers.image.version"]; got != testVersion {
		t.Fatalf("version label %q", got)
	}

	files := layerFiles(t, fromLayout)
	for path, wantMode := range map[string]int64{"infergate": 0o755, "tmp/": 0o1777, "home/nonroot/": 0o700, "etc/passwd": 0o644} {
		h, ok := files[path]
		if !ok {
			t.Fatalf("layer lacks %s", path)
		}
		if h.Mode != wantMode {
			t.Fatalf("%s mode %o, want %o", path, h.Mode, wantMode)
		}
	}
	if h := files["infergate"]; h.Uid != 0 {
		t.Fatalf("binary owned by uid %d: the non-root user must not be able to rewrite it", h.Uid)
	}
	if h := files["home/nonroot/"]; h.Uid != ociimage.UID {
		t.Fatalf("home owned by uid %d", h.Uid)
	}
	if !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Fatalf("passwd lacks the image's user:\n%s", files["etc/passwd"].data)
	}

	// The binary out of the layer is the one that was built, and runs.
	extracted := filepath.Join(t.TempDir(), "infergate")
	if err := os.WriteFile(extracted, files["infergate"].data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(extracted, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("infergate version from the image: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "infergate "+testVersion+" ") {
		t.Fatalf("infergate version printed %q", out)
	}
}

type file struct {
	*tar.Header
	data []byte
}

func layerFiles(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]file{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if _, err := io.Copy(&buf, tr); err != nil {
			t.Fatal(err)
		}
		files[h.Name] = file{Header: h, data: buf.Bytes()}
	}
}

// TestSameBinarySameDigest: the image is reproducible, so a digest printed
// by a build can be checked by anyone building the same source.
func TestSameBinarySameDigest(t *testing.T) {
	var digests []v1.Hash
	for range 2 {
		img, err := ociimage.Build(options(binary))
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds of one binary: %v and %v", digests[0], digests[1])
	}
}

func TestRefusesWhatWouldNotRunInTheCluster(t *testing.T) {
	script := filepath.Join(t.TempDir(), "infergate")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		o    ociimage.Options
		want string
	}{
		{"missing binary", options(filepath.Join(t.TempDir(), "absent")), "no such file"},
		{"not ELF", options(script), "not an ELF executable"},
		// Any dynamically linked executable will do; /bin/true is one
		// on every Debian machine.
		{"dynamically linked", options("/bin/true"), "dynamically linked"},
		{"no version", ociimage.Options{Binary: script}, "version is empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ociimage.Build(c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to mention %q", err, c.want)
			}
		})
	}
}

func TestLayoutDoesNotOverwriteOtherDirectories(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options("unused")
	ref, _ := o.Ref()
	err := ociimage.WriteLayout(dir, ref, nil)
	if err == nil || !strings.Contains(err.Error(), "not an OCI layout") {
		t.Fatalf("error %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "notes.txt")); string(b) != "mine" {
		t.Fatal("the directory's file was touched")
	}
}
