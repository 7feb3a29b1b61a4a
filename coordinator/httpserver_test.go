package coordinator

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/internal/connlimit"
	"github.com/leasehold/leasehold/internal/pipenet"
)

// pipeListener is an in-memory listener on the metrics address, so that
// an HTTP server runs inside a synctest bubble on its fake clock.
type pipeListener struct{ *pipenet.Listener }

func newPipeListener() pipeListener {
	return pipeListener{pipenet.Listen(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7071})}
}

// dial returns the client end of a new connection, once accepted.
func (l pipeListener) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := l.Dial(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// limitsHandler answers "/" with "ok", reads the body of "/upload" and
// writes 4 MiB for "/big".
func limitsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(make([]byte, 4<<20)) })
	return mux
}

// serveLimited serves limitsHandler with the metrics address's server and
// connection cap under l, until the bubble's test ends.
func serveLimited(t *testing.T, l httpLimits) pipeListener {
	lis := newPipeListener()
	srv := newHTTPServer(limitsHandler(), l)
	served := make(chan error, 1)
	conns := connlimit.New(connlimit.Limits{Max: l.MaxConns, PerAddress: l.PerAddress})
	go func() { served <- srv.Serve(conns.Listen(lis)) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis
}

// get sends GET path on c and reads the response.
func get(t *testing.T, c net.Conn, br *bufio.Reader, path string) string {
	t.Helper()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: 127.0.0.1:7071\r\n\r\n", path); err != nil {
		t.Fatalf("writing the request: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// closedAfter reads c until the server closes it and returns how long that
// took on the bubble's clock.
func closedAfter(br io.Reader) time.Duration {
	start := time.Now()
	_, _ = io.Copy(io.Discard, br)
	return time.Since(start)
}

// TestMetricsListenerLimits checks the metrics address's timeouts and
// connection cap on the fake clock of a synctest bubble: a client too slow
// or idle is cut off when its limit passes, and a connection past the cap
// is closed at once, another being served once one closes.
func TestMetricsListenerLimits(t *testing.T) {
	t.Parallel()
	l := defaultHTTPLimits

	t.Run("Headers that never end are cut off after ReadHeader", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := serveLimited(t, l).dial(t)
			defer c.Close()
			fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1:7071\r\n")
			if got := closedAfter(c); got != l.ReadHeader {
				t.Errorf("closed after %v, want %v", got, l.ReadHeader)
			}
		})
	})

	t.Run("A body that never ends is cut off after Read", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := serveLimited(t, l).dial(t)
			defer c.Close()
			fmt.Fprint(c, "POST /upload HTTP/1.1\r\nHost: 127.0.0.1:7071\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nsome")
			if got := closedAfter(c); got != l.Read {
				t.Errorf("closed after %v, want %v", got, l.Read)
			}
		})
	})

	t.Run("A response the client does not read is cut off after Write", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := serveLimited(t, l).dial(t)
			defer c.Close()
			fmt.Fprint(c, "GET /big HTTP/1.1\r\nHost: 127.0.0.1:7071\r\n\r\n")
			// The client reads nothing until the write timeout has passed
			// on the bubble's clock.
			time.Sleep(l.Write + time.Second)
			if n, _ := io.Copy(io.Discard, c); n >= 4<<20 {
				t.Errorf("read %d bytes after %v, want the response cut off at %v", n, l.Write+time.Second, l.Write)
			}
		})
	})

	t.Run("An idle connection is closed after Idle", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := serveLimited(t, l).dial(t)
			defer c.Close()
			br := bufio.NewReader(c)
			if body := get(t, c, br, "/"); body != "ok" {
				t.Fatalf("GET / = %q", body)
			}
			if got := closedAfter(br); got != l.Idle {
				t.Errorf("closed after %v idle, want %v", got, l.Idle)
			}
		})
	})

	t.Run("A connection past the cap is closed at once, and one is served again once another closed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			capped := l
			capped.MaxConns = 2
			lis := serveLimited(t, capped)
			var open []net.Conn
			for range capped.MaxConns {
				c := lis.dial(t)
				defer c.Close()
				if body := get(t, c, bufio.NewReader(c), "/"); body != "ok" {
					t.Fatalf("GET / = %q", body)
				}
				open = append(open, c)
			}
			extra := lis.dial(t)
			defer extra.Close()
			if got := closedAfter(extra); got != 0 {
				t.Errorf("a connection past the cap was closed after %v, want at once", got)
			}
			open[0].Close()
			synctest.Wait()
			c := lis.dial(t)
			defer c.Close()
			if body := get(t, c, bufio.NewReader(c), "/"); body != "ok" {
				t.Errorf("GET / once a connection closed = %q, want ok", body)
			}
		})
	})
}

// TestMetricsServerHasTheLimits checks that the coordinator's metrics
// address is served with the limits above.
func TestMetricsServerHasTheLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MetricsListen: "127.0.0.1:0", Console: true})
	srv := b.c.metricsSrv
	conns := b.c.conns.http.Limits()
	got := httpLimits{ReadHeader: srv.ReadHeaderTimeout, Read: srv.ReadTimeout, Write: srv.WriteTimeout, Idle: srv.IdleTimeout, MaxConns: conns.Max, PerAddress: conns.PerAddress}
	if got != defaultHTTPLimits {
		t.Errorf("metrics server limits = %+v, want %+v", got, defaultHTTPLimits)
	}
}
