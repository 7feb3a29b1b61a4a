package coordinator

import (
	"cmp"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildInfo returns the leasehold_build_info gauge, always 1, labelled
// with the binary's module version ("(devel)" for a build from a working
// tree), VCS revision (suffixed "-modified" when the tree had changes;
// "unknown" without VCS information) and Go version, as read returns them
// (debug.ReadBuildInfo).
func buildInfo(read func() (*debug.BuildInfo, bool)) prometheus.Collector {
	version, revision, goVersion := "unknown", "unknown", runtime.Version()
	if info, ok := read(); ok && info != nil {
		version = cmp.Or(info.Main.Version, "(devel)")
		goVersion = cmp.Or(info.GoVersion, goVersion)
		modified := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && revision != "unknown" {
			revision += "-modified"
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "leasehold_build_info",
		Help:        "Always 1; the labels name the coordinator's build: module version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "go_version": goVersion},
	})
	g.Set(1)
	return g
}
