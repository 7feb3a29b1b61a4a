package store_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

func openArtifacts(t *testing.T) (*store.Artifacts, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "artifacts")
	a, err := store.OpenArtifacts(dir)
	if err != nil {
		t.Fatal(err)
	}
	return a, dir
}

func readAll(t *testing.T, a *store.Artifacts, digest string) []byte {
	t.Helper()
	rc, size, err := a.Open(digest)
	if err != nil {
		t.Fatalf("Open(%s): %v", digest, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if size != int64(len(b)) {
		t.Errorf("Open size = %d, read %d bytes", size, len(b))
	}
	return b
}

// assertNoTemporaries fails when an upload left a file behind.
func assertNoTemporaries(t *testing.T, dir string) {
	t.Helper()
	left, err := os.ReadDir(filepath.Join(dir, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

func TestArtifacts(t *testing.T) {
	t.Parallel()
	png := []byte("\x89PNG\r\n\x1a\n preview bytes")
	sum := sha256.Sum256(png)
	want := hex.EncodeToString(sum[:])

	t.Run("PutStoresByContentDigest", func(t *testing.T) {
		t.Parallel()
		a, dir := openArtifacts(t)
		if a.Exists(want) {
			t.Fatal("Exists before Put")
		}
		digest, size, err := a.Put(bytes.NewReader(png), int64(len(png)))
		if err != nil {
			t.Fatal(err)
		}
		if digest != want || size != int64(len(png)) {
			t.Fatalf("Put = %s, %d; want %s, %d", digest, size, want, len(png))
		}
		if !a.Exists(digest) {
			t.Error("Exists after Put = false")
		}
		if got := readAll(t, a, digest); !bytes.Equal(got, png) {
			t.Errorf("Open read %q, want %q", got, png)
		}
		assertNoTemporaries(t, dir)

		// Reopening the directory finds it again.
		again, err := store.OpenArtifacts(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !again.Exists(digest) {
			t.Error("artifact missing after reopening the directory")
		}
	})

	t.Run("UnknownAndInvalidDigests", func(t *testing.T) {
		t.Parallel()
		a, _ := openArtifacts(t)
		if a.Exists(want) {
			t.Error("Exists of an unknown digest = true")
		}
		if _, _, err := a.Open(want); !errors.Is(err, store.ErrArtifactNotFound) {
			t.Errorf("Open of an unknown digest: err = %v, want ErrArtifactNotFound", err)
		}
		for _, d := range []string{"", "abc", strings.ToUpper(want), "../" + want[3:], strings.Repeat("g", 64)} {
			if a.Exists(d) {
				t.Errorf("Exists(%q) = true", d)
			}
			if _, _, err := a.Open(d); !errors.Is(err, store.ErrInvalidDigest) {
				t.Errorf("Open(%q): err = %v, want ErrInvalidDigest", d, err)
			}
		}
		if !store.ValidDigest(want) {
			t.Errorf("ValidDigest(%q) = false", want)
		}
	})

	t.Run("TooLargeIsRefusedAndLeavesNothing", func(t *testing.T) {
		t.Parallel()
		a, dir := openArtifacts(t)
		if _, _, err := a.Put(bytes.NewReader(png), int64(len(png))-1); !errors.Is(err, store.ErrArtifactTooLarge) {
			t.Fatalf("Put of %d bytes with limit %d: err = %v, want ErrArtifactTooLarge", len(png), len(png)-1, err)
		}
		if a.Exists(want) {
			t.Error("a refused upload is stored")
		}
		assertNoTemporaries(t, dir)
		if _, _, err := a.Put(bytes.NewReader(png), int64(len(png))); err != nil {
			t.Errorf("Put of exactly the limit: %v", err)
		}
	})

	t.Run("ConcurrentIdenticalPutsAgree", func(t *testing.T) {
		t.Parallel()
		a, dir := openArtifacts(t)
		const n = 8
		digests := make([]string, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				digests[i], _, errs[i] = a.Put(bytes.NewReader(png), 1<<20)
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			if errs[i] != nil || digests[i] != want {
				t.Errorf("Put %d = %s, %v; want %s", i, digests[i], errs[i], want)
			}
		}
		if got := readAll(t, a, want); !bytes.Equal(got, png) {
			t.Errorf("content after concurrent Puts = %q, want %q", got, png)
		}
		assertNoTemporaries(t, dir)
	})
}
