package faults

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/internal/proctest"
	"github.com/leasehold/leasehold/internal/tcpproxy"
)

// The lease TTL of the stream tests, and the heartbeat interval the
// coordinator announces with it (a third).
const (
	streamTTL   = 3 * time.Second
	hbInterval  = streamTTL / 3
	delayMean   = 75 * time.Millisecond
	delayJitter = 50 * time.Millisecond
	// expirySlack bounds how long after a lease's deadline the coordinator
	// may take to expire it, under a CI machine's load.
	expirySlack = time.Second
)

// proxiedStack is a coordinator with renderers, each behind its own proxy.
type proxiedStack struct {
	coord     *coordinator
	alpha     *client.Client
	renderers []*renderer
	proxies   []*tcpproxy.Proxy
	byID      map[string]int // renderer id -> index
}

// startStack starts a coordinator with the stream tests' TTL and extra
// args, and n renderers with rargs, each connected through a new proxy
// prepared by background (if not nil) before the renderer starts.
func startStack(t *testing.T, n int, seed uint64, background func(*tcpproxy.Proxy), cargs, rargs []string) *proxiedStack {
	t.Helper()
	args := append([]string{"--lease-ttl", streamTTL.String()}, cargs...)
	s := &proxiedStack{coord: startCoordinator(t, "127.0.0.1:0", dataDir(t), args...), byID: map[string]int{}}
	s.alpha = dial(t, s.coord.Addr, tokenAlpha)
	for i := range n {
		p, err := tcpproxy.Listen(s.coord.Addr, seed+uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if background != nil {
			background(p)
		}
		id := "r" + strconv.Itoa(i)
		s.proxies = append(s.proxies, p)
		s.renderers = append(s.renderers, startRenderer(t, p.Addr(), id, rargs...))
		s.byID[id] = i
	}
	return s
}

// waitHeld waits until every job of the batch is leased and its renderer
// has logged the lease: the grant reached the renderer, so a fault that
// starts now cannot lose it in flight.
func (s *proxiedStack) waitHeld(t *testing.T, batch string, ids []string) {
	t.Helper()
	waitPhases(t, s.alpha, batch, "every job leased", func(ph map[string]leaseholdv1.Phase) bool {
		return countPhase(ph, leaseholdv1.Phase_PHASE_LEASED) == len(ids)
	})
	for _, id := range ids {
		lease := getJob(t, s.alpha, id).GetLease()
		i, ok := s.byID[lease.GetRendererId()]
		if !ok {
			t.Fatalf("job %s is leased to unknown renderer %q", id, lease.GetRendererId())
		}
		s.renderers[i].WaitFor("lease acquired", "job="+id+" ", fmt.Sprintf("token=%d ", lease.GetToken()))
	}
}

// expiryFault is a fault that keeps a renderer's heartbeats from the
// coordinator.
type expiryFault struct {
	name string
	// background is set on each proxy before its renderer starts.
	background func(*tcpproxy.Proxy)
	// cut starts the fault and returns the moment it took effect.
	cut func(*tcpproxy.Proxy) time.Time
	// heal ends it.
	heal func(*tcpproxy.Proxy)
}

var expiryFaults = []expiryFault{
	{
		name: "blackhole",
		cut: func(p *tcpproxy.Proxy) time.Time {
			p.Set(tcpproxy.ToClient, tcpproxy.Blackhole)
			return p.Set(tcpproxy.ToServer, tcpproxy.Blackhole)
		},
		heal: func(p *tcpproxy.Proxy) {
			p.Set(tcpproxy.ToServer, tcpproxy.Forward)
			p.Set(tcpproxy.ToClient, tcpproxy.Forward)
		},
	},
	{
		name: "blackhole towards the coordinator only",
		cut:  func(p *tcpproxy.Proxy) time.Time { return p.Set(tcpproxy.ToServer, tcpproxy.Blackhole) },
		heal: func(p *tcpproxy.Proxy) { p.Set(tcpproxy.ToServer, tcpproxy.Forward) },
	},
	{
		name: "blackhole under a delay of 75±50 ms each way",
		background: func(p *tcpproxy.Proxy) {
			p.SetDelay(tcpproxy.ToServer, delayMean, delayJitter)
			p.SetDelay(tcpproxy.ToClient, delayMean, delayJitter)
		},
		cut: func(p *tcpproxy.Proxy) time.Time {
			p.Set(tcpproxy.ToClient, tcpproxy.Blackhole)
			return p.Set(tcpproxy.ToServer, tcpproxy.Blackhole)
		},
		heal: func(p *tcpproxy.Proxy) {
			p.Set(tcpproxy.ToServer, tcpproxy.Forward)
			p.Set(tcpproxy.ToClient, tcpproxy.Forward)
		},
	},
	{
		name: "bytes dropped",
		cut: func(p *tcpproxy.Proxy) time.Time {
			p.Set(tcpproxy.ToClient, tcpproxy.Drop)
			return p.Set(tcpproxy.ToServer, tcpproxy.Drop)
		},
		// The streams lost bytes: cut them, as the peers would once they
		// noticed, and let the renderer reconnect.
		heal: func(p *tcpproxy.Proxy) {
			p.Set(tcpproxy.ToServer, tcpproxy.Forward)
			p.Set(tcpproxy.ToClient, tcpproxy.Forward)
			p.Reset()
		},
	},
	{
		name: "connections reset and refused",
		cut: func(p *tcpproxy.Proxy) time.Time {
			p.Refuse(true)
			p.Reset()
			return time.Now()
		},
		heal: func(p *tcpproxy.Proxy) { p.Refuse(false) },
	},
}

// TestLeaseExpiry cuts renderers off the coordinator, at a random phase of
// their heartbeats, with each fault that keeps heartbeats from arriving,
// and checks every lease against what the proxy saw: a lease expires only
// once a full TTL has passed since the last gRPC message of its renderer
// reached the coordinator, and then within expirySlack. It reports the
// detection latency (from the fault to the LEASE_EXPIRED event in the
// job's history) against the TTL.
//
// Renders never finish (--latency 1h) and --max-attempts 1 ends a job at
// its first expiry, so each round is one lease per slot, and every lease of
// the round is cut off.
func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	renderers, capacity, rounds := 3, 4, 3
	if *long {
		renderers, capacity, rounds = 4, 8, 20
	}
	runConcurrently(t, expiryFaults, func(f expiryFault) string { return f.name }, func(t *testing.T, f expiryFault) {
		seed := uint64(time.Now().UnixNano())
		rng := rand.New(rand.NewPCG(seed, seed>>7))
		s := startStack(t, renderers, seed, f.background, []string{"--max-attempts", "1"},
			[]string{"--capacity", strconv.Itoa(capacity), "--latency", "1h"})
		var latencies, overshoots []time.Duration
		for round := range rounds {
			l, o := expiryRound(t, s, f, rng, fmt.Sprintf("round-%d", round), renderers*capacity)
			latencies, overshoots = append(latencies, l...), append(overshoots, o...)
			if t.Failed() {
				return
			}
		}
		t.Logf("FIGURE lease expiry, %s: TTL %v, %d leases over %d renderers: detection latency p50 %v (%.2f TTL), p99 %v (%.2f TTL), max %v; expired after the deadline by p50 %v, p99 %v (seed %d)",
			f.name, streamTTL, len(latencies), renderers,
			percentile(latencies, 0.5).Round(time.Millisecond), ratio(percentile(latencies, 0.5), streamTTL),
			percentile(latencies, 0.99).Round(time.Millisecond), ratio(percentile(latencies, 0.99), streamTTL),
			percentile(latencies, 1).Round(time.Millisecond),
			percentile(overshoots, 0.5).Round(time.Millisecond), percentile(overshoots, 0.99).Round(time.Millisecond), seed)
	})
}

func ratio(d, of time.Duration) float64 { return float64(d) / float64(of) }

// expiryRound runs one round: n leases granted, each renderer cut off at a
// random point between one and two heartbeat intervals later (so that
// every lease was heartbeated at least once: its last message is a
// heartbeat), every lease expired, the faults healed. It returns each
// lease's detection latency and how long after its deadline it expired.
func expiryRound(t *testing.T, s *proxiedStack, f expiryFault, rng *rand.Rand, name string, n int) (latencies, overshoots []time.Duration) {
	t.Helper()
	batch, ids := submit(t, s.alpha, "alpha", name, docs(name, n))
	s.waitHeld(t, batch, ids)

	cutAt := make([]time.Time, len(s.proxies))
	var wg sync.WaitGroup
	var timers []*time.Timer
	for i, p := range s.proxies {
		offset := hbInterval + 250*time.Millisecond + time.Duration(rng.Int64N(int64(hbInterval)))
		wg.Add(1)
		timers = append(timers, time.AfterFunc(offset, func() {
			defer wg.Done()
			cutAt[i] = f.cut(p)
		}))
	}
	waitBatchDone(t, s.alpha, batch)
	wg.Wait() // every fault fired before its leases could expire
	lastData := make([]time.Time, len(s.proxies))
	for i, p := range s.proxies {
		lastData[i] = p.LastData(tcpproxy.ToServer)
		f.heal(p)
	}
	for _, tm := range timers {
		tm.Stop()
	}

	for _, id := range ids {
		j := getJob(t, s.alpha, id)
		leased, expired := eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASED), eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED)
		if len(leased) != 1 || len(expired) != 1 || expired[0].GetToken() != leased[0].GetToken() {
			t.Errorf("job %s: %d LEASED and %d LEASE_EXPIRED events, want one lease that expired; history:\n%s",
				id, len(leased), len(expired), history(j))
			continue
		}
		i, ok := s.byID[leased[0].GetRendererId()]
		if !ok {
			t.Fatalf("job %s leased to unknown renderer %q", id, leased[0].GetRendererId())
		}
		at := expired[0].GetAt().AsTime()
		if silent := at.Sub(lastData[i]); silent < streamTTL {
			t.Errorf("job %s expired %v after the last message of %s reached the coordinator, want at least the TTL %v; history:\n%s",
				id, silent, leased[0].GetRendererId(), streamTTL, history(j))
		}
		over := at.Sub(lastData[i].Add(streamTTL))
		if over > expirySlack {
			t.Errorf("job %s expired %v after its deadline (TTL %v after the last message), want within %v", id, over, streamTTL, expirySlack)
		}
		latencies = append(latencies, at.Sub(cutAt[i]))
		overshoots = append(overshoots, over)
	}
	return latencies, overshoots
}

// heartbeatFault is a fault that slows or cuts a renderer's stream but
// lets its heartbeats through.
type heartbeatFault struct {
	name       string
	background func(*tcpproxy.Proxy)
	// start begins the fault once every job is held; stop ends it.
	start, stop func(*tcpproxy.Proxy)
	// reconnects says the renderers must reconnect during the renders.
	reconnects bool
}

// TestNoExpiryWhileHeartbeatsArrive runs renders longer than two TTLs
// through faults that slow or cut the renderers' streams but let their
// heartbeats through, and checks that no lease expires: every job
// succeeds on its first attempt under the token it was first granted.
// Where connections are cut, the renderer reconnects within its deadline,
// lists its leases in its session hello and keeps them.
func TestNoExpiryWhileHeartbeatsArrive(t *testing.T) {
	t.Parallel()
	cases := []heartbeatFault{
		{
			name: "a delay of 75±50 ms each way",
			background: func(p *tcpproxy.Proxy) {
				p.SetDelay(tcpproxy.ToServer, delayMean, delayJitter)
				p.SetDelay(tcpproxy.ToClient, delayMean, delayJitter)
			},
		},
		{
			// A heartbeat sent just before a grant arrives reaches the
			// coordinator a heartbeat interval plus two one-way delays
			// after the grant: within the TTL while each delay stays below
			// a third of it. This one stays below a quarter.
			name: "a delay of 500±250 ms each way",
			background: func(p *tcpproxy.Proxy) {
				p.SetDelay(tcpproxy.ToServer, 500*time.Millisecond, 250*time.Millisecond)
				p.SetDelay(tcpproxy.ToClient, 500*time.Millisecond, 250*time.Millisecond)
			},
		},
		{
			name:  "a blackhole towards the renderer only",
			start: func(p *tcpproxy.Proxy) { p.Set(tcpproxy.ToClient, tcpproxy.Blackhole) },
			stop:  func(p *tcpproxy.Proxy) { p.Set(tcpproxy.ToClient, tcpproxy.Forward) },
		},
		{
			name: "connections cut at a maximum age of a third of the TTL",
			start: func(p *tcpproxy.Proxy) {
				p.SetMaxAge(streamTTL / 3)
				p.Reset()
			},
			stop:       func(p *tcpproxy.Proxy) { p.SetMaxAge(0) },
			reconnects: true,
		},
		{
			name: "connections cut at a maximum age of a third of the TTL, under a delay",
			background: func(p *tcpproxy.Proxy) {
				p.SetDelay(tcpproxy.ToServer, delayMean, delayJitter)
				p.SetDelay(tcpproxy.ToClient, delayMean, delayJitter)
			},
			start: func(p *tcpproxy.Proxy) {
				p.SetMaxAge(streamTTL / 3)
				p.Reset()
			},
			stop:       func(p *tcpproxy.Proxy) { p.SetMaxAge(0) },
			reconnects: true,
		},
	}
	renderers, capacity, render := 2, 4, 2*streamTTL+streamTTL/2
	if *long {
		renderers, capacity, render = 4, 16, 5*streamTTL
	}
	runConcurrently(t, cases, func(f heartbeatFault) string { return f.name }, func(t *testing.T, tc heartbeatFault) {
		s := startStack(t, renderers, uint64(time.Now().UnixNano()), tc.background, nil,
			[]string{"--capacity", strconv.Itoa(capacity), "--latency", render.String()})
		n := renderers * capacity
		batch, ids := submit(t, s.alpha, "alpha", "steady", docs("steady", n))
		s.waitHeld(t, batch, ids)
		marks := make([]int, len(s.renderers))
		for i, r := range s.renderers {
			marks[i] = r.Mark()
		}
		if tc.start != nil {
			for _, p := range s.proxies {
				tc.start(p)
			}
		}
		waitBatchDone(t, s.alpha, batch)
		if tc.stop != nil {
			for _, p := range s.proxies {
				tc.stop(p)
			}
		}

		for _, id := range ids {
			j := getJob(t, s.alpha, id)
			leased := eventsOf(j, leaseholdv1.EventKind_EVENT_KIND_LEASED)
			if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED || j.GetAttempt() != 1 || len(leased) != 1 {
				t.Errorf("job %s: %v on attempt %d with %d leases (%s), want SUCCEEDED on the first and only lease; history:\n%s",
					id, j.GetPhase(), j.GetAttempt(), len(leased), j.GetTerminalMessage(), history(j))
				continue
			}
			if got, want := j.GetArtifact().GetToken(), leased[0].GetToken(); got != want {
				t.Errorf("job %s succeeded under token %d, want its first token %d", id, got, want)
			}
			for _, kind := range []leaseholdv1.EventKind{leaseholdv1.EventKind_EVENT_KIND_LEASE_EXPIRED,
				leaseholdv1.EventKind_EVENT_KIND_REQUEUED, leaseholdv1.EventKind_EVENT_KIND_COMPLETION_REJECTED} {
				if evs := eventsOf(j, kind); len(evs) > 0 {
					t.Errorf("job %s has %d %v events, want none", id, len(evs), kind)
				}
			}
		}
		reconnects, holding := 0, 0
		for i, r := range s.renderers {
			for _, line := range r.Lines()[marks[i]:] {
				if strings.Contains(line, "session started") {
					reconnects++
					if h, _ := strconv.Atoi(proctest.LogAttr(line, "holding")); h > 0 {
						holding++
					}
				}
			}
		}
		if tc.reconnects && holding < 2*renderers {
			t.Errorf("renderers reopened %d sessions listing held leases in their hello, want at least %d", holding, 2*renderers)
		}
		var aged int
		for _, p := range s.proxies {
			aged += p.Stats().AgedOut
		}
		t.Logf("FIGURE no expiry under %s: TTL %v, %d leases rendered for %v each, all on their first token; %d sessions reopened (%d listing held leases), %d connections cut at their maximum age",
			tc.name, streamTTL, n, render, reconnects, holding, aged)
	})
}
