package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/leasehold/leasehold/client"
)

// backupOpts are the options of "leasehold backup -f FILE".
type backupOpts struct {
	args  []string
	File  string
	Force bool
}

// backupCredential is what backup's help says about the token it takes.
const backupCredential = `The token (--token, LEASEHOLD_TOKEN) must be one whose principal holds the
backup role in the coordinator's principals file, for example
  {"name": "nightly-backup", "token": "sha256:<hex>", "roles": ["backup"]}
An operator's scope, even "*", does not imply it, and no development token
has it: the file holds every team's documents and previews.

Previews kept in the coordinator's artifact store are not in the file: when
there are any, FILE.objects lists their keys (<team>/sha256/<digest>), which
the store's own tools back up.`

func (o *backupOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.File, "f", "", "write the backup to `FILE` (required)")
	fs.StringVar(&o.File, "file", "", "same as -f")
	fs.BoolVar(&o.Force, "force", false, "replace FILE if it exists")
}

func (o *backupOpts) setArgs(args []string) { o.args = args }

func (o *backupOpts) longHelp() string { return backupCredential }

// Validate checks that a file was named and no arguments given.
func (o *backupOpts) Validate() error {
	if len(o.args) > 0 {
		return usagef("backup takes no arguments, got %q (name the file with -f)", o.args[0])
	}
	if o.File == "" || o.File == "-" {
		return usagef("backup needs -f FILE: the database is written to a file, never to the terminal")
	}
	return nil
}

func (o *backupOpts) run(ctx context.Context, a *app) error {
	if _, err := os.Stat(o.File); err == nil && !o.Force {
		return fmt.Errorf("%s exists; pass --force to replace it", o.File)
	}
	info, err := o.download(ctx, a)
	if err != nil {
		return err
	}
	objects := ""
	if len(info.Objects) > 0 {
		objects = o.File + objectsSuffix
		if err := writeObjects(objects, info.Objects); err != nil {
			return err
		}
	}
	if a.jsonOutput() {
		return a.printJSONValue(map[string]any{
			"path":           o.File,
			"sha256":         info.SHA256,
			"size_bytes":     info.SizeBytes,
			"schema_version": info.SchemaVersion,
			"last_token":     info.LastToken,
			"taken_at":       info.TakenAt.UTC().Format(time.RFC3339Nano),
			"objects":        len(info.Objects),
			"objects_path":   objects,
		})
	}
	_, err = fmt.Fprintf(a.out, "%s\tsha256 %s, %d bytes, schema %d, last token %d, taken at %s\n",
		o.File, info.SHA256, info.SizeBytes, info.SchemaVersion, info.LastToken, info.TakenAt.UTC().Format(time.RFC3339))
	if err == nil && objects != "" {
		_, err = fmt.Fprintf(a.out, "%s\t%d objects of the artifact store, not in the backup: copy them with the store's own tools\n",
			objects, len(info.Objects))
	}
	return err
}

// objectsSuffix names the file beside a backup that lists the objects of
// the artifact store it needs.
const objectsSuffix = ".objects"

// writeObjects writes keys to path, one a line, through a temporary file
// renamed into place.
func writeObjects(path string, keys []string) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".leasehold-objects-*")
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	w := bufio.NewWriter(f)
	for _, k := range keys {
		w.WriteString(k)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return os.Rename(f.Name(), path)
}

// download writes the backup to a temporary file next to o.File, syncs it
// and renames it into place only once its size and digest are verified, so
// a partial or corrupt copy never appears under the requested name. The
// file is readable by its owner only: it holds every team's documents.
func (o *backupOpts) download(ctx context.Context, a *app) (_ client.BackupInfo, err error) {
	f, err := os.CreateTemp(filepath.Dir(o.File), ".leasehold-backup-*")
	if err != nil {
		return client.BackupInfo{}, fmt.Errorf("creating %s: %w", o.File, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	info, err := a.c.Backup(ctx, f)
	if err != nil {
		return info, err
	}
	if err := f.Sync(); err != nil {
		return info, fmt.Errorf("writing %s: %w", o.File, err)
	}
	if err := f.Close(); err != nil {
		return info, fmt.Errorf("writing %s: %w", o.File, err)
	}
	if err := os.Rename(f.Name(), o.File); err != nil {
		return info, errors.Join(fmt.Errorf("writing %s: %w", o.File, err), os.Remove(f.Name()))
	}
	return info, nil
}
