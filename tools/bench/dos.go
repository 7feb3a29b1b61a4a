package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// The dos phase's sizes.
const (
	dosReads         = 500  // GetJob calls timed in each condition
	dosFloodCallers  = 64   // unauthenticated callers, each on its own connection
	dosStreams       = 2000 // WatchBatch streams one submitter tries to hold open
	dosStreamConns   = 4    // connections carrying them (each allows 1,000 streams)
	otherTeamToken   = "dev-beta"
	otherTeamName    = "beta"
	dosStreamTimeout = 30 * time.Second
)

// dosResult is what a flood of refused calls and a crowd of streams from
// one client do to another team's reads.
type dosResult struct {
	// Baseline is another team's GetJob latency with nothing else going on.
	Baseline readsResult `json:"baseline"`
	// Flood is the same reads while unauthenticated callers hammer GetJob.
	Flood floodResult `json:"unauthenticated_flood"`
	// Streams is the same reads while one submitter holds every WatchBatch
	// stream it is allowed and asks for many more.
	Streams streamsResult `json:"open_streams"`
}

// readsResult summarizes timed read calls (GetJob, GetOverview).
type readsResult struct {
	N     int     `json:"n"`
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
}

type floodResult struct {
	Reads          readsResult `json:"reads"`
	Callers        int         `json:"callers"`
	CallsPerSecond float64     `json:"refused_calls_per_second"`
	// LogBytesPerSecond is how fast the coordinator's log grew meanwhile.
	LogBytesPerSecond float64 `json:"log_bytes_per_second"`
}

type streamsResult struct {
	Reads   readsResult `json:"reads"`
	Asked   int         `json:"asked"`
	Opened  int         `json:"opened"`
	Refused int         `json:"refused_too_many_streams"`
	// RSSBeforeMiB and RSSAfterMiB are the coordinator's resident memory
	// before the streams were opened and while they were open.
	RSSBeforeMiB float64 `json:"coordinator_rss_before_mib"`
	RSSAfterMiB  float64 `json:"coordinator_rss_after_mib"`
}

// dos measures another team's GetJob latency alone, during a flood of
// unauthenticated calls, and while one submitter holds (or tries to hold)
// dosStreams watch streams.
func (r *runner) dos(ctx context.Context) (*dosResult, error) {
	other, err := client.Dial(r.st.addr, client.WithToken(otherTeamToken))
	if err != nil {
		return nil, err
	}
	defer other.Close()
	sub, err := other.SubmitBatch(ctx, otherTeamName, "dos-"+r.gen.runID, documents("dos", 1), nil)
	if err != nil {
		return nil, fmt.Errorf("submitting the job the reads fetch: %w", err)
	}
	jobID := sub.GetBatch().GetJobIds()[0]
	res := &dosResult{}
	r.lg.printf("dos: %d reads of another team's job, alone", dosReads)
	if res.Baseline, err = timeReads(ctx, other, jobID); err != nil {
		return nil, err
	}
	r.lg.printf("dos: the same reads during a flood from %d unauthenticated callers", dosFloodCallers)
	if res.Flood, err = r.flood(ctx, other, jobID); err != nil {
		return nil, err
	}
	r.lg.printf("dos: the same reads while one submitter asks for %d watch streams", dosStreams)
	if res.Streams, err = r.streams(ctx, other, jobID); err != nil {
		return nil, err
	}
	return res, nil
}

// timeReads times dosReads GetJob calls of c for jobID.
func timeReads(ctx context.Context, c *client.Client, jobID string) (readsResult, error) {
	return timeCalls("GetJob", func() error { _, err := c.GetJob(ctx, jobID); return err })
}

// timeOverview times dosReads GetOverview calls of c for every team.
func timeOverview(ctx context.Context, c *client.Client) (readsResult, error) {
	return timeCalls("GetOverview", func() error { _, err := c.GetOverview(ctx, ""); return err })
}

// timeCalls times dosReads calls of call, one after another; name names
// the call in its error.
func timeCalls(name string, call func() error) (readsResult, error) {
	samples := make([]time.Duration, 0, dosReads)
	for range dosReads {
		start := time.Now()
		if err := call(); err != nil {
			return readsResult{}, fmt.Errorf("%s: %w", name, err)
		}
		samples = append(samples, time.Since(start))
	}
	s := summarize(samples)
	return readsResult{N: s.N, P50MS: ms(s.P50), P99MS: ms(s.P99), MaxMS: ms(s.Max)}, nil
}

// flood times the reads while dosFloodCallers callers without a token call
// GetJob as fast as they can.
func (r *runner) flood(ctx context.Context, c *client.Client, jobID string) (floodResult, error) {
	fctx, stop := context.WithCancel(ctx)
	var calls atomic.Int64
	var wg sync.WaitGroup
	for range dosFloodCallers {
		conn, err := grpc.NewClient(r.st.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			stop()
			return floodResult{}, err
		}
		jobs := leaseholdv1.NewJobServiceClient(conn)
		wg.Go(func() {
			defer conn.Close()
			for fctx.Err() == nil {
				_, err := jobs.GetJob(fctx, &leaseholdv1.GetJobRequest{JobId: jobID})
				if status.Code(err) == codes.Unauthenticated {
					calls.Add(1)
				}
			}
		})
	}
	logPath := filepath.Join(r.st.dir, "coordinator.log")
	logBefore := fileSize(logPath)
	start := time.Now()
	reads, err := timeReads(ctx, c, jobID)
	elapsed := time.Since(start)
	stop()
	wg.Wait()
	if err != nil {
		return floodResult{}, err
	}
	return floodResult{
		Reads:             reads,
		Callers:           dosFloodCallers,
		CallsPerSecond:    float64(calls.Load()) / elapsed.Seconds(),
		LogBytesPerSecond: float64(fileSize(logPath)-logBefore) / elapsed.Seconds(),
	}, nil
}

// streams opens dosStreams WatchBatch streams as one submitter on an
// unfinished batch (dispatch is paused meanwhile), counts those opened and
// those refused, and times the reads while they stay open.
func (r *runner) streams(ctx context.Context, c *client.Client, jobID string) (streamsResult, error) {
	res := streamsResult{Asked: dosStreams}
	if _, err := r.gen.operator.PauseDispatch(ctx, "benchmark: a batch that stays unfinished"); err != nil {
		return res, err
	}
	defer r.gen.operator.ResumeDispatch(context.WithoutCancel(ctx), "benchmark: streams measured")
	b, err := r.gen.submit(ctx, "dos-streams", 1)
	if err != nil {
		return res, err
	}
	if m, err := readMemory(r.st.coord.Pid()); err == nil {
		res.RSSBeforeMiB = mib(m.RSS)
	}
	sctx, cancel := context.WithTimeout(ctx, dosStreamTimeout)
	defer cancel()
	var opened, refused atomic.Int64
	var wg sync.WaitGroup
	for range dosStreamConns {
		conn, err := grpc.NewClient(r.st.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(bearer(submitterToken)))
		if err != nil {
			return res, err
		}
		defer conn.Close()
		jobs := leaseholdv1.NewJobServiceClient(conn)
		for range dosStreams / dosStreamConns {
			wg.Go(func() {
				stream, err := jobs.WatchBatch(sctx, &leaseholdv1.WatchBatchRequest{BatchId: b.id})
				if err == nil {
					_, err = stream.Recv()
				}
				switch {
				case err == nil:
					opened.Add(1)
				case status.Code(err) == codes.ResourceExhausted:
					refused.Add(1)
				}
			})
		}
	}
	wg.Wait()
	res.Opened, res.Refused = int(opened.Load()), int(refused.Load())
	if m, err := readMemory(r.st.coord.Pid()); err == nil {
		res.RSSAfterMiB = mib(m.RSS)
	}
	if res.Reads, err = timeReads(ctx, c, jobID); err != nil {
		return res, err
	}
	return res, nil
}

// bearer sends a bearer token on every call of a raw connection.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// fileSize returns a file's size, 0 when it cannot be read.
func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}
