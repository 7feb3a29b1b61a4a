package renderer_test

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// TestHTTPEndpointsSurviveAFlood opens more connections to a renderer's
// HTTP endpoints from 127.0.0.2 than they serve in all, none sending a
// request: the address holds its share (8) and the rest are closed and
// counted, and a probe from 127.0.0.1 is answered. Without the share the
// flood takes every connection and the probe is refused; without limits
// nothing is counted and the flood holds as many descriptors as it opens.
func TestHTTPEndpointsSurviveAFlood(t *testing.T) {
	t.Parallel()
	w, err := renderer.New(renderer.Config{Coordinator: "127.0.0.1:7070", ID: "r-1", Provider: newMock(t, mock.Config{}),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis = w.ListenHTTP(lis)
	srv := w.HTTPServer()
	go srv.Serve(lis) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	addr := lis.Addr().String()

	const flood = 70 // more than the 64 the endpoints serve
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	for range flood {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dialing %s from 127.0.0.2: %v", addr, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	// The endpoints accept in order, so the probe is judged after every
	// connection of the flood.
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}} // a failsafe
	get := func(path string) string {
		t.Helper()
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s from 127.0.0.1 while 127.0.0.2 floods: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d, want 200", path, resp.StatusCode)
		}
		return string(body)
	}
	get("/healthz")
	want := `leasehold_renderer_http_connections_refused_total{cause="per_address"} 62`
	if m := get("/metrics"); !strings.Contains(m, want) {
		t.Errorf("metrics lack %s; they say:\n%s", want, grepLines(m, "http_connections_refused"))
	}
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			b.WriteString(line)
		}
	}
	return b.String()
}
