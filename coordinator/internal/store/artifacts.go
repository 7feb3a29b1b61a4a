package store

import (
	"bytes"
	"errors"
	"fmt"

	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

// ErrArtifactNotFound is returned when no preview is stored under a lease.
var ErrArtifactNotFound = errors.New("artifact not found")

// Artifact is a stored preview.
type Artifact struct {
	// Digest is the lowercase hex SHA-256 of Content.
	Digest      string
	ContentType string
	Content     []byte
	// Renderer is the renderer that made it.
	Renderer string
}

// PutArtifact stores a preview under the lease (job, token) it was made
// under; only that lease's completion can reference it.
func (t *Tx) PutArtifact(job, token uint64, a Artifact) error {
	v, err := t.encode(&storagev1.ArtifactRecord{Digest: a.Digest, ContentType: a.ContentType, Content: a.Content, Renderer: a.Renderer})
	if err != nil {
		return fmt.Errorf("encoding the preview of job %d: %w", job, err)
	}
	return t.put(bucketArtifacts, key2(job, token), v)
}

// ArtifactDigest returns the digest of the preview stored under (job,
// token), without copying its content.
func (t *Tx) ArtifactDigest(job, token uint64) (digest, contentType string, size int64, err error) {
	a, err := t.artifact(job, token)
	if err != nil {
		return "", "", 0, err
	}
	return a.GetDigest(), a.GetContentType(), int64(len(a.GetContent())), nil
}

// Artifact returns a copy of the preview stored under (job, token)
// (decoding copies the bytes out of the transaction).
func (t *Tx) Artifact(job, token uint64) (Artifact, error) {
	a, err := t.artifact(job, token)
	if err != nil {
		return Artifact{}, err
	}
	return Artifact{Digest: a.GetDigest(), ContentType: a.GetContentType(), Content: a.GetContent(), Renderer: a.GetRenderer()}, nil
}

func (t *Tx) artifact(job, token uint64) (*storagev1.ArtifactRecord, error) {
	v := t.tx.Bucket(bucketArtifacts).Get(key2(job, token))
	if v == nil {
		return nil, ErrArtifactNotFound
	}
	var r storagev1.ArtifactRecord
	if err := proto.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("decoding the preview of job %d: %w", job, err)
	}
	return &r, nil
}

// DeleteArtifacts drops every preview stored for job except the one under
// keep (0 keeps none): uploads of leases that did not win.
func (t *Tx) DeleteArtifacts(job, keep uint64) error {
	prefix := itob(job)
	c := t.tx.Bucket(bucketArtifacts).Cursor()
	var doomed [][]byte
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if btoi(k[8:]) != keep {
			doomed = append(doomed, bytes.Clone(k))
		}
	}
	for _, k := range doomed {
		if err := t.del(bucketArtifacts, k); err != nil {
			return err
		}
	}
	return nil
}
