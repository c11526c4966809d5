package charts

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/infergate/infergate/internal/ociimage"
)

// TestChartsInstallTheImageMakeImageBuilds: each chart's appVersion is the
// release version in VERSION (the tag `make image` gives the image), and
// its default image is that tag in the repository the image is published
// to, so installing a chart runs the binary of the same release.
func TestChartsInstallTheImageMakeImageBuilds(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(b))
	want := ociimage.DefaultRepository + ":" + version
	for _, c := range []struct{ dir, values string }{
		{eppChartDir, eppInstall},
		{payloadChartDir, ``},
		{egextChartDir, ``},
	} {
		t.Run(filepath.Base(c.dir), func(t *testing.T) {
			ch := loadChart(t, c.dir)
			if ch.Metadata.AppVersion != version {
				t.Fatalf("appVersion %q, VERSION %q", ch.Metadata.AppVersion, version)
			}
			objs := mustRender(t, ch, "release", "default", values(t, c.values))
			dep := one[appsv1.Deployment](t, objs, "Deployment")
			for _, ctr := range dep.Spec.Template.Spec.Containers {
				if ctr.Image != want {
					t.Errorf("container %s image %q, want %q", ctr.Name, ctr.Image, want)
				}
			}
		})
	}
}
