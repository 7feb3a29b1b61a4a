package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// artifactOpts are the options of "leasehold artifact JOB".
type artifactOpts struct {
	args    []string
	JobID   string
	File    string
	Presign bool
}

func (o *artifactOpts) flags(fs *flag.FlagSet, _ Env) {
	fs.StringVar(&o.File, "f", "", "write the preview to `FILE` (default ./<job id>.png; - for stdout)")
	fs.StringVar(&o.File, "file", "", "same as -f")
	fs.BoolVar(&o.Presign, "presign", false, "fetch a preview kept in an S3-compatible artifact store straight from the store, "+
		"with a short-lived URL the coordinator signs; the digest is checked either way")
}

func (o *artifactOpts) setArgs(args []string) {
	o.args = args
	if len(args) == 1 {
		o.JobID = args[0]
	}
}

// Validate checks that exactly one job id was given and picks the default file.
func (o *artifactOpts) Validate() error {
	if len(o.args) != 1 || o.JobID == "" {
		return usagef("artifact takes exactly one JOB id")
	}
	if o.File == "" {
		o.File = "./" + strings.NewReplacer("/", "_", `\`, "_").Replace(o.JobID) + ".png"
	}
	return nil
}

func (o *artifactOpts) run(ctx context.Context, a *app) error {
	if o.File == "-" {
		art, err := a.c.DownloadArtifact(ctx, o.JobID, a.out, o.downloadOptions()...)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.env.Stderr, "sha256 %s, %d bytes\n", art.GetDigest(), art.GetSizeBytes())
		return nil
	}
	art, err := o.download(ctx, a)
	if err != nil {
		return err
	}
	if a.jsonOutput() {
		return a.printJSONValue(map[string]any{
			"job_id":       o.JobID,
			"path":         o.File,
			"digest":       art.GetDigest(),
			"size_bytes":   art.GetSizeBytes(),
			"content_type": art.GetContentType(),
		})
	}
	_, err = fmt.Fprintf(a.out, "%s\tsha256 %s, %d bytes\n", o.File, art.GetDigest(), art.GetSizeBytes())
	return err
}

// downloadOptions are the client's options for --presign.
func (o *artifactOpts) downloadOptions() []client.DownloadOption {
	if !o.Presign {
		return nil
	}
	return []client.DownloadOption{client.Presigned(nil)}
}

// download writes the artifact to a temporary file next to o.File and
// renames it into place only once the digest has been verified, so a
// corrupt or partial download never appears under the requested name.
func (o *artifactOpts) download(ctx context.Context, a *app) (_ *leaseholdv1.Artifact, err error) {
	f, err := os.CreateTemp(filepath.Dir(o.File), ".leasehold-artifact-*")
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", o.File, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	art, err := a.c.DownloadArtifact(ctx, o.JobID, f, o.downloadOptions()...)
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(0o644); err != nil {
		return nil, fmt.Errorf("writing %s: %w", o.File, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("writing %s: %w", o.File, err)
	}
	if err := os.Rename(f.Name(), o.File); err != nil {
		return nil, errors.Join(fmt.Errorf("writing %s: %w", o.File, err), os.Remove(f.Name()))
	}
	return art, nil
}
