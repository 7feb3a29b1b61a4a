package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// backupToken is the token of the backup principal withBackupPrincipal
// adds to the development principals.
const backupToken = "backup-token-4d1e7a22"

// withBackupPrincipal serves the development principals and a principal
// that holds the backup role and nothing else.
func withBackupPrincipal(o *options) {
	byToken := map[string]auth.Principal{backupToken: {Name: "nightly-backup", Roles: []auth.Role{auth.RoleBackup}}}
	for _, tok := range []string{alpha, beta, renderer, operator, opAlpha} {
		p, _ := auth.DevPrincipals().Lookup(tok)
		byToken[tok] = p
	}
	o.principals = auth.NewSet(byToken)
}

// backupStream is what one Backup call sent, message by message.
type backupStream struct {
	header  *leaseholdv1.BackupHeader
	chunks  [][]byte
	trailer *leaseholdv1.BackupTrailer
	// order lists the kinds of the messages in order: h, c, t.
	order string
}

// readBackup runs one Backup call to its end and returns the file's bytes.
func readBackup(ctx context.Context, b *testBundle) ([]byte, backupStream, error) {
	var s backupStream
	stream, err := b.ops.Backup(ctx, &leaseholdv1.BackupRequest{})
	if err != nil {
		return nil, s, err
	}
	var file bytes.Buffer
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return file.Bytes(), s, nil
		}
		if err != nil {
			return nil, s, err
		}
		switch p := msg.GetPart().(type) {
		case *leaseholdv1.BackupResponse_Header:
			s.header, s.order = p.Header, s.order+"h"
		case *leaseholdv1.BackupResponse_Chunk:
			s.chunks, s.order = append(s.chunks, p.Chunk), s.order+"c"
			file.Write(p.Chunk)
		case *leaseholdv1.BackupResponse_Trailer:
			s.trailer, s.order = p.Trailer, s.order+"t"
		}
	}
}

func TestBackup(t *testing.T) {
	t.Parallel()
	b := setup(t, withBackupPrincipal)
	big := func(name string) *leaseholdv1.Document {
		d := doc(name)
		d.Content = bytes.Repeat([]byte(name), 200<<10/len(name))
		return d
	}
	batch := b.submit(t, alpha, "alpha", "big", big("a.pdf"), big("b.pdf"), big("c.pdf"), big("d.pdf"), big("e.pdf"), big("f.pdf"))
	g := b.leaseOne(t)
	b.succeed(t, g, []byte("png of the first"))

	data, s, err := readBackup(as(t, backupToken), b)
	if err != nil {
		t.Fatalf("Backup: %v", err)
	}

	t.Run("The header, then chunks of at most 1 MiB, then the trailer", func(t *testing.T) {
		if len(s.order) < 4 || s.order[0] != 'h' || s.order[len(s.order)-1] != 't' || bytes.Count([]byte(s.order), []byte("c")) != len(s.order)-2 {
			t.Fatalf("messages %q, want h, at least two chunks, t", s.order)
		}
		for i, c := range s.chunks {
			if len(c) > backupChunkBytes || (i < len(s.chunks)-1 && len(c) != backupChunkBytes) {
				t.Errorf("chunk %d has %d bytes, want %d but the last", i, len(c), backupChunkBytes)
			}
		}
	})
	t.Run("Size and digest describe the bytes", func(t *testing.T) {
		sum := sha256.Sum256(data)
		if got := int64(len(data)); got != s.header.GetSizeBytes() {
			t.Errorf("received %d bytes, header says %d", got, s.header.GetSizeBytes())
		}
		if got := hex.EncodeToString(sum[:]); got != s.trailer.GetSha256() {
			t.Errorf("received bytes hash to %s, trailer says %s", got, s.trailer.GetSha256())
		}
		if s.header.GetSchemaVersion() != store.SchemaVersion || s.header.GetLastToken() != g.GetLease().GetToken() {
			t.Errorf("header = %v, want schema %d and last token %d", s.header, store.SchemaVersion, g.GetLease().GetToken())
		}
		if !s.header.GetTakenAt().AsTime().Equal(b.clock.Now()) {
			t.Errorf("taken at %v, want the writer's clock %v", s.header.GetTakenAt().AsTime(), b.clock.Now())
		}
	})
	t.Run("The bytes are a store holding every job and preview", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "backup.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		st, err := store.Open(path)
		if err != nil {
			t.Fatalf("opening the backup: %v", err)
		}
		defer st.Close()
		err = st.View(func(tx *store.Tx) error {
			for i := range batch.GetJobIds() {
				if _, found, err := tx.Job(uint64(i) + 1); err != nil || !found {
					t.Errorf("job %d: found %v, %v", i+1, found, err)
				}
			}
			a, err := tx.Artifact(1, g.GetLease().GetToken())
			if err != nil || string(a.Content) != "png of the first" {
				t.Errorf("the preview: %q, %v", a.Content, err)
			}
			return tx.CheckIndexes()
		})
		if err != nil {
			t.Error(err)
		}
	})
	t.Run("Operators are refused, of every team or of some", func(t *testing.T) {
		for _, tok := range []string{operator, opAlpha} {
			_, _, err := readBackup(as(t, tok), b)
			wantError(t, err, codes.PermissionDenied, reasonPermissionDenied)
		}
	})
}

// TestBackupStalledReaderHoldsNothing starts a backup whose client reads
// its header and then stops reading, with a flow-control window far
// smaller than the database, and then grows the database past its
// mapping: bbolt remaps the file only once every read transaction has
// ended, and queues new reads behind the remap, so a backup streamed from
// its read transaction froze every write and read while health said
// SERVING. The writes and reads must complete while the backup stays
// stalled, and the backup must then finish with the database as it was.
func TestBackupStalledReaderHoldsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, withBackupPrincipal, func(o *options) { o.store = []store.Option{store.WithInitialMmapSize(1 << 16)} })
	docs := func(prefix string, n int) []*leaseholdv1.Document {
		var out []*leaseholdv1.Document
		for i := range n {
			d := doc(fmt.Sprintf("%s-%d.pdf", prefix, i))
			d.Content = bytes.Repeat([]byte{byte(i)}, 200<<10)
			out = append(out, d)
		}
		return out
	}
	before := b.submit(t, alpha, "alpha", "before", docs("before", 16)...) // about 3 MiB, past the first chunk and the window

	conn := b.dial(t, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithCancel(as(t, backupToken))
	defer conn.Close()
	defer cancel()
	stream, err := leaseholdv1.NewOperatorServiceClient(conn).Backup(ctx, &leaseholdv1.BackupRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetHeader() == nil {
		t.Fatalf("first Backup message = %v, %v; want the header", first, err)
	}
	// The client reads nothing more. 8 MiB more is far past the mapping
	// the file had when the backup began.
	var after []*leaseholdv1.Batch
	for i := range 4 {
		after = append(after, b.submit(t, beta, "beta", fmt.Sprintf("after-%d", i), docs("after", 10)...))
	}
	if j := b.getJob(t, after[3].GetJobIds()[9]); j.GetTeam() != "beta" {
		t.Errorf("reading the last job after the writes: team %q, want beta", j.GetTeam())
	}

	// The backup, read to its end now, is the database before the writes.
	var file bytes.Buffer
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Backup: %v", err)
		}
		file.Write(msg.GetChunk())
	}
	if int64(file.Len()) != first.GetHeader().GetSizeBytes() {
		t.Fatalf("backup of %d bytes, header says %d", file.Len(), first.GetHeader().GetSizeBytes())
	}
	path := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(path, file.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(path)
	if err != nil {
		t.Fatalf("opening the backup: %v", err)
	}
	defer st.Close()
	err = st.View(func(tx *store.Tx) error {
		n := uint64(len(before.GetJobIds()))
		if _, found, err := tx.Job(n); err != nil || !found {
			t.Errorf("the backup lacks job %d, submitted before it: %v", n, err)
		}
		if _, found, _ := tx.Job(n + 1); found {
			t.Errorf("the backup has job %d, submitted after it began", n+1)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
