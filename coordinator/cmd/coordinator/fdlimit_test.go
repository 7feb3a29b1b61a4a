package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFileLimitBelowTheCaps starts the command under a limit of 600 open
// files (soft and hard, as "ulimit -n" sets them), below what its
// connection caps may take: it says so at start, naming the limit and
// the need, and serves all the same.
func TestFileLimitBelowTheCaps(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to set the limit with")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `ulimit -n 600 && exec "$0" "$@"`, self,
		"--dev", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", filepath.Join(t.TempDir(), "data"), "--log-format", "text")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	failsafe := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer failsafe.Stop()
	var warned bool
	var lines []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		if strings.Contains(line, "open file limit is below what the connection caps may take") {
			warned = strings.Contains(line, "limit=600") && strings.Contains(line, "need=1536")
		}
		if strings.Contains(line, "coordinator listening") {
			break
		}
	}
	if !warned {
		t.Errorf("no warning naming limit=600 and need=1536 before the coordinator listened:\n%s", strings.Join(lines, "\n"))
	}
}
