package artifacts_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
)

func TestDir(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*artifacts.Dir, string) {
		t.Helper()
		root := filepath.Join(t.TempDir(), "store")
		d, err := artifacts.OpenDir(root)
		if err != nil {
			t.Fatal(err)
		}
		return d, root
	}
	content := []byte("\x89PNG preview bytes")
	key := artifacts.Key{Team: "team-a", Digest: artifacts.Digest(content)}

	t.Run("PutThenStatOpenListDelete", func(t *testing.T) {
		t.Parallel()
		d, root := setup(t)
		if err := d.Put(ctx, key, content); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(root, "team-a", "sha256", key.Digest)); err != nil {
			t.Fatalf("the object is not at <team>/sha256/<digest>: %v", err)
		}
		info, err := d.Stat(ctx, key)
		if err != nil || info.Size != int64(len(content)) {
			t.Fatalf("Stat = %+v, %v; want size %d", info, err, len(content))
		}
		r, _, err := d.Open(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		r.Close()
		if string(got) != string(content) {
			t.Errorf("Open read %q, want %q", got, content)
		}
		var listed []artifacts.Key
		if err := d.List(ctx, func(o artifacts.Object) error { listed = append(listed, o.Key); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(listed) != 1 || listed[0] != key {
			t.Errorf("List = %v, want [%v]", listed, key)
		}
		if err := d.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Stat(ctx, key); !errors.Is(err, artifacts.ErrNotFound) {
			t.Errorf("Stat after Delete err = %v, want ErrNotFound", err)
		}
		if err := d.Delete(ctx, key); err != nil {
			t.Errorf("deleting a missing object: %v, want nil", err)
		}
	})

	t.Run("PutRefusesBytesThatDoNotHashToTheKey", func(t *testing.T) {
		t.Parallel()
		d, _ := setup(t)
		err := d.Put(ctx, artifacts.Key{Team: "team-a", Digest: artifacts.Digest([]byte("other"))}, content)
		if !errors.Is(err, artifacts.ErrCorrupt) {
			t.Fatalf("Put err = %v, want ErrCorrupt", err)
		}
	})

	t.Run("OpenRemovesWhatAnInterruptedPutLeft", func(t *testing.T) {
		t.Parallel()
		_, root := setup(t)
		left := filepath.Join(root, ".tmp", "interrupted")
		if err := os.WriteFile(left, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := artifacts.OpenDir(root); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the temporary file survived the open: %v", err)
		}
	})

	t.Run("ListSkipsWhatIsNotAnObject", func(t *testing.T) {
		t.Parallel()
		d, root := setup(t)
		for _, p := range []string{"README", "Bad Team/sha256/x", "team-a/sha256/not-a-digest"} {
			_ = os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o700)
			if err := os.WriteFile(filepath.Join(root, p), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		if err := d.List(ctx, func(artifacts.Object) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("List found %d objects, want 0", n)
		}
	})

	t.Run("DoesNotPresign", func(t *testing.T) {
		t.Parallel()
		d, _ := setup(t)
		if _, err := d.PresignPut(ctx, key, 1, time.Minute); !errors.Is(err, artifacts.ErrNotSupported) {
			t.Errorf("PresignPut err = %v, want ErrNotSupported", err)
		}
		if d.Shared() {
			t.Error("a directory store says it is shared")
		}
	})
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	d := artifacts.Digest([]byte("x"))
	for s, ok := range map[string]bool{
		"team-a/sha256/" + d:   true,
		"Team/sha256/" + d:     false,
		"team/sha256/" + d[:5]: false,
		"../sha256/" + d:       false,
		"team/md5/" + d:        false,
	} {
		if _, got := artifacts.ParseKey(s); got != ok {
			t.Errorf("ParseKey(%q) ok = %v, want %v", s, got, ok)
		}
	}
}

func TestOpenRefusesAnUnknownScheme(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"ftp://x", "file://host/x", "s3://", "s3://bucket?endpoint=ftp://x", "s3://bucket?colour=blue"} {
		if _, err := artifacts.Open(context.Background(), u, t.TempDir()); err == nil {
			t.Errorf("Open(%q) succeeded", u)
		}
	}
}
