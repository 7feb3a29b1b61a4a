package coordinator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"

	"github.com/leasehold/leasehold/client/reason"
	"github.com/leasehold/leasehold/coordinator/internal/edge"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// testBundle is a coordinator serving on loopback TCP and a client
// connection to it.
type testBundle struct {
	c    *Coordinator
	addr string
	conn *grpc.ClientConn
	logs *syncBuffer
}

// setup starts a coordinator with cfg (a temporary data directory and a
// log buffer unless set) and connects to it; both end with the test.
func setup(t *testing.T, cfg Config) *testBundle {
	t.Helper()
	b := &testBundle{logs: &syncBuffer{}}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(b.logs, nil))
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- c.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	b.c, b.addr, b.conn = c, lis.Addr().String(), conn
	t.Cleanup(func() {
		conn.Close()
		c.Close()
		<-served
	})
	return b
}

// bearer returns ctx carrying a bearer token.
func bearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// rawCodec sends the bytes it is given as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// errorInfo returns the ErrorInfo and BadRequest of err.
func errorInfo(err error) (*errdetails.ErrorInfo, *errdetails.BadRequest) {
	var (
		info *errdetails.ErrorInfo
		bad  *errdetails.BadRequest
	)
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			bad = d
		}
	}
	return info, bad
}

// TestMalformedRequestIsInvalidArgument checks that a request grpc-go
// cannot decode is refused INVALID_ARGUMENT, not INTERNAL.
func TestMalformedRequestIsInvalidArgument(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// documents[0].name is not UTF-8: bytes where a string field goes.
	doc := protowire.AppendTag(nil, 1, protowire.BytesType)
	doc = protowire.AppendBytes(doc, []byte{'a', 0xff, '.', 'p', 'd', 'f'})
	req := protowire.AppendTag(nil, 1, protowire.BytesType)
	req = protowire.AppendString(req, "alpha")
	req = protowire.AppendTag(req, 3, protowire.BytesType)
	req = protowire.AppendBytes(req, doc)
	var resp []byte
	err := b.conn.Invoke(bearer(ctx, "dev-alpha"), leaseholdv1.JobService_SubmitBatch_FullMethodName, &req, &resp, grpc.ForceCodecV2(rawCodec{}))
	if got := status.Code(err); got != codes.InvalidArgument {
		t.Fatalf("SubmitBatch with a name that is not UTF-8 = %v, want InvalidArgument", err)
	}
	info, bad := errorInfo(err)
	if info.GetReason() != string(reason.MalformedRequest) || info.GetDomain() != "leasehold.v1" {
		t.Errorf("ErrorInfo = %v, want MALFORMED_REQUEST in leasehold.v1", info)
	}
	if v := bad.GetFieldViolations(); len(v) != 1 || v[0].GetField() != "documents[0].name" {
		t.Errorf("BadRequest = %v, want documents[0].name", bad)
	}
}

// TestMaxRecvMsgSize checks the receive limit's formula and that it
// follows the batch limits over real gRPC.
func TestMaxRecvMsgSize(t *testing.T) {
	t.Parallel()
	if got, want := (Config{}).MaxRecvMsgSize(), 16<<20+500*4<<10+64<<10; got != want {
		t.Errorf("default MaxRecvMsgSize = %d, want %d", got, want)
	}
	if got, want := (Config{MaxBatchInlineBytes: 1 << 20, MaxDocuments: 10}).MaxRecvMsgSize(), 1<<20+10*4<<10+64<<10; got != want {
		t.Errorf("MaxRecvMsgSize = %d, want %d", got, want)
	}
	batch := func(docs, size int) *leaseholdv1.SubmitBatchRequest {
		req := &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "big"}
		for i := range docs {
			req.Documents = append(req.Documents, &leaseholdv1.Document{Name: "d" + strings.Repeat("x", i) + ".pdf", Content: bytes.Repeat([]byte{'%'}, size)})
		}
		return req
	}
	t.Run("A batch within the default limits but over grpc-go's 4 MiB default is received", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b := setup(t, Config{})
		_, err := leaseholdv1.NewJobServiceClient(b.conn).SubmitBatch(bearer(ctx, "dev-alpha"), batch(20, 250<<10))
		if err != nil {
			t.Errorf("SubmitBatch of 20 × 250 KiB: %v", err)
		}
	})
	t.Run("A message over the limit the batch limits give is RESOURCE_EXHAUSTED", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b := setup(t, Config{MaxBatchInlineBytes: 64 << 10, MaxDocuments: 2})
		_, err := leaseholdv1.NewJobServiceClient(b.conn).SubmitBatch(bearer(ctx, "dev-alpha"), batch(1, 200<<10))
		if got := status.Code(err); got != codes.ResourceExhausted {
			t.Errorf("SubmitBatch of 200 KiB with a 136 KiB receive limit = %v, want ResourceExhausted", err)
		}
	})
}

// TestKeepaliveDropsDeadConnections checks that the server pings an idle
// connection and closes it when the pings go unanswered, with the
// intervals shortened.
func TestKeepaliveDropsDeadConnections(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{keepalive: &keepalive.ServerParameters{Time: 50 * time.Millisecond, Timeout: 50 * time.Millisecond}})
	conn, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A client that says hello in HTTP/2 and then never answers: the
	// preface and an empty SETTINGS frame, nothing more.
	hello := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)
	if _, err := conn.Write(hello); err != nil {
		t.Fatal(err)
	}
	// Failsafe only: the server should close the connection within about
	// 100 ms; without keepalive it never does.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	pinged := false
	for {
		var hdr [9]byte
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the server kept a connection that answers no ping (pinged: %v)", pinged)
			}
			break
		}
		length := int(binary.BigEndian.Uint32(append([]byte{0}, hdr[:3]...)))
		if hdr[3] == 6 { // PING
			pinged = true
		}
		if _, err := io.CopyN(io.Discard, conn, int64(length)); err != nil {
			break
		}
	}
	if !pinged {
		t.Errorf("the server closed the connection without pinging it first")
	}
}

// TestStreamCapsAreWired checks that a principal's 65th WatchBatch stream
// is refused RESOURCE_EXHAUSTED TOO_MANY_STREAMS.
func TestStreamCapsAreWired(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alpha := bearer(ctx, "dev-alpha")
	jc := leaseholdv1.NewJobServiceClient(b.conn)
	resp, err := jc.SubmitBatch(alpha, &leaseholdv1.SubmitBatchRequest{Team: "alpha", RequestId: "w",
		Documents: []*leaseholdv1.Document{{Name: "a.pdf", Content: []byte("%PDF")}}})
	if err != nil {
		t.Fatal(err)
	}
	watch := func() error {
		s, err := jc.WatchBatch(alpha, &leaseholdv1.WatchBatchRequest{BatchId: resp.GetBatch().GetId()})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	for i := range edge.DefaultWatchStreams {
		if err := watch(); err != nil {
			t.Fatalf("watch %d: %v", i+1, err)
		}
	}
	err = watch()
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Fatalf("watch %d = %v, want ResourceExhausted", edge.DefaultWatchStreams+1, err)
	}
	if info, _ := errorInfo(err); info.GetReason() != string(reason.TooManyStreams) {
		t.Errorf("reason = %q, want %s", info.GetReason(), reason.TooManyStreams)
	}
	if _, err := leaseholdv1.NewJobServiceClient(b.conn).WatchBatch(bearer(ctx, "dev-beta"), &leaseholdv1.WatchBatchRequest{BatchId: resp.GetBatch().GetId()}); err != nil {
		t.Errorf("another principal's watch: %v", err)
	}
}

// TestRefusalFloodIsNotLoggedPerCall checks that a flood of
// unauthenticated calls writes a bounded number of log lines and is
// counted whole. The flood's one connection makes no authenticated call,
// so it is given longer than a loaded machine may take for the 300 calls
// before the connection is closed for that (see
// TestConnectionsWithoutAuthenticatedCallsAreClosed).
func TestRefusalFloodIsNotLoggedPerCall(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MetricsListen: "127.0.0.1:0", ConnAuthTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	jc := leaseholdv1.NewJobServiceClient(b.conn)
	const calls = 300
	start := time.Now()
	for range calls {
		if _, err := jc.GetJob(ctx, &leaseholdv1.GetJobRequest{JobId: "j-1"}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("GetJob without a token = %v, want Unauthenticated", err)
		}
	}
	windows := int(time.Since(start)/time.Second) + 1
	lines := strings.Count(b.logs.String(), "grpc.code=Unauthenticated")
	// Each window lets DefaultLinesPerSecond through and may add a summary.
	if limit := windows * (edge.DefaultLinesPerSecond + 1); lines > limit {
		t.Errorf("%d refused calls in %d window(s) wrote %d log lines, want at most %d", calls, windows, lines, limit)
	}
	body := scrapeMetrics(t, b.c.MetricsAddr())
	if want := `leasehold_refused_calls_total{code="Unauthenticated"} 300`; !strings.Contains(body, want) {
		t.Errorf("metrics lack %q", want)
	}
}

// TestNewFailsCleanly checks that New releases what it opened when a
// later step fails, so that the next New on the same directory succeeds.
func TestNewFailsCleanly(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)

	t.Run("A metrics port in use fails New without a panic and releases the database", func(t *testing.T) {
		t.Parallel()
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		dir := t.TempDir()
		_, err = New(Config{DataDir: dir, MetricsListen: taken.Addr().String(), Logger: quiet})
		if err == nil || !strings.Contains(err.Error(), "metrics") {
			t.Fatalf("New with the metrics port taken = %v, want an error naming metrics", err)
		}
		c, err := New(Config{DataDir: dir, Logger: quiet})
		if err != nil {
			t.Fatalf("New after the failed one: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	t.Run("A failure right after the database opened releases it", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		// An unfinished-jobs index naming a job without a record fails the
		// engine's rebuild, the step after the database opens.
		setIndex := func(on bool) {
			t.Helper()
			st, err := store.Open(filepath.Join(dir, DBFile))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Update(func(tx *store.Tx) error { return tx.SetUnfinished(42, on) }); err != nil {
				t.Fatal(err)
			}
		}
		setIndex(true)
		if _, err := New(Config{DataDir: dir, Logger: quiet}); err == nil {
			t.Fatal("New over an index naming a missing job succeeded")
		}
		setIndex(false)
		c, err := New(Config{DataDir: dir, Logger: quiet})
		if err != nil {
			t.Fatalf("New after the failed one: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	t.Run("An invalid Config is refused before anything is opened", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "data")
		for _, cfg := range []Config{
			{TeamShare: -0.5},
			{LeaseTTL: -time.Second},
			{BackoffBase: time.Minute, BackoffCap: time.Second},
			{MaxBatchInlineBytes: -1},
			{TeamWeights: map[string]int{"alpha": 0}},
		} {
			cfg.DataDir, cfg.Logger = dir, quiet
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "Config.") {
				t.Errorf("New(%+v) = %v, want an error naming the field", cfg, err)
			}
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("data directory after refused configs: %v, want it absent", err)
		}
	})
}
