package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// Sentinel errors of a Store.
var (
	// ErrNotFound: no object under the key.
	ErrNotFound = errors.New("artifact object not found")
	// ErrNotSupported: the store cannot presign URLs (the directory store).
	ErrNotSupported = errors.New("the artifact store does not presign URLs")
	// ErrUnavailable wraps a failure to reach the store (a refused or timed
	// out request, a server error): retry later.
	ErrUnavailable = errors.New("artifact store unavailable")
	// ErrCorrupt: the stored object is not what its key names (its size or
	// checksum differs).
	ErrCorrupt = errors.New("artifact object does not match its key")
)

// Key names an object: a team's preview by its SHA-256 digest.
type Key struct {
	Team string
	// Digest is the lower-case hex SHA-256 of the object's bytes.
	Digest string
}

// String returns the key as the store spells it: <team>/sha256/<digest>.
func (k Key) String() string { return k.Team + "/sha256/" + k.Digest }

// ParseKey reads a key spelled as String spells it; ok is false for
// anything else.
func ParseKey(s string) (k Key, ok bool) {
	team, digest, found := strings.Cut(s, "/sha256/")
	if !found || !validTeam(team) || !ValidDigest(digest) {
		return Key{}, false
	}
	return Key{Team: team, Digest: digest}, true
}

// ValidDigest reports whether d is a SHA-256 digest in lower-case hex.
func ValidDigest(d string) bool {
	if len(d) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(d); i++ {
		if c := d[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validTeam reports whether team is a team name as the coordinator accepts
// them: 1 to 64 bytes of [a-z0-9_-], which is also a safe path element.
func validTeam(team string) bool {
	if team == "" || len(team) > 64 {
		return false
	}
	for i := 0; i < len(team); i++ {
		if c := team[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Valid reports whether the key names a team and a digest.
func (k Key) Valid() bool { return validTeam(k.Team) && ValidDigest(k.Digest) }

// Digest returns the lower-case hex SHA-256 of content.
func Digest(content []byte) string {
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:])
}

// Info describes a stored object.
type Info struct {
	Size int64
	// SHA256 is the lower-case hex checksum the store keeps for the object,
	// empty when it keeps none (the directory store names objects by it).
	SHA256 string
	// Modified is when the object was written.
	Modified time.Time
}

// Object is one object of a listing.
type Object struct {
	Key
	Info
}

// Presigned is a URL that lets its bearer make one kind of request on one
// key until Expires, without credentials of its own: the request must send
// exactly Headers (they are signed).
type Presigned struct {
	URL     string
	Method  string
	Headers map[string]string
	Expires time.Time
}

// Store keeps previews by key. Every method does I/O and is safe for
// concurrent use; none may run on the writer goroutine. A failure to reach
// the store wraps ErrUnavailable.
type Store interface {
	// Put stores content under key, whose digest it must hash to; it
	// returns once the object is durable. Putting an object that exists
	// with the same size is a no-op.
	Put(ctx context.Context, key Key, content []byte) error
	// Stat returns what the store knows of the object, or ErrNotFound.
	Stat(ctx context.Context, key Key) (Info, error)
	// Open returns the object's bytes, or ErrNotFound; the caller closes
	// the reader.
	Open(ctx context.Context, key Key) (io.ReadCloser, Info, error)
	// Delete removes the object; a missing one is no error.
	Delete(ctx context.Context, key Key) error
	// List calls fn for every object, in no particular order, until fn
	// returns an error, which List returns.
	List(ctx context.Context, fn func(Object) error) error
	// PresignPut returns a URL that stores exactly size bytes hashing to
	// key.Digest under key and nothing else, valid for ttl, or
	// ErrNotSupported.
	PresignPut(ctx context.Context, key Key, size int64, ttl time.Duration) (Presigned, error)
	// PresignGet returns a URL that reads the object under key, valid for
	// ttl, or ErrNotSupported.
	PresignGet(ctx context.Context, key Key, ttl time.Duration) (Presigned, error)
	// Shared reports whether every node of a cluster reaches the same
	// objects (an S3-compatible store), so that pointers to them may be
	// replicated.
	Shared() bool
	// Check reaches the store once: nil when it answers and the
	// coordinator's credentials are good.
	Check(ctx context.Context) error
	// String names the store for logs and start-up lines.
	String() string
}

// DirName is the directory store's default place, beside the data file.
const DirName = "artifact-store"

// Open returns the store rawURL names: empty for the directory store
// beside the data file (dataDir/artifact-store), file:///path for a directory
// elsewhere, s3://bucket?endpoint=…&region=… for an S3-compatible store.
// It does not reach the store; Check does.
func Open(ctx context.Context, rawURL, dataDir string) (Store, error) {
	return open(ctx, rawURL, dataDir, true)
}

// OpenForReading is Open for a caller that only reads the store (an
// operator's check while no coordinator runs): the directory store is
// neither created nor tidied.
func OpenForReading(ctx context.Context, rawURL, dataDir string) (Store, error) {
	return open(ctx, rawURL, dataDir, false)
}

func open(ctx context.Context, rawURL, dataDir string, write bool) (Store, error) {
	if rawURL == "" {
		return openDir(filepath.Join(dataDir, DirName), write)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("--artifact-store: %w", err)
	}
	switch u.Scheme {
	case "file":
		if u.Path == "" || u.Host != "" {
			return nil, fmt.Errorf("--artifact-store %q: a directory is file:///absolute/path", rawURL)
		}
		return openDir(u.Path, write)
	case "s3":
		return OpenS3(ctx, u)
	default:
		return nil, fmt.Errorf("--artifact-store %q: the scheme must be file or s3", rawURL)
	}
}

// IdleConns returns how many idle connections the store rawURL names may
// keep open, as Open reads rawURL: IdleStoreConns for S3, none for a
// directory or a URL Open refuses.
func IdleConns(rawURL string) int {
	if u, err := url.Parse(rawURL); err == nil && u.Scheme == "s3" {
		return IdleStoreConns
	}
	return 0
}

// unavailable wraps err as ErrUnavailable, naming what failed.
func unavailable(what string, err error) error {
	return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
}
