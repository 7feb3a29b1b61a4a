package cli

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/security/securitytest"
)

// errNotDialled stops a command after its options were checked by a real
// Dial to the address given, before any call.
var errNotDialled = errors.New("not dialled")

// TestTransportFlags checks the global TLS and plaintext flags: a token
// goes in plaintext only to loopback unless --insecure-plaintext, TLS
// flags make the client dial TLS, and mistakes are usage errors.
func TestTransportFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := securitytest.NewCA(t, "test CA")
	caFile := ca.File(t, dir)
	cert, key := securitytest.WriteKeyPair(t, dir, "client", ca.Client(t, "cli"))

	// dialOnly makes b's Dial check the options against the address given,
	// as client.Dial does, and stop there.
	dialOnly := func(b *testBundle, dialErr *error) {
		b.env.Dial = func(addr string, opts ...client.Option) (*client.Client, error) {
			c, err := client.Dial(addr, opts...)
			*dialErr = err
			if err != nil {
				return nil, err
			}
			c.Close()
			return nil, errNotDialled
		}
	}
	tests := []struct {
		name     string
		args     []string
		vars     map[string]string
		wantCode int
		wantErr  string // in stderr
		dialOK   bool
	}{
		{"a token in plaintext to another host is refused with the flags that fix it",
			[]string{"--addr", "10.0.0.5:7070", "--token", "t", "get", "j-1"}, nil, ExitUsage, "--insecure-plaintext", false},
		{"--insecure-plaintext lets it go", []string{"--addr", "10.0.0.5:7070", "--token", "t", "--insecure-plaintext", "get", "j-1"}, nil, ExitError, errNotDialled.Error(), true},
		{"LEASEHOLD_INSECURE_PLAINTEXT lets it go", []string{"--addr", "10.0.0.5:7070", "get", "j-1"},
			map[string]string{"LEASEHOLD_TOKEN": "t", "LEASEHOLD_INSECURE_PLAINTEXT": "true"}, ExitError, errNotDialled.Error(), true},
		{"TLS flags after the command dial TLS", []string{"--addr", "10.0.0.5:7070", "--token", "t", "get", "j-1", "--tls-ca", caFile, "--tls-cert", cert, "--tls-key", key},
			nil, ExitError, errNotDialled.Error(), true},
		{"TLS from the environment", []string{"get", "j-1"},
			map[string]string{"LEASEHOLD_ADDR": "10.0.0.5:7070", "LEASEHOLD_TOKEN": "t", "LEASEHOLD_TLS_CA": caFile, "LEASEHOLD_TLS_SERVER_NAME": "coordinator"},
			ExitError, errNotDialled.Error(), true},
		{"--tls alone uses the system's roots", []string{"--tls", "--addr", "10.0.0.5:7070", "--token", "t", "get", "j-1"}, nil, ExitError, errNotDialled.Error(), true},
		{"a certificate without its key", []string{"--tls-cert", cert, "get", "j-1"}, nil, ExitUsage, "--tls-cert and --tls-key go together", false},
		{"TLS with insecure plaintext", []string{"--tls", "--insecure-plaintext", "get", "j-1"}, nil, ExitUsage, "excludes", false},
		{"a CA file that is missing", []string{"--tls-ca", dir + "/none.pem", "get", "j-1"}, nil, ExitUsage, "none.pem", false},
		{"a malformed boolean variable", []string{"get", "j-1"}, map[string]string{"LEASEHOLD_TLS": "yes please"}, ExitUsage, "LEASEHOLD_TLS=", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for k, v := range tc.vars {
				b.vars[k] = v
			}
			var dialErr error
			dialOnly(b, &dialErr)
			code, _, errOut := b.run(t, tc.args...)
			if code != tc.wantCode || !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("exit status %d, stderr %q; want %d and %q", code, errOut, tc.wantCode, tc.wantErr)
			}
			if tc.dialOK && dialErr != nil {
				t.Errorf("Dial = %v, want the options accepted", dialErr)
			}
		})
	}
}

// TestCommandTrace checks that a command is one trace: its span is the
// parent of the spans of its calls.
func TestCommandTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(t.Context()) })
	b.env.TracerProvider = tp
	if code, _, errOut := b.run(t, "get", "j-404"); code != ExitError {
		t.Fatalf("exit status %d, want 1 (not found); stderr %q", code, errOut)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	cmd, call := spans["leasehold get"], spans["leasehold.v1.JobService/GetJob"]
	if cmd == nil || call == nil {
		t.Fatalf("spans = %v, want the command's and its GetJob call's", spans)
	}
	if call.Parent().SpanID() != cmd.SpanContext().SpanID() || call.SpanKind() != trace.SpanKindClient {
		t.Errorf("GetJob span parent %v kind %v, want the command span %v and client", call.Parent().SpanID(), call.SpanKind(), cmd.SpanContext().SpanID())
	}
	if cmd.Status().Code.String() != "Error" {
		t.Errorf("command span status = %v, want Error for a failed command", cmd.Status())
	}
}

// TestUnreachable checks what the command says when it never reaches a
// coordinator, over real sockets: nothing listening, a listener that
// closes every connection at once (as one past its connection limits
// does), the same with --tls, and a coordinator's own UNAVAILABLE, which
// is left as it came.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nothing := closed.Addr().String()
	closed.Close()

	// closing accepts every connection and closes it before a byte.
	closing, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := closing.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { closing.Close(); <-done })

	run := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		env := DefaultEnv(strings.NewReader(""), &out, &errOut)
		env.Getenv = func(k string) string {
			if k == "LEASEHOLD_TOKEN" {
				return "dev-operator"
			}
			return ""
		}
		return Run(t.Context(), env, args), errOut.String()
	}
	for _, tc := range []struct {
		name string
		args []string
		// want begins stderr, hint ends it.
		want, hint string
	}{{
		name: "nothing listens",
		args: []string{"--addr", nothing, "get", "1"},
		want: "leasehold: nothing accepts connections at " + nothing + ": connection refused (UNAVAILABLE)\n",
		hint: "\n  is the coordinator running there? --addr or LEASEHOLD_ADDR names another address\n",
	}, {
		name: "closed at once",
		args: []string{"--addr", closing.Addr().String(), "get", "1"},
		want: "leasehold: the coordinator at " + closing.Addr().String() + " closed the connection: ",
		hint: "(UNAVAILABLE)\n  its listener closes connections past --max-connections and --max-connections-per-address " +
			"(leasehold_connections_refused_total counts them), and a listener with TLS closes plaintext ones (--tls)\n",
	}, {
		name: "closed at once, with TLS",
		args: []string{"--addr", closing.Addr().String(), "--tls", "get", "1"},
		want: "leasehold: the TLS handshake with the coordinator at " + closing.Addr().String() + " failed: ",
		hint: "(UNAVAILABLE)\n  a coordinator without TLS is reached without --tls and the --tls-* flags\n",
	}} {
		code, stderr := run(tc.args...)
		if code != ExitError || !strings.HasPrefix(stderr, tc.want) || !strings.HasSuffix(stderr, tc.hint) {
			t.Errorf("%s: exit %d, stderr %q; want %d, %q ... %q", tc.name, code, stderr, ExitError, tc.want, tc.hint)
		}
	}

	// A coordinator's own UNAVAILABLE is not the transport's.
	own := &client.Error{Code: grpccodes.Unavailable, Message: "connection error: desc = \"coordinator restarting\"", Err: errors.New("x")}
	if got := unreachable(own, "a:1", false); got != error(own) {
		t.Errorf("unreachable(%v) = %v, want it unchanged", own, got)
	}
	withReason := &client.Error{Code: grpccodes.Unavailable, Message: "write: broken pipe", Reason: "STORAGE_UNAVAILABLE", Err: errors.New("x")}
	if got := unreachable(withReason, "a:1", false); got != error(withReason) {
		t.Errorf("unreachable(%v) = %v, want it unchanged", withReason, got)
	}
}
