package artifacts_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/artifacts"
)

// BenchmarkS3 times the calls a coordinator makes for each stored
// preview, each on a goroutine of its own as the server makes them: a
// presigned upload URL (no request) and the check of the uploaded object
// (a HEAD to versitygw on loopback). Most of a call is the SDK's own work,
// so its allocations and stack growth show here.
func BenchmarkS3(b *testing.B) {
	st, _ := startS3(b)
	ctx := context.Background()
	content := []byte("\x89PNG a preview")
	key := artifacts.Key{Team: "team-a", Digest: artifacts.Digest(content)}
	if err := st.Put(ctx, key, content); err != nil {
		b.Fatal(err)
	}
	onOwnGoroutine := func(b *testing.B, call func() error) {
		b.ReportAllocs()
		done := make(chan error)
		for b.Loop() {
			go func() { done <- call() }()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("PresignPut", func(b *testing.B) {
		onOwnGoroutine(b, func() error {
			_, err := st.PresignPut(ctx, key, int64(len(content)), time.Minute)
			return err
		})
	})
	b.Run("Stat", func(b *testing.B) {
		onOwnGoroutine(b, func() error {
			_, err := st.Stat(ctx, key)
			return err
		})
	})
}
