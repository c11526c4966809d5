// Package ociimage builds infergate's container image without a container
// engine: one layer holding the static binary, a non-root user and /tmp,
// written as an OCI image layout and as a tarball `docker load` and
// `podman load` accept. Every timestamp is fixed, so the same binary always
// gives the same digest.
package ociimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const (
	// Entrypoint is where the binary lives in the image.
	Entrypoint = "/infergate"
	// UID and GID the image runs as: not root, and the value the charts'
	// securityContext sets, so runAsNonRoot holds without an override.
	UID = 65532
	GID = 65532
	// DefaultRepository is where releases are published, and the image
	// repository every chart defaults to (a test holds them equal).
	DefaultRepository = "ghcr.io/infergate/infergate"
	// refNameAnnotation names the image in an OCI layout's index.
	refNameAnnotation = "org.opencontainers.image.ref.name"
)

// epoch is every timestamp in the image: the Unix epoch, so that the digest
// depends on the binary alone.
var epoch = time.Unix(0, 0).UTC()

// Options describe the image.
type Options struct {
	// Binary is the path of a statically linked linux infergate binary.
	Binary string
	// Version labels the image and tags it.
	Version string
	// Repository the tag belongs to, e.g. ghcr.io/infergate/infergate.
	Repository string
	// Source is the project's address, for the source label.
	Source string
}

// Ref is the image's name: Repository:Version.
func (o Options) Ref() (name.Tag, error) {
	t, err := name.NewTag(o.Repository + ":" + o.Version)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image name %s:%s: %w", o.Repository, o.Version, err)
	}
	return t, nil
}

// Build returns the image. It refuses a binary that is not a static linux
// ELF executable: a dynamically linked one would start in a build
// machine's container runtime tests and fail in the cluster, where the
// image has no libc.
func Build(o Options) (v1.Image, error) {
	if o.Version == "" {
		return nil, errors.New("image version is empty")
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("image binary: %w", err)
	}
	arch, err := staticLinuxArch(bin)
	if err != nil {
		return nil, fmt.Errorf("image binary %s: %w", o.Binary, err)
	}
	fs, err := rootFS(bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(fs)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "infergate hack/image", Comment: "static binary, non-root user, /tmp"},
	})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config = v1.Config{
		Entrypoint: []string{Entrypoint},
		User:       fmt.Sprintf("%d:%d", UID, GID),
		WorkingDir: "/home/nonroot",
		Env:        []string{"HOME=/home/nonroot", "TMPDIR=/tmp"},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "infergate",
			"org.opencontainers.image.version": o.Version,
			"org.opencontainers.image.source":  o.Source,
		},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// staticLinuxArch returns the OCI architecture of a static linux ELF
// executable, or why the binary is not one.
func staticLinuxArch(bin []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return "", fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", errors.New("dynamically linked (build it with CGO_ENABLED=0)")
		}
	}
	if f.OSABI != elf.ELFOSABI_NONE && f.OSABI != elf.ELFOSABI_LINUX {
		return "", fmt.Errorf("built for OS ABI %v, not linux", f.OSABI)
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	default:
		return "", fmt.Errorf("unsupported machine %v", f.Machine)
	}
}

// rootFS is the layer: the binary, a passwd and group that name the
// non-root user (so tools that look the user up find it), its home and
// a world-writable /tmp.
func rootFS(bin []byte) ([]byte, error) {
	type entry struct {
		name     string
		mode     int64
		uid, gid int
		data     []byte
		dir      bool
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, GID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", GID)
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: UID, gid: GID, dir: true},
		{name: "infergate", mode: 0o755, data: bin},
		{name: "tmp/", mode: 0o1777, dir: true},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: epoch, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("image layer %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("image layer %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img as the only image of an OCI image layout at dir,
// named ref. It replaces an earlier layout at dir but refuses to touch a
// directory that holds something else.
func WriteLayout(dir string, ref name.Tag, img v1.Image) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
			return fmt.Errorf("image layout %s: exists and is not an OCI layout; not overwriting it", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("image layout %s: %w", dir, err)
		}
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: ref.String()})); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	return nil
}

// WriteTarball writes img, tagged ref, as a tarball `docker load` reads.
func WriteTarball(path string, ref name.Tag, img v1.Image) error {
	if err := tarball.WriteToFile(path, ref, img); err != nil {
		return fmt.Errorf("image tarball %s: %w", path, err)
	}
	return nil
}
