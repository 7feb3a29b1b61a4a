package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// syncBuffer is a bytes.Buffer safe for a logger and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testLogger returns a logger writing text lines to the returned buffer.
func testLogger() (*slog.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	return slog.New(slog.NewTextHandler(buf, nil)), buf
}

// writeFile writes a principals file with mode perm and returns its path.
func writeFile(t *testing.T, dir, data string, perm os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, "principals.json")
	if err := os.WriteFile(path, []byte(data), perm); err != nil {
		t.Fatal(err)
	}
	// WriteFile keeps the mode of a file that exists and is masked by the
	// umask; set it exactly.
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	return path
}

const (
	oldToken = "old-renderer-token-5e1f0c"
	newToken = "new-renderer-token-9a7d2b"
)

func renderers(tokens ...string) string {
	var entries []string
	for i, tok := range tokens {
		entries = append(entries, `{"name":"r`+string(rune('0'+i))+`","token":"`+tok+`","roles":["renderer"],"renderer_ids":["*"]}`)
	}
	return `{"principals":[` + strings.Join(entries, ",") + `]}`
}

// TestTokenForms checks the two ways a principals file gives a token: in
// the clear, at least 16 bytes, or as its SHA-256.
func TestTokenForms(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte(newToken))
	digest := DigestPrefix + hex.EncodeToString(sum[:])

	t.Run("A token given as its digest authenticates the token, not the digest", func(t *testing.T) {
		t.Parallel()
		s, err := Parse([]byte(renderers(oldToken, digest)))
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if p, ok := s.Lookup(newToken); !ok || p.Name != "r1" {
			t.Errorf("Lookup(the token) = %+v, %v; want r1", p, ok)
		}
		if _, ok := s.Lookup(digest); ok {
			t.Errorf("the digest itself authenticates")
		}
		if p, ok := s.Lookup(oldToken); !ok || p.Name != "r0" {
			t.Errorf("Lookup(a token in the clear) = %+v, %v; want r0", p, ok)
		}
	})
	t.Run("An upper-case digest is the same digest", func(t *testing.T) {
		t.Parallel()
		s, err := Parse([]byte(renderers(DigestPrefix + strings.ToUpper(hex.EncodeToString(sum[:])))))
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if _, ok := s.Lookup(newToken); !ok {
			t.Errorf("Lookup(the token) found nothing")
		}
	})
	bad := []struct{ name, file, wantErr string }{
		{"A token of 15 bytes is refused, naming its entry", renderers(oldToken, "fifteen-bytes!!"), `principal 1 ("r1"): token must be at least 16 bytes`},
		{"A digest of the wrong length is refused", renderers(DigestPrefix + "abcd"), `principal 0 ("r0"): token sha256:… must be sha256: and the 64 hex digits`},
		{"A digest that is not hex is refused", renderers(DigestPrefix + strings.Repeat("g", 64)), "64 hex digits"},
		{"A token and its own digest are the same token", renderers(newToken, digest), "token repeats"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestBackupRole checks that the backup role is a role of its own: only a
// principal that names it holds it, and no development principal does.
func TestBackupRole(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(`{"principals":[
		{"name":"nightly","token":"backup-token-4d1e7a22","roles":["backup"]},
		{"name":"oncall","token":"operator-token-3c8e4f","roles":["operator"],"scope":["*"]}]}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if p, _ := s.Lookup("backup-token-4d1e7a22"); !p.Can(RoleBackup) || p.Can(RoleOperator) {
		t.Errorf("backup principal roles = %v, want backup only", p.Roles)
	}
	if p, _ := s.Lookup("operator-token-3c8e4f"); p.Can(RoleBackup) {
		t.Errorf("an operator of every team holds the backup role")
	}
	for _, tok := range []string{DevAlphaToken, DevBetaToken, DevRendererToken, DevOperatorToken, DevOperatorAlphaToken} {
		if p, _ := DevPrincipals().Lookup(tok); p.Can(RoleBackup) {
			t.Errorf("development principal %s holds the backup role", tok)
		}
	}
}

// TestFilePermissions checks the warning about a principals file others
// may read.
func TestFilePermissions(t *testing.T) {
	t.Parallel()
	if !permissionsMean() {
		t.Skip("file permissions do not restrict readers here")
	}
	for _, tc := range []struct {
		perm os.FileMode
		warn string
	}{
		{0o600, ""},
		{0o400, ""},
		{0o640, "its group may read it"},
		{0o660, "its group may change it"},
		{0o604, "other users may read or change it"},
		{0o644, "other users may read or change it"},
	} {
		t.Run(tc.perm.String(), func(t *testing.T) {
			t.Parallel()
			log, buf := testLogger()
			path := writeFile(t, t.TempDir(), renderers(oldToken), tc.perm)
			f, err := OpenFile(path, log)
			if err != nil {
				t.Fatalf("OpenFile: %v", err)
			}
			if _, ok := f.Set().Lookup(oldToken); !ok {
				t.Errorf("the file's token does not authenticate")
			}
			got := buf.String()
			if tc.warn == "" {
				if got != "" {
					t.Errorf("mode %04o logged %q, want nothing", tc.perm, got)
				}
				return
			}
			if !strings.Contains(got, "level=WARN") || !strings.Contains(got, tc.warn) || !strings.Contains(got, path) {
				t.Errorf("mode %04o logged %q, want a warning naming the file and saying %q", tc.perm, got, tc.warn)
			}
		})
	}
}

// TestReload checks File.Reload: a valid file replaces the principals of
// the Set every holder shares; an invalid or missing one keeps them.
func TestReload(t *testing.T) {
	t.Parallel()
	log, buf := testLogger()
	dir := t.TempDir()
	path := writeFile(t, dir, renderers(oldToken), 0o600)
	f, err := OpenFile(path, log)
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	set := f.Set()
	known := func(tok string) bool {
		_, ok := set.Lookup(tok)
		return ok
	}

	t.Run("A rotated file revokes the old token and admits the new one", func(t *testing.T) {
		writeFile(t, dir, renderers(newToken), 0o600)
		if err := f.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		if known(oldToken) || !known(newToken) {
			t.Errorf("after the reload: old token known %v, new token known %v; want false, true", known(oldToken), known(newToken))
		}
		if !strings.Contains(buf.String(), "principals file reloaded") {
			t.Errorf("the log does not say the file was reloaded:\n%s", buf)
		}
	})
	t.Run("An invalid file keeps the principals in force and says why", func(t *testing.T) {
		writeFile(t, dir, renderers(newToken, "too-short"), 0o600)
		if err := f.Reload(); err == nil || !strings.Contains(err.Error(), "at least 16 bytes") {
			t.Fatalf("Reload = %v, want the file's error", err)
		}
		if !known(newToken) {
			t.Errorf("a failed reload dropped the principals in force")
		}
		if !strings.Contains(buf.String(), "reloading the principals file failed") || !strings.Contains(buf.String(), "at least 16 bytes") {
			t.Errorf("the log does not say why the reload failed:\n%s", buf)
		}
	})
	t.Run("A missing file keeps the principals in force", func(t *testing.T) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := f.Reload(); err == nil {
			t.Fatalf("Reload of a missing file succeeded")
		}
		if !known(newToken) {
			t.Errorf("a failed reload dropped the principals in force")
		}
	})
}

// TestInTapHandle checks the transport tap: a call without a known token
// is refused UNAUTHENTICATED from its headers, and the refusal reported;
// a known token and the exempt services pass, and a known token is
// reported as authenticated whatever the method.
func TestInTapHandle(t *testing.T) {
	t.Parallel()
	type refusal struct {
		method string
		code   codes.Code
	}
	var refusals []refusal
	var authenticated int
	handle := DevPrincipals().InTapHandle(func(_ context.Context, method string, err error) {
		refusals = append(refusals, refusal{method, status.Code(err)})
	}, func(context.Context) { authenticated++ })
	call := func(method, authz string) error {
		md := metadata.MD{}
		if authz != "" {
			md.Set("authorization", authz)
		}
		_, err := handle(fromLoopback(), &tap.Info{FullMethodName: method, Header: md})
		return err
	}
	const submit = "/leasehold.v1.JobService/SubmitBatch"
	for _, tc := range []struct {
		name, method, authz string
		want                codes.Code
		authenticated       bool
	}{
		{"A known token passes", submit, "Bearer dev-alpha", codes.OK, true},
		{"A missing token is refused", submit, "", codes.Unauthenticated, false},
		{"An unknown token is refused", submit, "Bearer nope", codes.Unauthenticated, false},
		{"Another scheme is refused", submit, "Basic dev-alpha", codes.Unauthenticated, false},
		{"Health needs no token", "/grpc.health.v1.Health/Check", "", codes.OK, false},
		{"Health with a known token authenticates", "/grpc.health.v1.Health/Watch", "Bearer dev-alpha", codes.OK, true},
		{"Health with an unknown token passes unauthenticated", "/grpc.health.v1.Health/Watch", "Bearer nope", codes.OK, false},
		{"Reflection needs no token", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "", codes.OK, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refusals, authenticated = nil, 0
			err := call(tc.method, tc.authz)
			if got := authenticated == 1; got != tc.authenticated {
				t.Errorf("reported authenticated %d times, want %v", authenticated, tc.authenticated)
			}
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code = %v, want %v", got, tc.want)
			}
			var want []refusal
			if tc.want != codes.OK {
				want = []refusal{{tc.method, tc.want}}
				wantError(t, err, "UNAUTHENTICATED")
			}
			if len(refusals) != len(want) || (len(want) == 1 && refusals[0] != want[0]) {
				t.Errorf("refusals reported = %v, want %v", refusals, want)
			}
		})
	}
}

// wantError fails unless err carries ErrorInfo reason in ErrorDomain.
func wantError(t *testing.T, err error, reason string) {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(interface {
			GetReason() string
			GetDomain() string
		}); ok && info.GetReason() == reason && info.GetDomain() == ErrorDomain {
			return
		}
	}
	t.Errorf("error %v lacks ErrorInfo reason %s", err, reason)
}
