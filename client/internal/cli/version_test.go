package cli

import (
	"runtime/debug"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	info := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/leasehold/leasehold", Version: "v1.4.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2025-06-01T12:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	withInfo := func(b *testBundle, info *debug.BuildInfo, ok bool) {
		b.env.BuildInfo = func() (*debug.BuildInfo, bool) { return info, ok }
	}

	t.Run("prints the module version and VCS stamp without dialing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		withInfo(b, info, true)
		code, out, errOut := b.run(t, "version")
		if code != ExitOK {
			t.Fatalf("exit status = %d; stderr:\n%s", code, errOut)
		}
		want := "leasehold  v1.4.0\n" +
			"module     github.com/leasehold/leasehold\n" +
			"revision   0123456789abcdef0123456789abcdef01234567 (modified)\n" +
			"committed  2025-06-01T12:00:00Z\n" +
			"go         go1.26.8\n"
		if diff := cmp.Diff(want, out); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
		if len(b.dialed) != 0 {
			t.Errorf("version dialed %v, want no connection", b.dialed)
		}
	})

	t.Run("prints JSON with -o json", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		withInfo(b, info, true)
		_, out, _ := b.run(t, "-o", "json", "version")
		want := map[string]any{"module": "github.com/leasehold/leasehold", "version": "v1.4.0", "revision": "0123456789abcdef0123456789abcdef01234567",
			"time": "2025-06-01T12:00:00Z", "modified": true, "go": "go1.26.8"}
		if diff := cmp.Diff(want, jsonLines(t, out)[0]); diff != "" {
			t.Errorf("output mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("a binary without build information says unknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		withInfo(b, nil, false)
		if _, out, _ := b.run(t, "version"); out != "leasehold  unknown\n" {
			t.Errorf("output = %q, want the unknown version", out)
		}
	})

	t.Run("the real build information is readable in tests", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.env.BuildInfo = nil
		if code, out, _ := b.run(t, "version"); code != ExitOK || out == "" {
			t.Errorf("exit status %d, output %q; want 0 and a version", code, out)
		}
	})
}
