// Package testbin gives tests that run the shipped programs their binaries:
// coordinator, renderer, leasehold and grpcurl.
//
// scripts/test builds them into ./bin and says so in $LEASEHOLD_BIN (a path
// relative to the module root, or absolute); Prepare uses those. Without
// it, as under a plain "go test ./...", Prepare builds them once into a
// temporary directory, grpcurl from the pinned tools module.
package testbin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Names are the binaries Prepare provides by default, as named in the
// directory.
var Names = []string{"coordinator", "renderer", "leasehold", "grpcurl"}

// S3Server is the S3-compatible server the artifact store's tests run
// (versitygw with its posix backend), which Prepare builds from its own
// pinned module, scripts/s3server, when asked for it.
const S3Server = "versitygw"

// packages are the main packages of the module's own binaries, by name;
// grpcurl comes from the tools module.
var packages = map[string]string{
	"coordinator": "./coordinator/cmd/coordinator",
	"renderer":    "./renderer/cmd/renderer",
	"leasehold":   "./client/cmd/leasehold",
}

// Prepare returns the directory of the binaries and a function that
// removes what Prepare built (a no-op for $LEASEHOLD_BIN). moduleRoot is
// the repository root; names are the binaries the tests run, all of Names
// if none are given. It is meant for TestMain.
func Prepare(moduleRoot string, names ...string) (dir string, cleanup func(), err error) {
	cleanup = func() {}
	if len(names) == 0 {
		names = Names
	}
	if dir := os.Getenv("LEASEHOLD_BIN"); dir != "" {
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(moduleRoot, dir)
		}
		for _, name := range names {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return "", cleanup, fmt.Errorf("LEASEHOLD_BIN=%s: %w", os.Getenv("LEASEHOLD_BIN"), err)
			}
		}
		return dir, cleanup, nil
	}
	tmp, err := os.MkdirTemp("", "leasehold-testbin-")
	if err != nil {
		return "", cleanup, err
	}
	cleanup = func() { os.RemoveAll(tmp) }
	out := tmp + string(filepath.Separator)
	var own []string
	var builds [][]string
	for _, name := range names {
		if pkg, ok := packages[name]; ok {
			own = append(own, pkg)
			continue
		}
		switch name {
		case "grpcurl":
			builds = append(builds, []string{"-C", filepath.Join(moduleRoot, "scripts", "tools"), "build", "-o", out,
				"github.com/fullstorydev/grpcurl/cmd/grpcurl"})
		case S3Server:
			builds = append(builds, []string{"-C", filepath.Join(moduleRoot, "scripts", "s3server"), "build", "-o", out + S3Server, "."})
		default:
			cleanup()
			return "", func() {}, fmt.Errorf("no binary named %q", name)
		}
	}
	if len(own) > 0 {
		builds = append([][]string{append([]string{"-C", moduleRoot, "build", "-o", out}, own...)}, builds...)
	}
	for _, args := range builds {
		if msg, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			cleanup()
			return "", func() {}, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
		}
	}
	return tmp, cleanup, nil
}

// Main is the body of a TestMain whose tests run the binaries. It finds
// the module root above the working directory, prepares the named
// binaries as Prepare does and calls run with the root and the binaries'
// directory; run runs the tests and returns their exit code. Main then
// removes what it built and exits with that code. When the binaries
// cannot be had, it prints why after pkg, the package's name, and exits
// with 1.
func Main(pkg string, run func(root, dir string) int, names ...string) {
	root, err := ModuleRoot(".")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", pkg, err)
		os.Exit(1)
	}
	dir, cleanup, err := Prepare(root, names...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", pkg, err)
		os.Exit(1)
	}
	code := run(root, dir)
	cleanup()
	os.Exit(code)
}

// ModuleRoot returns the directory of go.mod above dir.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// Env returns the environment without LEASEHOLD_* variables, so that the
// programs under test see only the flags and variables a test gives them.
func Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") {
			env = append(env, kv)
		}
	}
	return env
}
