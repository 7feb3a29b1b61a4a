package coordinator

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestUnauthenticatedStreamIsRefusedBeforeItsBody opens a SubmitBatch
// stream without an authorization header over plain HTTP/2, sends the
// gRPC message header announcing a 16 MiB request and 64 KiB of it, and
// holds the rest back: the status must arrive while the client still holds
// the rest, UNAUTHENTICATED with its reason. A server that reads the
// request before authenticating it answers only once the whole body came,
// so every unauthenticated peer could make it buffer that much per stream.
func TestUnauthenticatedStreamIsRefusedBeforeItsBody(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MetricsListen: "127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // a failsafe: a passing run answers at once
	defer cancel()

	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	body, send := io.Pipe()
	defer send.Close()
	held := make(chan struct{})
	defer close(held)
	const announced = 16 << 20
	go func() {
		prefix := make([]byte, 5) // not compressed, then the length
		binary.BigEndian.PutUint32(prefix[1:], announced)
		if _, err := send.Write(append(prefix, make([]byte, 64<<10)...)); err != nil {
			return // the server refused the stream and the transport closed the body
		}
		<-held // the other 16 MiB - 64 KiB are never sent before the answer
		send.CloseWithError(io.ErrUnexpectedEOF)
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+b.addr+"/leasehold.v1.JobService/SubmitBatch", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("no answer while the body was held back: %v", err)
	}
	defer resp.Body.Close()
	if got := resp.Header.Get("Grpc-Status"); got != "16" {
		t.Fatalf("grpc-status = %q (headers %v), want 16 (UNAUTHENTICATED) before the body", got, resp.Header)
	}
	raw, err := base64.RawStdEncoding.DecodeString(resp.Header.Get("Grpc-Status-Details-Bin"))
	if err != nil {
		t.Fatal(err)
	}
	var st spb.Status
	if err := proto.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	var info errdetails.ErrorInfo
	if len(st.GetDetails()) == 0 || st.GetDetails()[0].UnmarshalTo(&info) != nil || info.GetReason() != "UNAUTHENTICATED" {
		t.Errorf("status details = %v, want ErrorInfo UNAUTHENTICATED", st.GetDetails())
	}
	if body := scrapeMetrics(t, b.c.MetricsAddr()); !strings.Contains(body, `leasehold_refused_calls_total{code="Unauthenticated"} 1`) {
		t.Errorf("the refusal is not counted")
	}
	if !strings.Contains(b.logs.String(), `grpc.method=SubmitBatch`) || !strings.Contains(b.logs.String(), `grpc.code=Unauthenticated`) {
		t.Errorf("the refusal is not logged:\n%s", b.logs)
	}
}

// notifyHandler is a slog.Handler that passes records on and sends the
// message of each record that contains match on msgs, dropping it when
// msgs is full.
type notifyHandler struct {
	slog.Handler
	match string
	msgs  chan string
}

func (h notifyHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		select {
		case h.msgs <- r.Message:
		default:
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h notifyHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return notifyHandler{h.Handler.WithAttrs(attrs), h.match, h.msgs}
}

func (h notifyHandler) WithGroup(name string) slog.Handler {
	return notifyHandler{h.Handler.WithGroup(name), h.match, h.msgs}
}

// TestReloadPrincipals rotates a token through ReloadPrincipals, which
// the command calls on SIGHUP: the removed token is refused from its next
// call and the added one works, without a restart; a file that is not
// valid leaves the principals in force.
func TestReloadPrincipals(t *testing.T) {
	t.Parallel()
	const oldToken, newToken = "old-portal-token-1b9c5e", "new-portal-token-8d0a6f"
	path := filepath.Join(t.TempDir(), "principals.json")
	write := func(token string) {
		t.Helper()
		data := `{"principals": [{"name": "portal", "token": "` + token + `", "team": "portal", "roles": ["submitter"]}]}`
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(oldToken)
	b := setup(t, Config{TokensFile: path})
	jc := leaseholdv1.NewJobServiceClient(b.conn)
	get := func(token string) codes.Code {
		t.Helper()
		_, err := jc.ListJobs(bearer(t.Context(), token), &leaseholdv1.ListJobsRequest{Team: "portal"})
		return status.Code(err)
	}
	if got := get(oldToken); got != codes.OK {
		t.Fatalf("before the reload: the file's token = %v, want OK", got)
	}

	write(newToken)
	if err := b.c.ReloadPrincipals(); err != nil {
		t.Fatalf("ReloadPrincipals: %v", err)
	}
	if got, want := []codes.Code{get(oldToken), get(newToken)}, []codes.Code{codes.Unauthenticated, codes.OK}; got[0] != want[0] || got[1] != want[1] {
		t.Errorf("after the reload: removed token %v, added token %v; want %v", got[0], got[1], want)
	}

	if err := os.WriteFile(path, []byte(`{"principals": [{"name": "portal", "token": "short", "team": "portal", "roles": ["submitter"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.c.ReloadPrincipals(); err == nil || !strings.Contains(err.Error(), `principal 0 ("portal")`) {
		t.Errorf("ReloadPrincipals of an invalid file = %v, want the entry at fault", err)
	}
	if got := get(newToken); got != codes.OK {
		t.Errorf("after a failed reload the token in force = %v, want OK", got)
	}
	if !strings.Contains(b.logs.String(), "reloading the principals file failed") {
		t.Errorf("the failed reload is not logged:\n%s", b.logs)
	}
}
