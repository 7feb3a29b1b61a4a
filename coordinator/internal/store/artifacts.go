package store

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Artifact store errors.
var (
	// ErrArtifactTooLarge is returned when an upload exceeds its limit.
	ErrArtifactTooLarge = errors.New("artifact too large")
	// ErrArtifactNotFound is returned when no artifact has the digest.
	ErrArtifactNotFound = errors.New("artifact not found")
	// ErrInvalidDigest is returned for a digest that is not 64 hex digits.
	ErrInvalidDigest = errors.New("invalid digest")
)

// Artifacts is a content-addressed file store: each preview lives at
// <dir>/<first two hex digits>/<sha256 hex>. Files are written to a
// temporary name, fsynced and renamed, so a digest that exists is complete.
// Content never changes once written, so any goroutine may read and write.
type Artifacts struct {
	dir string
}

// OpenArtifacts creates dir if needed and returns the store.
func OpenArtifacts(dir string) (*Artifacts, error) {
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o750); err != nil {
		return nil, fmt.Errorf("creating artifact directory: %w", err)
	}
	return &Artifacts{dir: dir}, nil
}

// ValidDigest reports whether d is a lowercase hex SHA-256.
func ValidDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	for _, c := range d {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func (a *Artifacts) path(digest string) string {
	return filepath.Join(a.dir, digest[:2], digest)
}

// Put stores the bytes read from r, at most maxBytes, and returns their
// digest and size. Storing the same bytes twice is harmless.
func (a *Artifacts) Put(r io.Reader, maxBytes int64) (digest string, size int64, err error) {
	f, err := os.CreateTemp(filepath.Join(a.dir, "tmp"), "upload-*")
	if err != nil {
		return "", 0, err
	}
	defer func() {
		if f != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	size, err = io.Copy(io.MultiWriter(f, h), io.LimitReader(r, maxBytes+1))
	if err != nil {
		return "", 0, err
	}
	if size > maxBytes {
		return "", 0, fmt.Errorf("%w: more than %d bytes", ErrArtifactTooLarge, maxBytes)
	}
	if err := f.Sync(); err != nil {
		return "", 0, err
	}
	if err := f.Close(); err != nil {
		return "", 0, err
	}
	digest = hex.EncodeToString(h.Sum(nil))
	final := a.path(digest)
	if err := os.MkdirAll(filepath.Dir(final), 0o750); err != nil {
		return "", 0, err
	}
	if err := os.Rename(f.Name(), final); err != nil {
		return "", 0, err
	}
	f = nil
	if d, err := os.Open(filepath.Dir(final)); err == nil {
		d.Sync()
		d.Close()
	}
	return digest, size, nil
}

// Exists reports whether an artifact with digest is stored.
func (a *Artifacts) Exists(digest string) bool {
	if !ValidDigest(digest) {
		return false
	}
	_, err := os.Stat(a.path(digest))
	return err == nil
}

// Open returns the artifact's content and size.
func (a *Artifacts) Open(digest string) (io.ReadCloser, int64, error) {
	if !ValidDigest(digest) {
		return nil, 0, ErrInvalidDigest
	}
	f, err := os.Open(a.path(digest))
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, ErrArtifactNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}
