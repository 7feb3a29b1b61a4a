package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/internal/fakeserver"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// inlineDocs returns n documents of size inline bytes each, named d-00, d-01, ...
func inlineDocs(n, size int) []*leaseholdv1.Document {
	docs := make([]*leaseholdv1.Document, n)
	for i := range docs {
		docs[i] = &leaseholdv1.Document{Name: fmt.Sprintf("d-%02d", i), ContentType: "text/plain", SizeBytes: int64(size), Content: bytes.Repeat([]byte{'x'}, size)}
	}
	return docs
}

// refDoc returns a document sent by reference, declaring size bytes.
func refDoc(name string, size int64) *leaseholdv1.Document {
	return &leaseholdv1.Document{Name: name, SizeBytes: size, SourceUri: "file:///srv/" + name}
}

func batchSizes(batches [][]*leaseholdv1.Document) []int {
	var n []int
	for _, b := range batches {
		n = append(n, len(b))
	}
	return n
}

func TestSplitDocuments(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	many := make([]*leaseholdv1.Document, 1001)
	for i := range many {
		many[i] = refDoc(fmt.Sprint(i), 1)
	}
	tests := []struct {
		name   string
		docs   []*leaseholdv1.Document
		limits client.BatchLimits
		want   []int
	}{
		{"no documents make no batches", nil, client.BatchLimits{}, nil},
		{"a small batch stays whole", inlineDocs(3, 10), client.BatchLimits{}, []int{3}},
		{"documents past 500 start a new batch", many, client.BatchLimits{}, []int{500, 500, 1}},
		{"inline bytes past 16 MiB start a new batch", inlineDocs(70, 250_000), client.BatchLimits{}, []int{67, 3}},
		{"inline bytes past a configured limit start a new batch", inlineDocs(20, 250_000), client.BatchLimits{MaxInlineBytes: 4 * mib}, []int{16, 4}},
		{"a configured document count applies", inlineDocs(5, 1), client.BatchLimits{MaxDocuments: 2}, []int{2, 2, 1}},
		{"declared bytes past 200 MiB start a new batch", []*leaseholdv1.Document{refDoc("a", 150*mib), refDoc("b", 60*mib), refDoc("c", 10*mib)}, client.BatchLimits{}, []int{1, 2}},
		{"a document over a byte limit alone is a batch of its own", append(inlineDocs(2, 10), inlineDocs(1, 100)...), client.BatchLimits{MaxInlineBytes: 50}, []int{2, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := client.SplitDocuments(tt.docs, tt.limits)
			if diff := cmp.Diff(tt.want, batchSizes(got)); diff != "" {
				t.Errorf("batch sizes mismatch (-want +got):\n%s", diff)
			}
			var flat []*leaseholdv1.Document
			for _, b := range got {
				flat = append(flat, b...)
			}
			if len(flat) != len(tt.docs) {
				t.Fatalf("batches hold %d documents, want %d", len(flat), len(tt.docs))
			}
			for i := range flat {
				if flat[i] != tt.docs[i] {
					t.Fatalf("document %d is %s, want %s: order not kept", i, flat[i].GetName(), tt.docs[i].GetName())
				}
			}
		})
	}
}

// dialFake dials a started fake with opts.
func dialFake(t *testing.T, fake *fakeserver.Server, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(fakeserver.Target, append(opts, client.WithDialOptions(fakeserver.Start(t, fake)))...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// requestShape is what a test checks of each SubmitBatch request.
type requestShape struct {
	RequestID string
	Docs      int
	Inline    int
}

func shapes(reqs []*leaseholdv1.SubmitBatchRequest) []requestShape {
	var got []requestShape
	for _, r := range reqs {
		n := 0
		for _, d := range r.GetDocuments() {
			n += len(d.GetContent())
		}
		got = append(got, requestShape{r.GetRequestId(), len(r.GetDocuments()), n})
	}
	return got
}

func TestSubmitDocumentsSplitsByBytes(t *testing.T) {
	t.Parallel()

	t.Run("20 documents of 250,000 bytes go as 2 requests that fit a 4 MiB receive limit", func(t *testing.T) {
		t.Parallel()
		const limit = 4 << 20
		fake := fakeserver.New()
		fake.MaxRecvMsgSize = limit // what a coordinator with gRPC's default limit accepts
		c := dialFake(t, fake, client.WithBatchLimits(client.BatchLimits{MaxInlineBytes: limit}))

		resps, err := c.SubmitDocuments(t.Context(), "a", "R", inlineDocs(20, 250_000), client.SubmitOptions{})
		if err != nil {
			t.Fatalf("SubmitDocuments: %v", err)
		}
		want := []requestShape{{"R-0", 16, 4_000_000}, {"R-1", 4, 1_000_000}}
		if diff := cmp.Diff(want, shapes(fake.Submits())); diff != "" {
			t.Errorf("requests mismatch (-want +got):\n%s", diff)
		}
		for _, r := range fake.Submits() {
			if n := proto.Size(r); n > limit {
				t.Errorf("request %s is %d bytes encoded, over the %d-byte receive limit", r.GetRequestId(), n, limit)
			}
		}
		if len(resps) != 2 || resps[0].GetBatch().GetJobCount() != 16 || resps[1].GetBatch().GetJobCount() != 4 {
			t.Errorf("responses = %v, want batches of 16 and 4 jobs", resps)
		}
	})

	t.Run("with the default limits 70 documents of 250,000 bytes go as 67 and 3", func(t *testing.T) {
		t.Parallel()
		fake := fakeserver.New() // the coordinator's defaults: 16 MiB inline per batch
		c := dialFake(t, fake)
		if _, err := c.SubmitDocuments(t.Context(), "a", "R", inlineDocs(70, 250_000), client.SubmitOptions{}); err != nil {
			t.Fatalf("SubmitDocuments: %v", err)
		}
		want := []requestShape{{"R-0", 67, 16_750_000}, {"R-1", 3, 750_000}}
		if diff := cmp.Diff(want, shapes(fake.Submits())); diff != "" {
			t.Errorf("requests mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("files are split by their sizes, counting only those sent inline", func(t *testing.T) {
		t.Parallel()
		fake := fakeserver.New()
		c := dialFake(t, fake, client.WithBatchLimits(client.BatchLimits{MaxInlineBytes: 600_000}))
		dir := t.TempDir()
		var paths []string
		for i, size := range []int{250_000, 250_000, client.InlineLimit + 1, 250_000, 250_000} {
			p := filepath.Join(dir, fmt.Sprintf("f%d.txt", i))
			if err := os.WriteFile(p, bytes.Repeat([]byte{'y'}, size), 0o600); err != nil {
				t.Fatal(err)
			}
			paths = append(paths, p)
		}
		var seen []string
		_, err := c.SubmitFiles(t.Context(), "a", "F", paths, client.SubmitOptions{OnBatch: func(i, n int, resp *leaseholdv1.SubmitBatchResponse) error {
			seen = append(seen, fmt.Sprintf("%d/%d %s", i, n, resp.GetBatch().GetRequestId()))
			return nil
		}})
		if err != nil {
			t.Fatalf("SubmitFiles: %v", err)
		}
		want := []requestShape{{"F-0", 3, 500_000}, {"F-1", 2, 500_000}}
		if diff := cmp.Diff(want, shapes(fake.Submits())); diff != "" {
			t.Errorf("requests mismatch (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"0/2 F-0", "1/2 F-1"}, seen); diff != "" {
			t.Errorf("OnBatch calls mismatch (-want +got):\n%s", diff)
		}
	})
}

func TestSubmitDocumentsStopsAtAFailedBatch(t *testing.T) {
	t.Parallel()
	fake := fakeserver.New()
	c := dialFake(t, fake, client.WithBatchLimits(client.BatchLimits{MaxDocuments: 2}))
	docs := append(inlineDocs(2, 10), &leaseholdv1.Document{Name: "huge", Content: bytes.Repeat([]byte{'z'}, 300<<10)})

	resps, err := c.SubmitDocuments(t.Context(), "a", "R", docs, client.SubmitOptions{})
	var se *client.SubmitError
	if !errors.As(err, &se) {
		t.Fatalf("SubmitDocuments error = %v, want a *SubmitError", err)
	}
	if se.Batch != 1 || se.Accepted != 1 || se.Batches != 2 || se.RequestID != "R" {
		t.Errorf("SubmitError = %+v, want batch 1 of 2 with 1 accepted", se)
	}
	if !errors.Is(err, client.ErrInvalidArgument) || client.Reason(err) != "CONTENT_TOO_LARGE" {
		t.Errorf("error = %v, want the coordinator's INVALID_ARGUMENT CONTENT_TOO_LARGE", err)
	}
	if !strings.Contains(err.Error(), "submitting batch 2 of 2 (request id R-1)") {
		t.Errorf("error = %q, want it to name batch 2 of 2 and its request id", err)
	}
	if len(resps) != 1 {
		t.Fatalf("got %d responses, want the accepted one", len(resps))
	}

	t.Run("submitting again with the same id replays what was accepted", func(t *testing.T) {
		docs[2] = &leaseholdv1.Document{Name: "huge", Content: []byte("smaller now")}
		resps, err := c.SubmitDocuments(t.Context(), "a", "R", docs, client.SubmitOptions{})
		if err != nil {
			t.Fatalf("SubmitDocuments: %v", err)
		}
		if got := []bool{resps[0].GetReplayed(), resps[1].GetReplayed()}; !cmp.Equal(got, []bool{true, false}) {
			t.Errorf("replayed = %v, want [true false]", got)
		}
	})
}

func TestSubmitDocumentsRefusesBadRequestIDs(t *testing.T) {
	t.Parallel()
	fake := fakeserver.New()
	c := dialFake(t, fake)
	for _, id := range []string{"", strings.Repeat("r", 127)} {
		if _, err := c.SubmitDocuments(t.Context(), "a", id, inlineDocs(1, 1), client.SubmitOptions{}); !errors.Is(err, client.ErrInvalidRequestID) {
			t.Errorf("request id of %d bytes: error = %v, want ErrInvalidRequestID", len(id), err)
		}
	}
	if n := len(fake.Submits()); n != 0 {
		t.Errorf("%d requests reached the server, want 0", n)
	}
}

func TestDialRejectsNegativeLimits(t *testing.T) {
	t.Parallel()
	if _, err := client.Dial(fakeserver.Target, client.WithBatchLimits(client.BatchLimits{MaxInlineBytes: -1})); err == nil {
		t.Error("Dial with a negative limit succeeded, want an error")
	}
}

func TestResponsesOverFourMiBAreReceived(t *testing.T) {
	t.Parallel()
	fake := fakeserver.New()
	c := dialFake(t, fake)
	fake.AddJob(&leaseholdv1.Job{Id: "j-1", BatchId: "b-1", Team: "a", Events: []*leaseholdv1.JobEvent{{Seq: 1, Message: strings.Repeat("m", 5<<20)}}})
	if _, err := c.GetJob(t.Context(), "j-1"); err != nil {
		t.Fatalf("GetJob of a 5 MiB job: %v", err)
	}
}
