package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// Tokens of the principals files below.
const (
	filePortalToken   = "portal-token-77b1d0e2"
	fileOperatorToken = "operator-token-3c8e4f91"
	fileBackupToken   = "backup-token-4d1e7a22"
)

// principalsFile is a principals file with a submitter of team portal
// (when withPortal), an operator of every team and a backup principal.
func principalsFile(withPortal bool) string {
	entries := []string{
		`{"name": "oncall", "token": "` + fileOperatorToken + `", "roles": ["operator"], "scope": ["*"]}`,
		`{"name": "nightly-backup", "token": "` + fileBackupToken + `", "roles": ["backup"]}`,
	}
	if withPortal {
		entries = append(entries, `{"name": "portal", "token": "`+filePortalToken+`", "team": "portal", "roles": ["submitter"]}`)
	}
	return `{"principals": [` + strings.Join(entries, ", ") + `]}`
}

// TestPrincipalsFile runs a coordinator on a principals file: a file
// others may read is warned about at start; only the backup principal may
// take a backup, not an operator of every team; SIGHUP reloads the file,
// so a removed token is refused without a restart, and a file that is not
// valid keeps the principals in force.
func TestPrincipalsFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "principals.json")
	write := func(data string, perm os.FileMode) {
		t.Helper()
		if err := os.WriteFile(tokens, []byte(data), perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(tokens, perm); err != nil {
			t.Fatal(err)
		}
	}
	write(principalsFile(true), 0o644)
	c := startCoordinator(t, "--tokens", tokens)
	c.WaitFor("the principals file holds every caller's token", "other users may read or change it", tokens)

	t.Run("A backup takes the backup role, which an operator of every team lacks", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "leasehold.backup")
		if res := runCLI(t, c.Addr, fileOperatorToken, "backup", "-f", path); res.code != 1 || !strings.Contains(res.stderr, "does not have the backup role (PERMISSION_DENIED PERMISSION_DENIED)") {
			t.Errorf("backup as an operator of every team: exit %d, stderr %q; want 1 and PERMISSION_DENIED", res.code, res.stderr)
		}
		if _, err := os.Stat(path); err == nil {
			t.Errorf("a refused backup left %s", path)
		}
		if res := runCLI(t, c.Addr, fileBackupToken, "backup", "-f", path); res.code != 0 {
			t.Fatalf("backup with the backup role: exit %d, stderr %q", res.code, res.stderr)
		}
		if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
			t.Errorf("backup file: %v, %v", fi, err)
		}
	})

	t.Run("SIGHUP revokes a removed token without a restart", func(t *testing.T) {
		if res := runCLI(t, c.Addr, filePortalToken, "list", "--team", "portal"); res.code != 0 {
			t.Fatalf("list before the reload: exit %d, stderr %q", res.code, res.stderr)
		}
		write(principalsFile(false), 0o600)
		mark := c.Mark()
		c.Signal(syscall.SIGHUP)
		c.WaitFrom(mark, "principals file reloaded")
		if res := runCLI(t, c.Addr, filePortalToken, "list", "--team", "portal"); res.code != 1 || !strings.Contains(res.stderr, "UNAUTHENTICATED") {
			t.Errorf("list with the removed token: exit %d, stderr %q; want 1 and UNAUTHENTICATED", res.code, res.stderr)
		}
		if res := runCLI(t, c.Addr, fileOperatorToken, "audit"); res.code != 0 {
			t.Errorf("audit with a token kept: exit %d, stderr %q", res.code, res.stderr)
		}
	})

	t.Run("A reload of an invalid file keeps the principals in force", func(t *testing.T) {
		write(`{"principals": [{"name": "oncall", "token": "too-short", "roles": ["operator"], "scope": ["*"]}]}`, 0o600)
		mark := c.Mark()
		c.Signal(syscall.SIGHUP)
		c.WaitFrom(mark, "reloading the principals file failed", `principal 0 (\"oncall\")`, "at least 16 bytes")
		if res := runCLI(t, c.Addr, fileOperatorToken, "audit"); res.code != 0 {
			t.Errorf("audit after a failed reload: exit %d, stderr %q", res.code, res.stderr)
		}
		select {
		case <-c.Exited():
			t.Errorf("the coordinator exited on SIGHUP")
		default:
		}
	})
}

// Tokens of TestReloadEndsARevokedRenderer's principals file.
const (
	fileRenderA = "render-a-token-5f0e9d21"
	fileRenderB = "render-b-token-8a7c6b43"
)

// TestReloadEndsARevokedRenderer runs two renderer processes under two
// renderer credentials, revokes one in the principals file and sends the
// coordinator SIGHUP: that renderer's session ends UNAUTHENTICATED at
// once, the renderer stops, and every job submitted afterwards is
// rendered by the other. Before a reload ended the streams it found, the
// revoked renderer kept its session and went on taking work.
func TestReloadEndsARevokedRenderer(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "principals.json")
	write := func(withA bool) {
		t.Helper()
		entries := []string{
			`{"name": "portal", "token": "` + filePortalToken + `", "team": "portal", "roles": ["submitter"]}`,
			`{"name": "render-b", "token": "` + fileRenderB + `", "roles": ["renderer"], "renderer_id_prefix": "b-"}`,
		}
		if withA {
			entries = append(entries, `{"name": "render-a", "token": "`+fileRenderA+`", "roles": ["renderer"], "renderer_id_prefix": "a-"}`)
		}
		if err := os.WriteFile(tokens, []byte(`{"principals": [`+strings.Join(entries, ", ")+`]}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(true)
	c := startCoordinator(t, "--tokens", tokens)
	a := startRenderer(t, c.Addr, "a-1", "--token", fileRenderA)
	a.WaitFor("session started")
	b := startRenderer(t, c.Addr, "b-1", "--token", fileRenderB)
	b.WaitFor("session started")

	write(false)
	mark := c.Mark()
	c.Signal(syscall.SIGHUP)
	c.WaitFrom(mark, "principals file reloaded", "streams_ended=1")
	c.WaitFrom(mark, "Session", "Unauthenticated")
	select {
	case <-a.Exited():
	case <-time.After(waitTimeout): // a failsafe: the renderer stops at once
		t.Fatalf("the revoked renderer is still running:\n%s", a.Tail(20))
	}
	if !strings.Contains(a.LogText(), "UNAUTHENTICATED") && !strings.Contains(a.LogText(), "Unauthenticated") {
		t.Errorf("the revoked renderer's log does not say why it stopped:\n%s", a.Tail(20))
	}

	portal := dial(t, c.Addr, filePortalToken)
	var docs []*leaseholdv1.Document
	for i := range 10 {
		docs = append(docs, doc(fmt.Sprintf("after-%d.pdf", i), "content"))
	}
	sub, err := portal.SubmitBatch(testContext(t), "portal", "after-reload", docs, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := waitBatchDone(t, portal, sub.GetBatch().GetId())
	if n := phaseCounts(done)[leaseholdv1.Phase_PHASE_SUCCEEDED]; n != 10 {
		t.Errorf("succeeded %d of 10 after the reload: %v", n, phaseCounts(done))
	}
	aJobs, bJobs := a.recordedJobs(t), b.recordedJobs(t)
	for _, id := range sub.GetBatch().GetJobIds() {
		if aJobs[id] {
			t.Errorf("the revoked renderer was granted %s after the reload", id)
		}
		if !bJobs[id] {
			t.Errorf("%s was not rendered by the renderer kept", id)
		}
	}
}
