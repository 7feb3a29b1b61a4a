package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/coordinator"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
	"github.com/leasehold/leasehold/renderer/mock"
)

// Submit files, follow the batch until every job has ended, then read the
// counts. FollowBatch yields each job's opening snapshot and then its
// terminal event; a job that had ended before the watch began (here the
// macro document, refused at submission) ends in its snapshot. Jobs end in
// whatever order the renderers finish them.
func ExampleClient_FollowBatch() {
	// A coordinator and a renderer of package mock in this process (see
	// startLocal); a service dials its coordinator's address instead.
	addr, stop, err := startLocal(mustMock())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	dir, err := os.MkdirTemp("", "leasehold-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	var paths []string
	for name, content := range map[string]string{
		"minutes.txt":  "Minutes of the meeting",
		"report.pdf":   "%PDF-1.7",
		"budget.xlsm":  "a spreadsheet with macros",
		"summary.docx": "PK",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			fmt.Println(err)
			return
		}
		paths = append(paths, p)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(addr, client.WithToken("dev-alpha"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	// The request id makes the submission idempotent: sent again, it
	// stores nothing twice.
	resps, err := c.SubmitFiles(ctx, "alpha", "minutes-2024-05", paths, client.SubmitOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	batch := resps[0].GetBatch() // four small files make one batch
	names := map[string]string{}
	for i, id := range batch.GetJobIds() {
		names[id] = filepath.Base(paths[i])
	}

	for u, err := range c.FollowBatch(ctx, batch.GetId(), client.FollowOptions{TerminalOnly: true}) {
		if err != nil {
			fmt.Println(err)
			return
		}
		switch u.Phase {
		case leaseholdv1.Phase_PHASE_SUCCEEDED, leaseholdv1.Phase_PHASE_FAILED, leaseholdv1.Phase_PHASE_CANCELLED:
			fmt.Println(names[u.JobID], u.Phase)
		}
	}
	done, err := c.GetBatch(ctx, batch.GetId())
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, pc := range done.GetCounts() {
		fmt.Println("batch:", pc.GetCount(), pc.GetPhase())
	}
	// Unordered output:
	// minutes.txt PHASE_SUCCEEDED
	// report.pdf PHASE_SUCCEEDED
	// summary.docx PHASE_SUCCEEDED
	// budget.xlsm PHASE_FAILED
	// batch: 3 PHASE_SUCCEEDED
	// batch: 1 PHASE_FAILED
}

// Cancel a job that is waiting for a renderer, cancel it again, and try to
// cancel one that has already ended. No renderer runs here, so the
// document stays QUEUED until it is cancelled, and is never rendered.
func ExampleClient_CancelJob() {
	addr, stop, err := startLocal(nil) // a coordinator alone (see startLocal)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(addr, client.WithToken("dev-alpha"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	resp, err := c.SubmitBatch(ctx, "alpha", "cancel-example", []*leaseholdv1.Document{
		{Name: "draft.pdf", ContentType: "application/pdf", Content: []byte("%PDF-1.7")},
		{Name: "macro.docm", Content: []byte("PK")}, // refused at submission: FAILED
	}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	draft, macro := resp.GetBatch().GetJobIds()[0], resp.GetBatch().GetJobIds()[1]

	cancelled, err := c.CancelJob(ctx, draft, "superseded by the final version")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cancelled.GetJob().GetPhase(), "already cancelled:", cancelled.GetAlreadyCancelled())

	// Cancelling again is answered the same, and says so.
	again, err := c.CancelJob(ctx, draft, "superseded by the final version")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(again.GetJob().GetPhase(), "already cancelled:", again.GetAlreadyCancelled())

	// A job that ended otherwise keeps its result.
	_, err = c.CancelJob(ctx, macro, "superseded")
	var e *client.Error
	if errors.Is(err, client.ErrAlreadyTerminal) && errors.As(err, &e) {
		fmt.Println(client.CodeName(e.Code), e.Reason, e.Metadata["phase"])
	}
	// Output:
	// PHASE_CANCELLED already cancelled: false
	// PHASE_CANCELLED already cancelled: true
	// FAILED_PRECONDITION ALREADY_TERMINAL PHASE_FAILED
}

// blockingProvider renders nothing: it reports each render it starts on
// started and returns once the render's context ends, which the worker
// does when the coordinator revokes the lease.
type blockingProvider struct {
	started chan string
	stopped chan error
}

// Render implements renderer.Provider.
func (p blockingProvider) Render(ctx context.Context, in renderer.Input) (renderer.Output, error) {
	p.started <- in.Document.Name
	<-ctx.Done()
	p.stopped <- ctx.Err()
	return renderer.Output{}, ctx.Err()
}

// Cancel a whole batch while a renderer works on one of its jobs: the
// queued job is cancelled at once; the leased one is cancelled too, its
// lease revoked, and the answer names the renderer that held it, which is
// told on its session and stops.
func ExampleClient_CancelBatch() {
	p := blockingProvider{started: make(chan string, 1), stopped: make(chan error, 1)}
	addr, stop, err := startLocal(p) // a renderer of capacity 1 (see startLocal)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(addr, client.WithToken("dev-alpha"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	resp, err := c.SubmitBatch(ctx, "alpha", "import-42", []*leaseholdv1.Document{
		{Name: "scan-1.pdf", ContentType: "application/pdf", Content: []byte("%PDF-1.7")},
		{Name: "scan-2.pdf", ContentType: "application/pdf", Content: []byte("%PDF-1.7")},
	}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("rendering", <-p.started)

	cancelled, err := c.CancelBatch(ctx, resp.GetBatch().GetId(), "wrong folder imported")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("cancelled while queued:", cancelled.GetCancelledQueued())
	fmt.Println("cancelled while leased:", cancelled.GetCancelledRunning())
	for _, r := range cancelled.GetRunning() {
		fmt.Println("  revoked from", r.GetRendererId())
	}
	fmt.Println("batch done:", cancelled.GetBatch().GetDone())
	fmt.Println("the render stopped:", <-p.stopped)
	// Output:
	// rendering scan-1.pdf
	// cancelled while queued: 1
	// cancelled while leased: 1
	//   revoked from example-renderer
	// batch done: true
	// the render stopped: context canceled
}

// Submit more documents than one batch holds: SubmitDocuments splits them
// within the client's limits and sends batch i as "<request id>-i", so
// that the same call made again (after a timeout, say) stores nothing
// twice: every batch is answered as replayed.
func ExampleClient_SubmitDocuments() {
	addr, stop, err := startLocal(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(addr, client.WithToken("dev-alpha"),
		client.WithBatchLimits(client.BatchLimits{MaxDocuments: 2}))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	var docs []*leaseholdv1.Document
	for i := range 5 {
		docs = append(docs, &leaseholdv1.Document{
			Name: fmt.Sprintf("page-%d.txt", i+1), ContentType: "text/plain", Content: []byte("page"),
		})
	}
	for range 2 {
		resps, err := c.SubmitDocuments(ctx, "alpha", "pages", docs, client.SubmitOptions{})
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, r := range resps {
			fmt.Println(r.GetBatch().GetRequestId(), r.GetBatch().GetJobCount(), "jobs, replayed:", r.GetReplayed())
		}
	}
	// Output:
	// pages-0 2 jobs, replayed: false
	// pages-1 2 jobs, replayed: false
	// pages-2 1 jobs, replayed: false
	// pages-0 2 jobs, replayed: true
	// pages-1 2 jobs, replayed: true
	// pages-2 1 jobs, replayed: true
}

// A client of a three-replica coordinator: calls go to the leader, and a
// failover within ten seconds is only latency.
func ExampleDial_cluster() {
	c, err := client.Dial("coord-0.internal:7070,coord-1.internal:7070,coord-2.internal:7070",
		client.WithInsecurePlaintext(), // a service mesh encrypts; otherwise WithTLS
		client.WithToken("s3cret-alpha-token"),
		client.WithFailoverWait(10*time.Second),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job, err := c.GetJob(ctx, "j-12")
	switch {
	case errors.Is(err, client.ErrNotLeader), errors.Is(err, client.ErrUnavailable):
		fmt.Println("no leader within the failover wait:", err)
	case err != nil:
		fmt.Println(err)
	default:
		fmt.Println(job.GetPhase())
	}
}

// startLocal starts what the examples talk to, in this process: a
// coordinator on a loopback port with the development tokens (which it
// accepts only on loopback: dev-alpha submits for team alpha,
// dev-renderer renders) and, unless provider is nil, one renderer of
// capacity 1 built on package renderer with that provider. It returns the
// coordinator's address and a function that stops both and removes the
// coordinator's data.
func startLocal(provider renderer.Provider) (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "leasehold-example")
	if err != nil {
		return "", nil, err
	}
	quiet := slog.New(slog.DiscardHandler)
	coord, err := coordinator.New(coordinator.Config{DataDir: dir, Logger: quiet})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		coord.Close()
		os.RemoveAll(dir)
		return "", nil, err
	}
	served := make(chan error, 1)
	go func() { served <- coord.Serve(lis) }()
	stopCoordinator := func() {
		coord.Close()
		<-served
		os.RemoveAll(dir)
	}
	addr = lis.Addr().String()
	if provider == nil {
		return addr, stopCoordinator, nil
	}
	w, err := renderer.New(renderer.Config{
		Coordinator: addr, ID: "example-renderer", Token: "dev-renderer",
		Capacity: 1, Provider: provider, Logger: quiet,
	})
	if err != nil {
		stopCoordinator()
		return "", nil, err
	}
	ctx, drain := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	return addr, func() {
		drain()
		<-ran
		stopCoordinator()
	}, nil
}

// mustMock returns the provider the renderer binary runs, with its
// defaults: it renders at once and refuses macro formats for good.
func mustMock() *mock.Provider {
	p, err := mock.New(mock.Config{})
	if err != nil {
		panic(err)
	}
	return p
}
