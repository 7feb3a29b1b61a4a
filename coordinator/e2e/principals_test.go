package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
