// Command image builds infergate's OCI image from a static binary, without
// a container engine, and prints its digest: `make image` runs it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/infergate/infergate/internal/ociimage"
)

func main() {
	var (
		o       ociimage.Options
		dir     string
		tarPath string
	)
	flag.StringVar(&o.Binary, "binary", "", "static linux infergate binary (CGO_ENABLED=0)")
	flag.StringVar(&o.Version, "version", "", "image version: label and tag")
	flag.StringVar(&o.Repository, "repository", ociimage.DefaultRepository, "image repository the tag names")
	flag.StringVar(&o.Source, "source", "https://github.com/infergate/infergate", "project address for the source label")
	flag.StringVar(&dir, "layout", "", "write an OCI image layout to this directory")
	flag.StringVar(&tarPath, "tarball", "", "write a tarball that docker load and podman load read")
	flag.Parse()
	if err := run(o, dir, tarPath); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(o ociimage.Options, dir, tarPath string) error {
	if dir == "" && tarPath == "" {
		return fmt.Errorf("nothing to write: give --layout, --tarball or both")
	}
	ref, err := o.Ref()
	if err != nil {
		return err
	}
	img, err := ociimage.Build(o)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image digest: %w", err)
	}
	if dir != "" {
		if err := ociimage.WriteLayout(dir, ref, img); err != nil {
			return err
		}
		fmt.Printf("OCI layout  %s\n", dir)
	}
	if tarPath != "" {
		if err := ociimage.WriteTarball(tarPath, ref, img); err != nil {
			return err
		}
		fmt.Printf("tarball     %s\n", tarPath)
	}
	fmt.Printf("image       %s@%s\n", ref, digest)
	return nil
}
