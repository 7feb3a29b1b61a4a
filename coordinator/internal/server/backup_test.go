package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/leasehold/leasehold/coordinator/internal/store"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

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
	b := setup(t)
	big := func(name string) *leaseholdv1.Document {
		d := doc(name)
		d.Content = bytes.Repeat([]byte(name), 200<<10/len(name))
		return d
	}
	batch := b.submit(t, alpha, "alpha", "big", big("a.pdf"), big("b.pdf"), big("c.pdf"), big("d.pdf"), big("e.pdf"), big("f.pdf"))
	g := b.leaseOne(t)
	b.succeed(t, g, []byte("png of the first"))

	data, s, err := readBackup(as(t, operator), b)
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
	t.Run("An operator of some teams is refused", func(t *testing.T) {
		_, _, err := readBackup(as(t, opAlpha), b)
		wantError(t, err, codes.PermissionDenied, reasonPermissionDenied)
	})
}
