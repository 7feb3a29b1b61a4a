package client

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/leaderdial"
	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/internal/tracing"
)

// Client is a connection to a coordinator. It is safe for concurrent use.
type Client struct {
	// Jobs is the JobService stub, for calls the helpers do not cover.
	Jobs leaseholdv1.JobServiceClient
	// Operator is the OperatorService stub.
	Operator leaseholdv1.OperatorServiceClient
	// Overview is the OverviewService stub.
	Overview leaseholdv1.OverviewServiceClient

	conn *grpc.ClientConn
	// anyConn reaches every replica for stale reads (WithStaleReads with
	// several addresses); nil otherwise.
	anyConn *grpc.ClientConn
	limits  BatchLimits
}

// DefaultMaxMessageBytes is the largest response the client accepts (gRPC's
// own default is 4 MiB): enough for a ListJobs page of 1,000 jobs with
// their histories. It is also the least the client allows itself to send;
// see WithBatchLimits.
const DefaultMaxMessageBytes = 64 << 20

// Option configures Dial.
type Option func(*dialConfig)

type dialConfig struct {
	security security.Client
	tracer   trace.TracerProvider
	limits   BatchLimits
	dialOpts []grpc.DialOption
	// failoverWait bounds the retries across a failover (WithFailoverWait).
	failoverWait time.Duration
	staleReads   bool
}

// WithToken sends "authorization: Bearer <token>" with every call. Dial
// refuses to send it without TLS to a coordinator that is not on this
// machine (ErrPlaintextToken): give WithTLS, or WithInsecurePlaintext where
// the network encrypts on its own. On loopback it may go in plaintext.
func WithToken(token string) Option {
	return func(c *dialConfig) { c.security.Token = token }
}

// ErrPlaintextToken is returned by Dial when the bearer token would go
// without TLS to a coordinator that is not on loopback, and is wrapped in
// the error of a call whose connection reached another host in plaintext.
var ErrPlaintextToken = security.ErrPlaintextToken

// WithTLS connects over TLS with cfg: its RootCAs verify the coordinator
// (the system's roots when nil), and its Certificates, if any, are the
// client certificate a coordinator requiring mutual TLS asks for.
func WithTLS(cfg *tls.Config) Option {
	return WithTransportCredentials(credentials.NewTLS(cfg))
}

// WithTransportCredentials connects with creds, such as TLS; a bearer
// token is then sent only on connections whose handshake gave privacy and
// integrity.
func WithTransportCredentials(creds credentials.TransportCredentials) Option {
	return func(c *dialConfig) { c.security.Creds = creds }
}

// WithInsecurePlaintext allows sending the bearer token without TLS to a
// coordinator that is not on loopback. Use it only where the network
// itself encrypts and authenticates, such as a service mesh with mutual TLS
// between sidecars; it excludes WithTLS.
func WithInsecurePlaintext() Option {
	return func(c *dialConfig) { c.security.InsecurePlaintext = true }
}

// WithTracerProvider traces every call with tp (otelgrpc) and sends the
// trace context to the coordinator, which hands a submission's context on
// to the renderers of its jobs. Without it the client installs no
// tracing.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *dialConfig) { c.tracer = tp }
}

// WithDialOptions appends gRPC dial options after the defaults, so they
// can override them.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *dialConfig) { c.dialOpts = append(c.dialOpts, opts...) }
}

// WithBatchLimits sets the limits SubmitDocuments and SubmitFiles split
// submissions by; zero fields keep the defaults (500 documents, 16 MiB of
// inline content, 200 MiB declared, the coordinator's defaults). Dial sets
// the largest message the client sends to cover the largest batch these
// limits allow, and at least DefaultMaxMessageBytes.
func WithBatchLimits(l BatchLimits) Option {
	return func(c *dialConfig) { c.limits = l }
}

// Dial creates a client for the coordinator at addr. It does not wait for
// the connection: the first call does. It fails only on a bad address,
// invalid options (negative batch limits or failover wait, WithTLS together
// with WithInsecurePlaintext), or a token that would go in plaintext to
// another host (ErrPlaintextToken; see WithToken).
//
// addr is one "host:port" or any gRPC target naming one server, dialled
// as it always was; or, for a cluster, the replicas' "host:port"
// addresses separated by commas ("a:7070,b:7070,c:7070"), or a dns:///
// target resolving to all of them. The client then polls each replica's
// health entry leasehold.v1.Leader (a Check every 250 ms, each within
// 250 ms) and sends its calls to the one that answers SERVING, moving to
// the new leader when leadership moves, even from a leader that stopped
// answering at all (a frozen process keeps its connections open); and it
// retries a call that a failover interrupted (see WithFailoverWait).
// Streams made under a leader that the client has since left end with an
// error matching ErrUnavailable, which FollowBatch resumes from. Options from WithDialOptions do not apply to the polls'
// own connections. Over TLS each listed address is
// verified against its own host, unless the tls.Config names a ServerName
// for all of them; the bearer token rule holds for every address.
//
// The connection receives messages of up to DefaultMaxMessageBytes and
// sends up to the larger of that and the largest batch the batch limits
// allow. After losing the coordinator it reconnects with a backoff from
// 100 ms to 2 s (gRPC's default grows to 2 minutes), so that FollowBatch
// resumes soon after a restart. Options from WithDialOptions come after
// these defaults and can override them.
func Dial(addr string, opts ...Option) (*Client, error) {
	cfg := dialConfig{failoverWait: DefaultFailoverWait}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.limits.Validate(); err != nil {
		return nil, fmt.Errorf("dialing coordinator %s: %w", addr, err)
	}
	if cfg.failoverWait < 0 {
		return nil, fmt.Errorf("dialing coordinator %s: failover wait %v is negative", addr, cfg.failoverWait)
	}
	target, err := leaderdial.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("dialing coordinator: %w", err)
	}
	transport, err := cfg.security.DialOptions(target.Hosts()...)
	if err != nil {
		return nil, fmt.Errorf("dialing coordinator %s: %w", addr, err)
	}
	leader := target.Leader(transport...)
	dialOpts := append(slices.Clone(transport),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(DefaultMaxMessageBytes),
			grpc.MaxCallSendMsgSize(int(max(DefaultMaxMessageBytes, cfg.limits.requestBytes()))),
		),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  DefaultFollowMinBackoff,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   DefaultFollowMaxBackoff,
			},
			MinConnectTimeout: 20 * time.Second,
		}),
	)
	if cfg.tracer != nil {
		dialOpts = append(dialOpts, tracing.DialOption(cfg.tracer))
	}
	if target.Replicated() && cfg.failoverWait > 0 {
		dialOpts = append(dialOpts, grpc.WithChainUnaryInterceptor(failoverInterceptor(leader, cfg.failoverWait)))
	}
	dialOpts = append(dialOpts, cfg.dialOpts...)
	c := &Client{limits: cfg.limits}
	c.conn, err = grpc.NewClient(leader.DialTarget(), append(leader.DialOptions(), dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("dialing coordinator %s: %w", addr, err)
	}
	var cc grpc.ClientConnInterface = c.conn
	if cfg.staleReads {
		anyConn := c.conn
		if target.Replicated() {
			anyConn, err = grpc.NewClient(target.DialTarget(), append(target.AnyReplicaOptions(), dialOpts...)...)
			if err != nil {
				c.conn.Close()
				return nil, fmt.Errorf("dialing coordinator %s: %w", addr, err)
			}
			c.anyConn = anyConn
		}
		cc = staleRouter{leader: c.conn, any: anyConn}
	}
	c.Jobs = leaseholdv1.NewJobServiceClient(cc)
	c.Operator = leaseholdv1.NewOperatorServiceClient(cc)
	c.Overview = leaseholdv1.NewOverviewServiceClient(cc)
	return c, nil
}

// Close closes the connections. Calls in flight fail with CANCELLED.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	if c.anyConn != nil {
		err = errors.Join(err, c.anyConn.Close())
	}
	return err
}

// GetJob returns a job with its history.
func (c *Client) GetJob(ctx context.Context, jobID string) (*leaseholdv1.Job, error) {
	resp, err := c.Jobs.GetJob(ctx, &leaseholdv1.GetJobRequest{JobId: jobID})
	if err != nil {
		return nil, wrapError(err)
	}
	return resp.GetJob(), nil
}

// ListJobs returns one page of jobs.
func (c *Client) ListJobs(ctx context.Context, req *leaseholdv1.ListJobsRequest) (*leaseholdv1.ListJobsResponse, error) {
	resp, err := c.Jobs.ListJobs(ctx, req)
	return resp, wrapError(err)
}

// AllJobs iterates over every job matching req, following pages from
// req.PageToken. req is not modified. Iteration stops after the first error,
// which is yielded with a nil job.
func (c *Client) AllJobs(ctx context.Context, req *leaseholdv1.ListJobsRequest) iter.Seq2[*leaseholdv1.Job, error] {
	return func(yield func(*leaseholdv1.Job, error) bool) {
		r := &leaseholdv1.ListJobsRequest{}
		if req != nil {
			r = proto.CloneOf(req)
		}
		for {
			resp, err := c.ListJobs(ctx, r)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, j := range resp.GetJobs() {
				if !yield(j, nil) {
					return
				}
			}
			if resp.GetNextPageToken() == "" {
				return
			}
			r.PageToken = resp.GetNextPageToken()
		}
	}
}

// GetBatch returns a batch with its counts per phase.
func (c *Client) GetBatch(ctx context.Context, batchID string) (*leaseholdv1.Batch, error) {
	resp, err := c.Jobs.GetBatch(ctx, &leaseholdv1.GetBatchRequest{BatchId: batchID})
	if err != nil {
		return nil, wrapError(err)
	}
	return resp.GetBatch(), nil
}

// CancelJob cancels one job. Cancelling a cancelled job succeeds again with
// AlreadyCancelled set; a SUCCEEDED or FAILED job gives ErrAlreadyTerminal.
func (c *Client) CancelJob(ctx context.Context, jobID, reason string) (*leaseholdv1.CancelJobResponse, error) {
	resp, err := c.Jobs.CancelJob(ctx, &leaseholdv1.CancelJobRequest{JobId: jobID, Reason: reason})
	return resp, wrapError(err)
}

// CancelBatch cancels every non-terminal job of a batch.
func (c *Client) CancelBatch(ctx context.Context, batchID, reason string) (*leaseholdv1.CancelBatchResponse, error) {
	resp, err := c.Jobs.CancelBatch(ctx, &leaseholdv1.CancelBatchRequest{BatchId: batchID, Reason: reason})
	return resp, wrapError(err)
}

// DownloadOption changes how DownloadArtifact fetches a preview.
type DownloadOption func(*downloadOptions)

type downloadOptions struct {
	presign bool
	http    *http.Client
}

// Presigned asks for a short-lived URL where the preview is in an
// artifact store that presigns (an S3-compatible one), and fetches the
// bytes from the store with a plain GET: they do not cross the
// coordinator. A preview kept in the coordinator's records is streamed
// as without it. hc sends the GET; nil is http.DefaultClient.
func Presigned(hc *http.Client) DownloadOption {
	return func(o *downloadOptions) { o.presign, o.http = true, cmp.Or(hc, http.DefaultClient) }
}

// DownloadArtifact streams the preview of a SUCCEEDED job into w and returns
// its metadata. It hashes the bytes as they arrive and returns an error
// matching ErrDigestMismatch when their SHA-256 differs from the artifact's
// digest (or their count from its size); w has then received bytes that
// must not be trusted, so callers writing to a file should discard it. The
// check is the same whether the bytes came through the coordinator or,
// with Presigned, from the artifact store.
func (c *Client) DownloadArtifact(ctx context.Context, jobID string, w io.Writer, opts ...DownloadOption) (*leaseholdv1.Artifact, error) {
	var o downloadOptions
	for _, opt := range opts {
		opt(&o)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Jobs.GetArtifact(ctx, &leaseholdv1.GetArtifactRequest{JobId: jobID, Presign: o.presign})
	if err != nil {
		return nil, wrapError(err)
	}
	var (
		art *leaseholdv1.Artifact
		n   int64
	)
	h := sha256.New()
	out := io.MultiWriter(h, w)
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, wrapError(err)
		}
		if art == nil {
			art = msg.GetArtifact()
			if art == nil {
				return nil, fmt.Errorf("downloading artifact of job %s: first message carries no artifact metadata", jobID)
			}
		}
		if u := msg.GetUrl(); u != "" {
			if n, err = fetchPresigned(ctx, o.http, u, msg.GetUrlHeaders(), art.GetSizeBytes(), out); err != nil {
				return nil, fmt.Errorf("downloading artifact of job %s from the artifact store: %w", jobID, err)
			}
			continue
		}
		chunk := msg.GetChunk()
		n += int64(len(chunk))
		if _, err := out.Write(chunk); err != nil {
			return nil, fmt.Errorf("downloading artifact of job %s: %w", jobID, err)
		}
	}
	if art == nil {
		return nil, fmt.Errorf("downloading artifact of job %s: stream ended without artifact metadata", jobID)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if !strings.EqualFold(got, art.GetDigest()) {
		return art, fmt.Errorf("downloading artifact of job %s: received bytes hash to %s, want %s: %w", jobID, got, art.GetDigest(), ErrDigestMismatch)
	}
	if art.GetSizeBytes() != 0 && n != art.GetSizeBytes() {
		return art, fmt.Errorf("downloading artifact of job %s: received %d bytes, want %d: %w", jobID, n, art.GetSizeBytes(), ErrDigestMismatch)
	}
	return art, nil
}

// fetchPresigned GETs a presigned URL into w, reading at most one byte more
// than size (so that a longer body shows as a size mismatch), and returns
// how many bytes it wrote.
func fetchPresigned(ctx context.Context, hc *http.Client, url string, headers map[string]string, size int64, w io.Writer) (int64, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("the store answered %s", resp.Status)
	}
	return io.Copy(w, io.LimitReader(resp.Body, size+1))
}

// ListRejectedCompletions returns one page of fenced-off completions, newest first.
func (c *Client) ListRejectedCompletions(ctx context.Context, req *leaseholdv1.ListRejectedCompletionsRequest) (*leaseholdv1.ListRejectedCompletionsResponse, error) {
	resp, err := c.Operator.ListRejectedCompletions(ctx, req)
	return resp, wrapError(err)
}

// AllRejectedCompletions iterates over every rejected completion matching
// req, following pages as AllJobs does.
func (c *Client) AllRejectedCompletions(ctx context.Context, req *leaseholdv1.ListRejectedCompletionsRequest) iter.Seq2[*leaseholdv1.RejectedCompletion, error] {
	return func(yield func(*leaseholdv1.RejectedCompletion, error) bool) {
		r := &leaseholdv1.ListRejectedCompletionsRequest{}
		if req != nil {
			r = proto.CloneOf(req)
		}
		for {
			resp, err := c.ListRejectedCompletions(ctx, r)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, rc := range resp.GetRejections() {
				if !yield(rc, nil) {
					return
				}
			}
			if resp.GetNextPageToken() == "" {
				return
			}
			r.PageToken = resp.GetNextPageToken()
		}
	}
}

// ReplayJobs re-queues FAILED jobs, or with DryRun set, reports what it would do.
func (c *Client) ReplayJobs(ctx context.Context, req *leaseholdv1.ReplayJobsRequest) (*leaseholdv1.ReplayJobsResponse, error) {
	resp, err := c.Operator.ReplayJobs(ctx, req)
	return resp, wrapError(err)
}

// PauseDispatch stops the coordinator granting new leases.
func (c *Client) PauseDispatch(ctx context.Context, reason string) (*leaseholdv1.PauseDispatchResponse, error) {
	resp, err := c.Operator.PauseDispatch(ctx, &leaseholdv1.PauseDispatchRequest{Reason: reason})
	return resp, wrapError(err)
}

// ResumeDispatch lets the coordinator grant leases again.
func (c *Client) ResumeDispatch(ctx context.Context, reason string) (*leaseholdv1.ResumeDispatchResponse, error) {
	resp, err := c.Operator.ResumeDispatch(ctx, &leaseholdv1.ResumeDispatchRequest{Reason: reason})
	return resp, wrapError(err)
}

// GetAudit returns one page of audit records, newest first.
func (c *Client) GetAudit(ctx context.Context, req *leaseholdv1.GetAuditRequest) (*leaseholdv1.GetAuditResponse, error) {
	resp, err := c.Operator.GetAudit(ctx, req)
	return resp, wrapError(err)
}

// AllAudit iterates over audit records from req.PageToken on, newest first,
// following pages as AllJobs does.
func (c *Client) AllAudit(ctx context.Context, req *leaseholdv1.GetAuditRequest) iter.Seq2[*leaseholdv1.AuditRecord, error] {
	return func(yield func(*leaseholdv1.AuditRecord, error) bool) {
		r := &leaseholdv1.GetAuditRequest{}
		if req != nil {
			r = proto.CloneOf(req)
		}
		for {
			resp, err := c.GetAudit(ctx, r)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, rec := range resp.GetRecords() {
				if !yield(rec, nil) {
					return
				}
			}
			if resp.GetNextPageToken() == "" {
				return
			}
			r.PageToken = resp.GetNextPageToken()
		}
	}
}
