package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/security"
	"github.com/leasehold/leasehold/internal/tracing"
)

// transportOpts are the global flags of the connection's security: TLS,
// mutual TLS, and the explicit permission to send the token in plaintext.
type transportOpts struct {
	TLS               bool
	TLSCA             string
	TLSCert           string
	TLSKey            string
	TLSServerName     string
	InsecurePlaintext bool

	// envErr is the first malformed boolean variable.
	envErr error
	// config is the TLS configuration Validate built, nil for plaintext.
	config *tls.Config
}

// newTransportOpts reads the transport flags' defaults from env.
func newTransportOpts(env Env) transportOpts {
	t := transportOpts{
		TLSCA:         getenv(env, "LEASEHOLD_TLS_CA"),
		TLSCert:       getenv(env, "LEASEHOLD_TLS_CERT"),
		TLSKey:        getenv(env, "LEASEHOLD_TLS_KEY"),
		TLSServerName: getenv(env, "LEASEHOLD_TLS_SERVER_NAME"),
	}
	t.TLS = t.envBool(env, "LEASEHOLD_TLS")
	t.InsecurePlaintext = t.envBool(env, "LEASEHOLD_INSECURE_PLAINTEXT")
	return t
}

// envBool reads a boolean variable; a malformed one is kept as envErr.
func (t *transportOpts) envBool(env Env, name string) bool {
	v := getenv(env, name)
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil && t.envErr == nil {
		t.envErr = usagef("%s=%q: want true or false", name, v)
	}
	return b
}

// register adds the transport flags to fs with t's current values as
// their defaults.
func (t *transportOpts) register(fs *flag.FlagSet) {
	fs.BoolVar(&t.TLS, "tls", t.TLS, "connect over TLS; implied by the other --tls-* flags (env LEASEHOLD_TLS)")
	fs.StringVar(&t.TLSCA, "tls-ca", t.TLSCA, "PEM CA certificates that verify the coordinator; default the system's (env LEASEHOLD_TLS_CA)")
	fs.StringVar(&t.TLSCert, "tls-cert", t.TLSCert, "PEM client certificate, for mutual TLS (env LEASEHOLD_TLS_CERT)")
	fs.StringVar(&t.TLSKey, "tls-key", t.TLSKey, "PEM private key of --tls-cert (env LEASEHOLD_TLS_KEY)")
	fs.StringVar(&t.TLSServerName, "tls-server-name", t.TLSServerName, "`name` the coordinator's certificate must carry, if not the host of --addr (env LEASEHOLD_TLS_SERVER_NAME)")
	fs.BoolVar(&t.InsecurePlaintext, "insecure-plaintext", t.InsecurePlaintext,
		"send the token without TLS to a coordinator not on loopback, where the network itself encrypts (env LEASEHOLD_INSECURE_PLAINTEXT)")
}

// Validate checks the transport flags and reads the TLS files they name.
func (t *transportOpts) Validate() error {
	if t.envErr != nil {
		return t.envErr
	}
	on := t.TLS || t.TLSCA != "" || t.TLSCert != "" || t.TLSKey != "" || t.TLSServerName != ""
	switch {
	case !on:
		return nil
	case t.InsecurePlaintext:
		return usagef("--insecure-plaintext excludes --tls and the --tls-* flags")
	case (t.TLSCert == "") != (t.TLSKey == ""):
		return usagef("--tls-cert and --tls-key go together: give both or neither")
	}
	cfg, err := security.ClientTLS(t.TLSCA, t.TLSCert, t.TLSKey, t.TLSServerName)
	if err != nil {
		return usagef("TLS: %v", err)
	}
	t.config = cfg
	return nil
}

// clientOptions returns the client options of the transport flags.
func (t *transportOpts) clientOptions() []client.Option {
	switch {
	case t.config != nil:
		return []client.Option{client.WithTLS(t.config)}
	case t.InsecurePlaintext:
		return []client.Option{client.WithInsecurePlaintext()}
	}
	return nil
}

// plaintextHint completes the error of a token refused in plaintext with
// the flags that resolve it.
func plaintextHint(err error) error {
	if errors.Is(err, security.ErrPlaintextToken) {
		return usagef("%v (pass --tls-ca or --tls, or --insecure-plaintext)", err)
	}
	return err
}

// tracingShutdownTimeout bounds the export of the command's spans at exit.
const tracingShutdownTimeout = 5 * time.Second

// startTracing returns the tracer provider of the command: env's, or the
// one the OTEL_* variables configure (nil when they configure none), and
// the function that flushes it at exit.
func startTracing(ctx context.Context, env Env) (trace.TracerProvider, func(), error) {
	if env.TracerProvider != nil {
		return env.TracerProvider, func() {}, nil
	}
	tr, err := tracing.Setup(ctx, "leasehold-cli", func(name string) (string, bool) {
		v := getenv(env, name)
		return v, v != ""
	})
	if err != nil {
		return nil, nil, usagef("%v", err)
	}
	flush := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
		defer cancel()
		_ = tr.Shutdown(ctx)
	}
	return tr.Provider, flush, nil
}

// startCommandSpan starts the span of one command, the root of its calls'
// spans, when tp is set; end ends it with the command's error.
func startCommandSpan(ctx context.Context, tp trace.TracerProvider, command string) (context.Context, func(error)) {
	if tp == nil {
		return ctx, func(error) {}
	}
	ctx, span := tp.Tracer("github.com/leasehold/leasehold/client/cli").Start(ctx, "leasehold "+command)
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// unreachable rewrites the error of a call that did not reach the
// coordinator, or lost its connection, into what happened and what to
// try, keeping its code. Such an error is UNAVAILABLE without a reason
// (every UNAVAILABLE the coordinator sends names one), and its message is
// the transport's:
//   - nothing accepts connections at addr (a dial refused);
//   - the TLS handshake failed;
//   - the connection was closed or reset by the other end, which is what
//     a listener past its connection limits does, and a TLS listener to a
//     plaintext client (withTLS says whether this command dialled TLS).
//
// Any other error is returned as it is.
func unreachable(err error, addr string, withTLS bool) error {
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != grpccodes.Unavailable || ce.Reason != "" {
		return err
	}
	desc := ce.Message
	if d, ok := strings.CutPrefix(desc, "connection error: desc = "); ok {
		desc = d
		if u, uerr := strconv.Unquote(d); uerr == nil {
			desc = u
		}
	}
	cause := desc
	if i := strings.LastIndex(desc, ": "); i >= 0 {
		cause = desc[i+2:]
	}
	var msg, hint string
	switch {
	case strings.Contains(desc, "while dialing") && cause == "connection refused":
		msg = fmt.Sprintf("nothing accepts connections at %s: %s", addr, cause)
		hint = "is the coordinator running there? --addr or LEASEHOLD_ADDR names another address"
	case strings.Contains(desc, "authentication handshake failed: "):
		_, cause, _ = strings.Cut(desc, "authentication handshake failed: ")
		msg = fmt.Sprintf("the TLS handshake with the coordinator at %s failed: %s", addr, cause)
		if strings.Contains(cause, "certificate") {
			hint = "--tls-ca names the CA that signed the coordinator's certificate, --tls-server-name the name it carries"
		} else {
			hint = "a coordinator without TLS is reached without --tls and the --tls-* flags"
		}
	case cause == "EOF" || cause == "broken pipe" || cause == "connection reset by peer":
		msg = fmt.Sprintf("the coordinator at %s closed the connection: %s", addr, cause)
		hint = "its listener closes connections past --max-connections and --max-connections-per-address (leasehold_connections_refused_total counts them)"
		if !withTLS {
			hint += ", and a listener with TLS closes plaintext ones (--tls)"
		}
	default:
		return err
	}
	return &exitError{code: ExitError, msg: msg + " (UNAVAILABLE)\n  " + hint}
}
