package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// BackupInfo describes a backup received and verified.
type BackupInfo struct {
	// SizeBytes is the size of the database file.
	SizeBytes int64
	// SchemaVersion is the storage schema of the copy.
	SchemaVersion uint64
	// LastToken is the largest fencing token granted in the copy.
	LastToken uint64
	// TakenAt is when the coordinator began the copy, by its clock (zero
	// when it did not say).
	TakenAt time.Time
	// SHA256 is the lowercase hex SHA-256 of the file.
	SHA256 string
	// Objects are the keys (<team>/sha256/<digest>) of the objects of the
	// coordinator's artifact store that the copy's jobs name: previews the
	// copy does not hold, which a restore needs in the store.
	Objects []string
}

// Backup streams a consistent copy of the coordinator's whole database into
// w (OperatorService.Backup): a bbolt file a coordinator can be restored
// from, every team's documents and inline previews included; the previews
// kept in the coordinator's artifact store are named in Objects, not
// copied. It needs a token
// whose principal holds the backup role, which no operator scope implies
// and no development token has; any other answers PERMISSION_DENIED. It counts and hashes the
// bytes as they arrive and returns an error matching ErrDigestMismatch when
// their number differs from the header's size, their SHA-256 from the
// trailer's digest, or the stream ends without its trailer; w has then
// received bytes that must not be trusted.
func (c *Client) Backup(ctx context.Context, w io.Writer) (BackupInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Operator.Backup(ctx, &leaseholdv1.BackupRequest{})
	if err != nil {
		return BackupInfo{}, wrapError(err)
	}
	var (
		info    BackupInfo
		header  *leaseholdv1.BackupHeader
		trailer *leaseholdv1.BackupTrailer
		n       int64
	)
	h := sha256.New()
	for trailer == nil {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return info, wrapError(err)
		}
		switch p := msg.GetPart().(type) {
		case *leaseholdv1.BackupResponse_Header:
			header = p.Header
		case *leaseholdv1.BackupResponse_Chunk:
			if header == nil {
				return info, errors.New("backup: a chunk came before the header")
			}
			h.Write(p.Chunk)
			n += int64(len(p.Chunk))
			if _, err := w.Write(p.Chunk); err != nil {
				return info, fmt.Errorf("backup: %w", err)
			}
		case *leaseholdv1.BackupResponse_Objects:
			info.Objects = append(info.Objects, p.Objects.GetKeys()...)
		case *leaseholdv1.BackupResponse_Trailer:
			trailer = p.Trailer
		}
	}
	if header == nil || trailer == nil {
		return info, fmt.Errorf("backup: the stream ended after %d bytes without its header or trailer: %w", n, ErrDigestMismatch)
	}
	info = BackupInfo{SizeBytes: header.GetSizeBytes(), SchemaVersion: header.GetSchemaVersion(), LastToken: header.GetLastToken(),
		SHA256: hex.EncodeToString(h.Sum(nil)), Objects: info.Objects}
	if at := header.GetTakenAt(); at != nil {
		info.TakenAt = at.AsTime()
	}
	if n != header.GetSizeBytes() {
		return info, fmt.Errorf("backup: received %d bytes, want %d: %w", n, header.GetSizeBytes(), ErrDigestMismatch)
	}
	if !strings.EqualFold(info.SHA256, trailer.GetSha256()) {
		return info, fmt.Errorf("backup: received bytes hash to %s, want %s: %w", info.SHA256, trailer.GetSha256(), ErrDigestMismatch)
	}
	if uint64(len(info.Objects)) != header.GetObjects() {
		return info, fmt.Errorf("backup: %d objects of the artifact store named, the header said %d: %w", len(info.Objects), header.GetObjects(), ErrDigestMismatch)
	}
	return info, nil
}
