package testbin

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// FailpointsCoordinator returns a coordinator built with the failpoints
// build tag, whose failpoints a crash test arms through GOFAIL_FAILPOINTS
// (coordinator/internal/engine/failpoints.go): candidate when it was
// built so (scripts/build's coordinator is not), else one built from the
// module at moduleRoot into dir.
func FailpointsCoordinator(ctx context.Context, moduleRoot, candidate, dir string) (string, error) {
	if candidate != "" && HasFailpoints(candidate) {
		return candidate, nil
	}
	out := filepath.Join(dir, "coordinator")
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "failpoints", "-o", out, packages["coordinator"])
	cmd.Dir = moduleRoot
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the coordinator with failpoints: %w\n%s", err, msg)
	}
	return out, nil
}

// HasFailpoints reports whether the Go program at path was built with the
// failpoints build tag, as its build information records.
func HasFailpoints(path string) bool {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), "failpoints") {
			return true
		}
	}
	return false
}
