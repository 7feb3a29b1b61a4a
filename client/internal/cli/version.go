package cli

import (
	"context"
	"flag"
	"fmt"
	"runtime/debug"
)

// versionOpts are the options of "leasehold version". It needs no
// coordinator.
type versionOpts struct {
	args []string
}

func (o *versionOpts) flags(*flag.FlagSet, Env) {}

func (o *versionOpts) setArgs(args []string) { o.args = args }

// Validate checks that no arguments were given.
func (o *versionOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("version takes no arguments, got %q", o.args[0])
	}
	return nil
}

// buildVersion is what "leasehold version" reports, read from the build
// information the Go toolchain embeds in the binary.
type buildVersion struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

// versionOf extracts the module version and the VCS stamp (vcs.revision,
// vcs.time, vcs.modified) from info; nil info, from a binary built without
// module support, reports the version "unknown".
func versionOf(info *debug.BuildInfo) buildVersion {
	if info == nil {
		return buildVersion{Version: "unknown"}
	}
	v := buildVersion{Module: info.Main.Path, Version: info.Main.Version, Go: info.GoVersion}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (o *versionOpts) run(_ context.Context, a *app) error {
	read := a.env.BuildInfo
	if read == nil {
		read = debug.ReadBuildInfo
	}
	info, ok := read()
	if !ok {
		info = nil
	}
	v := versionOf(info)
	if a.jsonOutput() {
		return a.printJSONValue(v)
	}
	t := newTable(a.out)
	fmt.Fprintf(t, "leasehold\t%s\n", v.Version)
	if v.Module != "" {
		fmt.Fprintf(t, "module\t%s\n", v.Module)
	}
	if v.Revision != "" {
		rev := v.Revision
		if v.Modified {
			rev += " (modified)"
		}
		fmt.Fprintf(t, "revision\t%s\n", rev)
	}
	if v.Time != "" {
		fmt.Fprintf(t, "committed\t%s\n", v.Time)
	}
	if v.Go != "" {
		fmt.Fprintf(t, "go\t%s\n", v.Go)
	}
	return t.Flush()
}
