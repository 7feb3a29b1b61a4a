package artifacts_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
	"github.com/leasehold/leasehold/internal/s3server"
)

// s3Binary is versitygw from $LEASEHOLD_BIN or the repository's bin/.
func s3Binary(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("LEASEHOLD_BIN")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "..", "bin")
	} else if !filepath.IsAbs(dir) {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "..", dir)
	}
	bin := s3server.Binary(dir)
	if bin == "" {
		t.Skip("no versitygw in " + dir + ": scripts/build builds it")
	}
	return bin
}

// startS3 starts versitygw and opens the S3 store on it, with the
// server's credentials in the environment.
func startS3(t testing.TB) (*artifacts.S3, *s3server.Server) {
	srv := s3server.Start(t, s3Binary(t))
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	u, _ := url.Parse(srv.URL())
	st, err := artifacts.OpenS3(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	return st, srv
}

// TestS3 runs the S3 store against a real S3-compatible server.
func TestS3(t *testing.T) {
	st, srv := startS3(t)
	ctx := context.Background()
	if err := st.Check(ctx); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	put := func(t *testing.T, p artifacts.Presigned, body []byte) int {
		t.Helper()
		req, _ := http.NewRequest(p.Method, p.URL, bytes.NewReader(body))
		for k, v := range p.Headers {
			req.Header.Set(k, v)
		}
		req.ContentLength = int64(len(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	content := []byte("\x89PNG a preview of the right size")
	key := artifacts.Key{Team: "team-a", Digest: artifacts.Digest(content)}

	t.Run("PutThenStatReportsSizeAndChecksum", func(t *testing.T) {
		if err := st.Put(ctx, key, content); err != nil {
			t.Fatal(err)
		}
		info, err := st.Stat(ctx, key)
		if err != nil || info.Size != int64(len(content)) || info.SHA256 != key.Digest {
			t.Fatalf("Stat = %+v, %v; want size %d and checksum %s", info, err, len(content), key.Digest)
		}
		n := 0
		if err := st.List(ctx, func(o artifacts.Object) error { n++; return nil }); err != nil || n != 1 {
			t.Errorf("List found %d objects (%v), want 1", n, err)
		}
	})

	// A cluster checks every stored preview's completion with a HEAD as
	// it arrives: a burst of checks must find the connections the last
	// burst opened, not dial new ones (and leave the old in TIME_WAIT).
	t.Run("ABurstOfChecksReusesTheLastBurstsConnections", func(t *testing.T) {
		const burst = 64
		dials := func() int {
			var arrived sync.WaitGroup
			arrived.Add(burst)
			var fresh atomic.Int32
			trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
				if !info.Reused {
					fresh.Add(1)
				}
				// Every check holds its connection until all of them
				// have one: the burst needs burst connections at once.
				arrived.Done()
				arrived.Wait()
			}}
			tctx := httptrace.WithClientTrace(ctx, trace)
			var done sync.WaitGroup
			for range burst {
				done.Go(func() {
					if _, err := st.Stat(tctx, key); err != nil {
						t.Error(err)
					}
				})
			}
			done.Wait()
			return int(fresh.Load())
		}
		// The first burst may reuse a connection of the checks before it,
		// which the server may have closed by the second burst: only
		// such a one may be dialed again, never one the first opened.
		first := dials()
		if again := dials(); again > burst-first {
			t.Errorf("the second burst of %d checks dialed %d connections (the first dialed %d), want at most %d", burst, again, first, burst-first)
		}
	})

	other := []byte("\x89PNG another preview")
	okey := artifacts.Key{Team: "team-a", Digest: artifacts.Digest(other)}

	t.Run("APresignedPutStoresExactlyItsBytesUnderItsKey", func(t *testing.T) {
		p, err := st.PresignPut(ctx, okey, int64(len(other)), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		tampered := bytes.Clone(other)
		tampered[len(tampered)-1] ^= 1
		if code := put(t, p, tampered); code/100 == 2 {
			t.Errorf("other bytes of the same length were stored (%d)", code)
		}
		if code := put(t, p, append(bytes.Clone(other), 'x')); code/100 == 2 {
			t.Errorf("an oversized body was stored (%d)", code)
		}
		elsewhere := p
		elsewhere.URL = strings.Replace(p.URL, okey.Digest, key.Digest, 1)
		if code := put(t, elsewhere, other); code/100 == 2 {
			t.Errorf("the URL stored under another key (%d)", code)
		}
		if _, err := st.Stat(ctx, okey); !errors.Is(err, artifacts.ErrNotFound) {
			t.Fatalf("a refused upload left an object: %v", err)
		}
		if code := put(t, p, other); code/100 != 2 {
			t.Fatalf("the signed upload was refused: %d", code)
		}
		if info, err := st.Stat(ctx, okey); err != nil || info.SHA256 != okey.Digest {
			t.Errorf("Stat = %+v, %v", info, err)
		}
	})

	t.Run("AnExpiredURLIsRefused", func(t *testing.T) {
		p, err := st.PresignPut(ctx, okey, int64(len(other)), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // the fault: the URL's lifetime passing
		if code := put(t, p, other); code/100 == 2 {
			t.Errorf("an expired URL was honoured (%d)", code)
		}
	})

	t.Run("DeleteThenStatIsNotFound", func(t *testing.T) {
		if err := st.Delete(ctx, okey); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Stat(ctx, okey); !errors.Is(err, artifacts.ErrNotFound) {
			t.Errorf("Stat after Delete = %v, want ErrNotFound", err)
		}
	})

	t.Run("AHungStoreIsUnavailable", func(t *testing.T) {
		srv.Pause()
		defer srv.Resume()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := st.Stat(cctx, key)
		if err == nil || errors.Is(err, artifacts.ErrNotFound) {
			t.Errorf("Stat of a stopped store = %v, want a failure", err)
		}
	})
}
