package artifacts

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// tmpDir is where the directory store writes an object before it is
// renamed into place; what a crash leaves there is removed when the store
// opens.
const tmpDir = ".tmp"

// Dir is the embedded artifact store: a directory holding each object at
// <root>/<team>/sha256/<digest>. Put makes an object durable before it
// returns: written to a temporary name, fsynced, renamed into place, and
// the directory fsynced.
type Dir struct {
	root string
}

var _ Store = (*Dir)(nil)

// OpenDir opens (creating it when missing) the directory store at root,
// and removes the temporary files an interrupted Put left.
func OpenDir(root string) (*Dir, error) {
	return openDir(root, true)
}

// openDir opens the directory store at root; without write it changes
// nothing on disk (an operator's check), and a missing root holds no
// objects.
func openDir(root string, write bool) (*Dir, error) {
	if !write {
		return &Dir{root: filepath.Clean(root)}, nil
	}
	root = filepath.Clean(root)
	if err := os.MkdirAll(filepath.Join(root, tmpDir), 0o700); err != nil {
		return nil, fmt.Errorf("artifact directory: %w", err)
	}
	if err := os.RemoveAll(filepath.Join(root, tmpDir)); err != nil {
		return nil, fmt.Errorf("artifact directory: clearing interrupted writes: %w", err)
	}
	if err := os.Mkdir(filepath.Join(root, tmpDir), 0o700); err != nil {
		return nil, fmt.Errorf("artifact directory: %w", err)
	}
	return &Dir{root: root}, nil
}

func (d *Dir) path(k Key) string { return filepath.Join(d.root, k.Team, "sha256", k.Digest) }

// Put implements Store.Put.
func (d *Dir) Put(_ context.Context, k Key, content []byte) error {
	if !k.Valid() || Digest(content) != k.Digest {
		return fmt.Errorf("putting %s: %w", k, ErrCorrupt)
	}
	final := d.path(k)
	if fi, err := os.Stat(final); err == nil && fi.Size() == int64(len(content)) {
		return nil
	}
	if err := d.put(final, content); err != nil {
		// A disk that is full, read-only or failing: the store does not
		// take objects now, as an unreachable bucket does not.
		return unavailable("putting "+k.String(), err)
	}
	return nil
}

// put writes content durably at final.
func (d *Dir) put(final string, content []byte) error {
	dir := filepath.Dir(final)
	if err := d.mkdirs(dir); err != nil {
		return err
	}
	tmp, err := d.writeTemp(content)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// writeTemp writes content to a new file under the temporary directory
// and fsyncs it, returning its name.
func (d *Dir) writeTemp(content []byte) (string, error) {
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	name := filepath.Join(d.root, tmpDir, hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("writing an artifact: %w", err)
	}
	_, err = f.Write(content)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(name)
		return "", fmt.Errorf("writing an artifact: %w", err)
	}
	return name, nil
}

// mkdirs creates dir and its parents up to the root, fsyncing each parent
// a new directory was made in, so that the object's path survives a crash.
func (d *Dir) mkdirs(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	var made []string
	for p := dir; p != d.root && len(p) > len(d.root); p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		made = append(made, p)
	}
	for i := len(made) - 1; i >= 0; i-- {
		if err := os.Mkdir(made[i], 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("artifact directory: %w", err)
		}
		if err := syncDir(filepath.Dir(made[i])); err != nil {
			return err
		}
	}
	return nil
}

// syncDir fsyncs a directory, making the names in it durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("artifact directory: %w", err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("artifact directory: syncing %s: %w", dir, err)
	}
	return nil
}

// Stat implements Store.Stat. The directory store keeps no checksum
// beside the name: Put checked the bytes against it.
func (d *Dir) Stat(_ context.Context, k Key) (Info, error) {
	if !k.Valid() {
		return Info{}, fmt.Errorf("stat %s: %w", k, ErrNotFound)
	}
	fi, err := os.Stat(d.path(k))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("stat %s: %w", k, ErrNotFound)
	}
	if err != nil {
		return Info{}, unavailable("stat "+k.String(), err)
	}
	return Info{Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// Open implements Store.Open.
func (d *Dir) Open(_ context.Context, k Key) (io.ReadCloser, Info, error) {
	if !k.Valid() {
		return nil, Info{}, fmt.Errorf("open %s: %w", k, ErrNotFound)
	}
	f, err := os.Open(d.path(k))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Info{}, fmt.Errorf("open %s: %w", k, ErrNotFound)
	}
	if err != nil {
		return nil, Info{}, unavailable("open "+k.String(), err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Info{}, unavailable("open "+k.String(), err)
	}
	return f, Info{Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// Delete implements Store.Delete.
func (d *Dir) Delete(_ context.Context, k Key) error {
	if !k.Valid() {
		return nil
	}
	err := os.Remove(d.path(k))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return unavailable("delete "+k.String(), err)
	}
	if err == nil {
		return syncDir(filepath.Dir(d.path(k)))
	}
	return nil
}

// List implements Store.List: every <team>/sha256/<digest> file; anything
// else under the root is not an object and is left alone.
func (d *Dir) List(ctx context.Context, fn func(Object) error) error {
	teams, err := os.ReadDir(d.root)
	if err != nil {
		return unavailable("listing artifacts", err)
	}
	for _, t := range teams {
		if !t.IsDir() || !validTeam(t.Name()) {
			continue
		}
		dir := filepath.Join(d.root, t.Name(), "sha256")
		files, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return unavailable("listing artifacts", err)
		}
		for _, f := range files {
			if err := ctx.Err(); err != nil {
				return err
			}
			k := Key{Team: t.Name(), Digest: f.Name()}
			if !f.Type().IsRegular() || !k.Valid() {
				continue
			}
			fi, err := f.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return unavailable("listing artifacts", err)
			}
			if err := fn(Object{Key: k, Info: Info{Size: fi.Size(), Modified: fi.ModTime()}}); err != nil {
				return err
			}
		}
	}
	return nil
}

// PresignPut implements Store.PresignPut: a directory has no URLs.
func (d *Dir) PresignPut(context.Context, Key, int64, time.Duration) (Presigned, error) {
	return Presigned{}, ErrNotSupported
}

// PresignGet implements Store.PresignGet: a directory has no URLs.
func (d *Dir) PresignGet(context.Context, Key, time.Duration) (Presigned, error) {
	return Presigned{}, ErrNotSupported
}

// Shared implements Store.Shared: a directory is one node's.
func (d *Dir) Shared() bool { return false }

// Check implements Store.Check: the directory takes a file.
func (d *Dir) Check(context.Context) error {
	name, err := d.writeTemp(nil)
	if err != nil {
		return unavailable("checking the artifact directory", err)
	}
	return os.Remove(name)
}

// String implements Store.String.
func (d *Dir) String() string { return "directory " + d.root }

// Root returns the directory the store keeps its objects in.
func (d *Dir) Root() string { return d.root }
