package client

import (
	"context"
	"errors"
	"io"
	"iter"

	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// GetOverview returns the coordinator's figures for the teams the caller
// sees (one team when team is not empty).
func (c *Client) GetOverview(ctx context.Context, team string) (*leaseholdv1.Overview, error) {
	resp, err := c.Overview.GetOverview(ctx, &leaseholdv1.GetOverviewRequest{Team: team})
	if err != nil {
		return nil, wrapError(err)
	}
	return resp.GetOverview(), nil
}

// ListRenderers returns the renderers the coordinator knows, with the
// leases they hold of the teams the caller sees.
func (c *Client) ListRenderers(ctx context.Context) ([]*leaseholdv1.Renderer, error) {
	resp, err := c.Overview.ListRenderers(ctx, &leaseholdv1.ListRenderersRequest{})
	if err != nil {
		return nil, wrapError(err)
	}
	return resp.GetRenderers(), nil
}

// ListBatches returns one page of batches, newest first.
func (c *Client) ListBatches(ctx context.Context, req *leaseholdv1.ListBatchesRequest) (*leaseholdv1.ListBatchesResponse, error) {
	resp, err := c.Overview.ListBatches(ctx, req)
	return resp, wrapError(err)
}

// AllBatches iterates over every batch matching req, newest first,
// following pages as AllJobs does.
func (c *Client) AllBatches(ctx context.Context, req *leaseholdv1.ListBatchesRequest) iter.Seq2[*leaseholdv1.Batch, error] {
	return func(yield func(*leaseholdv1.Batch, error) bool) {
		r := &leaseholdv1.ListBatchesRequest{}
		if req != nil {
			r = proto.CloneOf(req)
		}
		for {
			resp, err := c.ListBatches(ctx, r)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, b := range resp.GetBatches() {
				if !yield(b, nil) {
					return
				}
			}
			if resp.GetNextPageToken() == "" {
				return
			}
			r.PageToken = resp.GetNextPageToken()
		}
	}
}

// WatchOverview iterates over the overview stream: a message at once, then
// on every change (at most four a second) and at least once per
// req.Interval. It ends when ctx ends (without an error) or the stream
// fails, which is yielded with a nil message; it does not reconnect.
func (c *Client) WatchOverview(ctx context.Context, req *leaseholdv1.WatchOverviewRequest) iter.Seq2[*leaseholdv1.WatchOverviewResponse, error] {
	return func(yield func(*leaseholdv1.WatchOverviewResponse, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := c.Overview.WatchOverview(ctx, req)
		if err != nil {
			yield(nil, wrapError(err))
			return
		}
		for {
			msg, err := stream.Recv()
			switch {
			case errors.Is(err, io.EOF):
				return
			case err != nil && ctx.Err() != nil:
				return
			case err != nil:
				yield(nil, wrapError(err))
				return
			}
			if !yield(msg, nil) {
				return
			}
		}
	}
}
