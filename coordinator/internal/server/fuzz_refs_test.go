package server

import (
	"context"
	"io"
	"strings"
	"testing"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"google.golang.org/grpc/codes"
)

// refLists are the lists of a renderer session that name leases, as
// FuzzSessionLeaseRefs fills them.
var refLists = []struct {
	name string
	set  func(m *leaseholdv1.SessionRequest, refs []*leaseholdv1.LeaseRef)
}{
	{"hello.holding", func(m *leaseholdv1.SessionRequest, refs []*leaseholdv1.LeaseRef) { m.Hello.Holding = refs }},
	{"heartbeats", func(m *leaseholdv1.SessionRequest, refs []*leaseholdv1.LeaseRef) { m.Heartbeats = refs }},
	{"received", func(m *leaseholdv1.SessionRequest, refs []*leaseholdv1.LeaseRef) { m.Received = refs }},
	{"hand_backs", func(m *leaseholdv1.SessionRequest, refs []*leaseholdv1.LeaseRef) { m.HandBacks = refs }},
	{"cancel_acks", func(m *leaseholdv1.SessionRequest, refs []*leaseholdv1.LeaseRef) { m.CancelAcks = refs }},
	{"completions", func(m *leaseholdv1.SessionRequest, refs []*leaseholdv1.LeaseRef) {
		for _, r := range refs {
			m.Completions = append(m.Completions, &leaseholdv1.SessionCompletion{JobId: r.GetJobId(), Token: r.GetToken(),
				Outcome: &leaseholdv1.SessionCompletion_Failure{Failure: &leaseholdv1.CompleteFailure{Class: leaseholdv1.FailureClass_FAILURE_CLASS_TRANSIENT}}})
		}
	}},
}

// FuzzSessionLeaseRefs opens renderer sessions of a small capacity and
// sends lists of lease references of any length, naming any job id and
// token, in the hello or in a later message: a list within the capacity
// is answered and the session ends OK when the renderer closes its side, a
// longer one ends the stream INVALID_ARGUMENT TOO_MANY_LEASE_REFS naming
// the list; and afterwards the writer serves and another team's submit
// succeeds.
func FuzzSessionLeaseRefs(f *testing.F) {
	for i := range refLists {
		f.Add(uint8(i), uint8(1), uint8(1), "j-1", uint64(1))
		f.Add(uint8(i), uint8(2), uint8(3), "j-2", uint64(2))
		f.Add(uint8(i), uint8(0), uint8(200), "nope", uint64(0))
	}
	f.Add(uint8(1), uint8(3), uint8(4), "\xff", uint64(7))
	f.Add(uint8(0), uint8(7), uint8(8), strings.Repeat("j", 300), uint64(1<<63))
	b := setupText(f)
	f.Fuzz(func(t *testing.T, list, capacity, n uint8, jobID string, token uint64) {
		l := refLists[int(list)%len(refLists)]
		c := uint32(capacity%8) + 1
		// The client's codec cannot send a string that is not UTF-8; the
		// server's refusal of one is tested with raw bytes elsewhere.
		jobID = strings.ToValidUTF8(jobID, "?")
		refs := make([]*leaseholdv1.LeaseRef, int(n)%64)
		for i := range refs {
			refs[i] = &leaseholdv1.LeaseRef{JobId: jobID, Token: token}
		}
		ctx, cancel := context.WithCancel(as(t, renderer))
		defer cancel()
		stream, err := b.rend.Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first := &leaseholdv1.SessionRequest{Hello: hello("r-fuzz", "fuzz", c)}
		msg := first
		if l.name != "hello.holding" {
			msg = &leaseholdv1.SessionRequest{}
		}
		l.set(msg, refs)
		if err := stream.Send(first); err != nil {
			t.Fatal(err)
		}
		if msg != first {
			if err := stream.Send(msg); err != nil {
				t.Fatal(err)
			}
		}
		// Closing its side makes the session apply and answer what it
		// received and end OK, unless it refused it.
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		var err2 error
		for err2 == nil {
			_, err2 = stream.Recv()
		}
		if err2 == io.EOF {
			err2 = nil
		}
		switch {
		case len(refs) > int(c):
			code, info := errorInfo(err2)
			if code != codes.InvalidArgument || info.GetReason() != reasonTooManyLeaseRefs {
				t.Errorf("%d refs in %s at capacity %d: %v, want INVALID_ARGUMENT %s", len(refs), l.name, c, err2, reasonTooManyLeaseRefs)
			}
			if got := badRequestFields(err2); len(got) != 1 || got[0] != l.name {
				t.Errorf("%d refs in %s at capacity %d: BadRequest fields %v, want %s", len(refs), l.name, c, got, l.name)
			}
		case err2 != nil:
			code, info := errorInfo(err2)
			// A hello's malformed reference is refused with the hello.
			if !(l.name == "hello.holding" && code == codes.InvalidArgument && info.GetReason() == reasonInvalidID) {
				t.Errorf("%d refs in %s at capacity %d: the stream ended %v, want it answered", len(refs), l.name, c, err2)
			}
		}
		if !b.eng.Serving() {
			t.Fatalf("%d refs of %q in %s: the writer stopped", len(refs), jobID, l.name)
		}
		if _, err := b.services.Jobs.SubmitBatch(inProcess(t, beta), &leaseholdv1.SubmitBatchRequest{Team: "beta", RequestId: b.fresh("beta"),
			Documents: []*leaseholdv1.Document{doc("b.pdf")}}); err != nil {
			t.Fatalf("team beta's submit after %d refs in %s: %v", len(refs), l.name, err)
		}
	})
}
