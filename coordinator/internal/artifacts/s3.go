package artifacts

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// S3 is an artifact store in a bucket of any S3-compatible service (AWS
// S3, Ceph RGW, Garage, SeaweedFS, versitygw), reached through
// aws-sdk-go-v2 with the standard AWS credential chain (environment,
// shared files, web identity, instance roles).
type S3 struct {
	client  *s3.Client
	presign *s3.PresignClient
	bucket  string
	// prefix is put before every key, so that several coordinators may
	// share a bucket.
	prefix string
	desc   string
}

var _ Store = (*S3)(nil)

// OpenS3 returns the store u names: s3://bucket[/prefix]?endpoint=URL&
// region=NAME. endpoint is for services other than AWS S3 (requests are
// then path-style: endpoint/bucket/key); region defaults to the SDK's own
// (AWS_REGION, the shared config) or us-east-1. Credentials come from the
// standard AWS chain.
func OpenS3(ctx context.Context, u *url.URL) (*S3, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("--artifact-store %q: name the bucket: s3://bucket?endpoint=…&region=…", u.Redacted())
	}
	q := u.Query()
	for k := range q {
		if k != "endpoint" && k != "region" {
			return nil, fmt.Errorf("--artifact-store: unknown parameter %q (endpoint, region)", k)
		}
	}
	cfg, err := config.LoadDefaultConfig(ctx, config.WithHTTPClient(newHTTPClient()))
	if err != nil {
		return nil, fmt.Errorf("--artifact-store: AWS configuration: %w", err)
	}
	cfg.Region = cmpOr(q.Get("region"), cfg.Region, "us-east-1")
	endpoint := q.Get("endpoint")
	if endpoint != "" {
		if e, err := url.Parse(endpoint); err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return nil, fmt.Errorf("--artifact-store: endpoint %q must be an http or https URL", endpoint)
		}
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
			o.UsePathStyle = true
		}
		// The coordinator sends the SHA-256 it already knows; the SDK adds
		// no checksum of its own, which S3-compatible services differ on.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	desc := "s3://" + u.Host + "/" + prefix
	if endpoint != "" {
		desc += " at " + endpoint
	}
	return &S3{client: client, presign: s3.NewPresignClient(client), bucket: u.Host, prefix: prefix, desc: desc}, nil
}

// IdleStoreConns is how many idle connections to the store the
// coordinator keeps. Every completion of a stored preview is checked with
// a HEAD as it arrives, so a cluster draining at full speed has a few
// hundred checks in flight. With the SDK's default of ten idle
// connections per host, the connections past ten were closed after their
// response, and the next burst of checks dialed them again, leaving a
// socket in TIME_WAIT for each. An idle connection costs one descriptor
// (counted in the coordinator's FileDescriptors) and closes after the
// SDK's idle timeout (90 s).
const IdleStoreConns = 256

// newHTTPClient is the SDK's HTTP client with an idle pool of
// IdleStoreConns connections to the store.
func newHTTPClient() *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConns = IdleStoreConns
		tr.MaxIdleConnsPerHost = IdleStoreConns
	})
}

func cmpOr(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

func (s *S3) key(k Key) *string { return aws.String(s.prefix + k.String()) }

// checksum returns the base64 SHA-256 S3 expects for a hex digest.
func checksum(digest string) string {
	b, _ := hex.DecodeString(digest)
	return base64.StdEncoding.EncodeToString(b)
}

// hexChecksum turns S3's base64 SHA-256 into lower-case hex; "" for none
// (or a composite checksum of a multipart upload, "…-N").
func hexChecksum(b64 *string) string {
	if b64 == nil || strings.Contains(*b64, "-") {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(*b64)
	if err != nil || len(b) != 32 {
		return ""
	}
	return hex.EncodeToString(b)
}

// classify turns an SDK error into ErrNotFound, or wraps it as
// ErrUnavailable (anything but a missing object is the store's fault, or
// the network's, from here).
func classify(what string, k Key, err error) error {
	var nf *types.NotFound
	var nsk *types.NoSuchKey
	var ae smithy.APIError
	switch {
	case errors.As(err, &nf), errors.As(err, &nsk):
		return fmt.Errorf("%s %s: %w", what, k, ErrNotFound)
	case errors.As(err, &ae) && (ae.ErrorCode() == "NotFound" || ae.ErrorCode() == "NoSuchKey"):
		return fmt.Errorf("%s %s: %w", what, k, ErrNotFound)
	case errors.Is(err, context.Canceled):
		return err
	}
	return unavailable(what+" "+k.String(), err)
}

// Put implements Store.Put, with the SHA-256 checksum the store checks
// and keeps.
func (s *S3) Put(ctx context.Context, k Key, content []byte) error {
	growStack()
	if !k.Valid() || Digest(content) != k.Digest {
		return fmt.Errorf("putting %s: %w", k, ErrCorrupt)
	}
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &s.bucket, Key: s.key(k), Body: bytes.NewReader(content),
		ContentLength: aws.Int64(int64(len(content))), ChecksumSHA256: aws.String(checksum(k.Digest)),
	})
	if err != nil {
		return classify("put", k, err)
	}
	return nil
}

// Stat implements Store.Stat, asking for the object's checksum.
func (s *S3) Stat(ctx context.Context, k Key) (Info, error) {
	growStack()
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: s.key(k), ChecksumMode: types.ChecksumModeEnabled})
	if err != nil {
		return Info{}, classify("stat", k, err)
	}
	return Info{Size: aws.ToInt64(out.ContentLength), SHA256: hexChecksum(out.ChecksumSHA256), Modified: aws.ToTime(out.LastModified)}, nil
}

// Open implements Store.Open.
func (s *S3) Open(ctx context.Context, k Key) (io.ReadCloser, Info, error) {
	growStack()
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: s.key(k)})
	if err != nil {
		return nil, Info{}, classify("get", k, err)
	}
	return out.Body, Info{Size: aws.ToInt64(out.ContentLength), Modified: aws.ToTime(out.LastModified)}, nil
}

// Delete implements Store.Delete.
func (s *S3) Delete(ctx context.Context, k Key) error {
	growStack()
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: s.key(k)})
	if err != nil {
		if err := classify("delete", k, err); errors.Is(err, ErrNotFound) {
			return nil
		}
		return classify("delete", k, err)
	}
	return nil
}

// List implements Store.List over the bucket's keys under the prefix;
// keys that are not objects of this store are skipped.
func (s *S3) List(ctx context.Context, fn func(Object) error) error {
	growStack()
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: aws.String(s.prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return unavailable("listing artifacts", err)
		}
		for _, o := range page.Contents {
			k, ok := ParseKey(strings.TrimPrefix(aws.ToString(o.Key), s.prefix))
			if !ok {
				continue
			}
			if err := fn(Object{Key: k, Info: Info{Size: aws.ToInt64(o.Size), Modified: aws.ToTime(o.LastModified)}}); err != nil {
				return err
			}
		}
	}
	return nil
}

// PresignPut implements Store.PresignPut: the signature covers the key,
// Content-Length and x-amz-checksum-sha256, so the URL stores exactly
// those bytes under that key, and the store refuses anything else.
func (s *S3) PresignPut(ctx context.Context, k Key, size int64, ttl time.Duration) (Presigned, error) {
	growStack()
	req, err := s.presign.PresignPutObject(ctx, &s3.PutObjectInput{
		Bucket: &s.bucket, Key: s.key(k), ContentLength: aws.Int64(size), ChecksumSHA256: aws.String(checksum(k.Digest)),
	}, s3.WithPresignExpires(ttl))
	if err != nil {
		return Presigned{}, fmt.Errorf("presigning a put of %s: %w", k, err)
	}
	return presigned(req.URL, req.Method, req.SignedHeader, ttl), nil
}

// PresignGet implements Store.PresignGet.
func (s *S3) PresignGet(ctx context.Context, k Key, ttl time.Duration) (Presigned, error) {
	growStack()
	req, err := s.presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: s.key(k)}, s3.WithPresignExpires(ttl))
	if err != nil {
		return Presigned{}, fmt.Errorf("presigning a get of %s: %w", k, err)
	}
	return presigned(req.URL, req.Method, req.SignedHeader, ttl), nil
}

// presigned keeps the headers a presigned request must send; Host is the
// URL's own and is left to the HTTP client.
func presigned(u, method string, h http.Header, ttl time.Duration) Presigned {
	p := Presigned{URL: u, Method: method, Headers: make(map[string]string, len(h)), Expires: time.Now().Add(ttl)}
	for name, vs := range h {
		if strings.EqualFold(name, "Host") || len(vs) == 0 {
			continue
		}
		p.Headers[http.CanonicalHeaderKey(name)] = vs[0]
	}
	return p
}

// Shared implements Store.Shared: every node reaches the same bucket.
func (s *S3) Shared() bool { return true }

// Check implements Store.Check: the bucket answers to the coordinator's
// credentials.
func (s *S3) Check(ctx context.Context) error {
	growStack()
	if _, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &s.bucket}); err != nil {
		var re interface{ HTTPStatusCode() int }
		if errors.As(err, &re) && re.HTTPStatusCode() != 0 {
			return fmt.Errorf("bucket %s answered %s: %w", s.bucket, strconv.Itoa(re.HTTPStatusCode()), unavailable("checking the artifact store", err))
		}
		return unavailable("checking the artifact store "+s.desc, err)
	}
	return nil
}

// String implements Store.String.
func (s *S3) String() string { return s.desc }
