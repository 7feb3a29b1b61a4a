package store

import (
	"bytes"
	"errors"
	"fmt"

	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/encoding/protowire"
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
	// Stored says the preview is an object of the artifact store, of Size
	// bytes, put there after the object clock read Seen; Content is then
	// empty.
	Stored bool
	Size   int64
	Seen   uint64
}

// PutArtifact stores a preview under the lease (job, token) it was made
// under; only that lease's completion can reference it.
func (t *Tx) PutArtifact(job, token uint64, a Artifact) error {
	r := &storagev1.ArtifactRecord{Digest: a.Digest, ContentType: a.ContentType, Content: a.Content, Renderer: a.Renderer}
	if a.Stored {
		r.Stored, r.Size, r.Seen = true, a.Size, a.Seen
	}
	v, err := t.encode(r)
	if err != nil {
		return fmt.Errorf("encoding the preview of job %d: %w", job, err)
	}
	return t.put(bucketArtifacts, key2(job, token), v)
}

// Artifact record field numbers read by ArtifactDigest
// (leasehold.storage.v1.ArtifactRecord).
const (
	fieldArtifactDigest      = 1
	fieldArtifactContentType = 2
	fieldArtifactContent     = 3
	fieldArtifactStored      = 5
	fieldArtifactSize        = 6
	fieldArtifactSeen        = 7
)

// Staged is what a completion needs of an upload staged under its lease.
type Staged struct {
	Digest, ContentType string
	Size                int64
	// Stored and Seen: the upload is an object of the artifact store, put
	// there after the object clock read Seen.
	Stored bool
	Seen   uint64
}

// Staged returns what was uploaded under (job, token): its digest, content
// type and size, and whether it is in the artifact store. It reads them
// straight from the encoded record, without decoding (and so copying) the
// content: the writer calls it for every completion of an uploaded preview.
func (t *Tx) Staged(job, token uint64) (Staged, error) {
	v := t.tx.Bucket(bucketArtifacts).Get(key2(job, token))
	if v == nil {
		return Staged{}, ErrArtifactNotFound
	}
	return scanArtifact(job, v)
}

// scanArtifact reads the staged fields of an encoded artifact record of
// job.
func scanArtifact(job uint64, v []byte) (st Staged, err error) {
	var contentLen, size int64
	for len(v) > 0 {
		var f field
		if f, v, err = nextField(v); err != nil {
			return Staged{}, fmt.Errorf("decoding the preview of job %d: %w", job, err)
		}
		switch {
		case f.typ == protowire.BytesType && f.num == fieldArtifactDigest:
			st.Digest = string(f.b)
		case f.typ == protowire.BytesType && f.num == fieldArtifactContentType:
			st.ContentType = string(f.b)
		case f.typ == protowire.BytesType && f.num == fieldArtifactContent:
			contentLen = int64(len(f.b))
		case f.typ == protowire.VarintType && f.num == fieldArtifactStored:
			st.Stored = f.x != 0
		case f.typ == protowire.VarintType && f.num == fieldArtifactSize:
			size = int64(f.x)
		case f.typ == protowire.VarintType && f.num == fieldArtifactSeen:
			st.Seen = f.x
		}
	}
	st.Size = contentLen
	if st.Stored {
		st.Size = size
	}
	return st, nil
}

// Artifact returns a copy of the preview stored under (job, token)
// (decoding copies the bytes out of the transaction).
func (t *Tx) Artifact(job, token uint64) (Artifact, error) {
	a, err := t.artifact(job, token)
	if err != nil {
		return Artifact{}, err
	}
	return Artifact{Digest: a.GetDigest(), ContentType: a.GetContentType(), Content: a.GetContent(), Renderer: a.GetRenderer(),
		Stored: a.GetStored(), Size: a.GetSize(), Seen: a.GetSeen()}, nil
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
