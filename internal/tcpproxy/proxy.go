// Package tcpproxy is a userspace TCP proxy that stands between clients and
// one server and injects the faults of a real network: a delay per chunk
// of bytes (with jitter), a blackhole (nothing delivered, nothing closed),
// dropped bytes, connections reset at once, reset at a maximum age, and
// connections refused.
//
// Each accepted connection is paired with a new connection to the target.
// Each direction of a pair has a reader, which reads chunks from the
// source, stamps each with the time it is due (now plus the direction's
// delay) and queues it, and a writer, which delivers the queued chunks in
// order once due and while the direction forwards. A full queue stops the
// reader, so a blackholed sender is held back by TCP flow control, as
// behind a stalled link. Either side's end or error closes the pair.
//
// The proxy also follows the HTTP/2 frames it delivers (the client's
// connection preface skipped), so that a test can tell when a gRPC message
// last reached the other side: LastData. Faults change at once for every
// connection; every method is safe to call from any goroutine.
package tcpproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"
)

// Direction is one way through the proxy.
type Direction int

const (
	// ToServer carries what clients send to the target.
	ToServer Direction = iota
	// ToClient carries what the target sends back.
	ToClient
)

func (d Direction) String() string {
	if d == ToServer {
		return "to-server"
	}
	return "to-client"
}

// Mode is what the proxy does with the bytes of one direction.
type Mode int

const (
	// Forward delivers bytes, each chunk after the direction's delay.
	Forward Mode = iota
	// Blackhole delivers nothing and closes nothing: bytes wait in the
	// proxy (then in the sender's TCP window) and are delivered, in order,
	// once the direction forwards again. It is a stalled path.
	Blackhole
	// Drop reads bytes and discards them, connections left open. The
	// stream is corrupt from then on: a protocol above fails once bytes
	// flow again (or hangs waiting for the ones lost).
	Drop
)

func (m Mode) String() string {
	switch m {
	case Blackhole:
		return "blackhole"
	case Drop:
		return "drop"
	}
	return "forward"
}

// Sizes of the per-direction pipeline.
const (
	// chunkSize is the most one read takes from a socket.
	chunkSize = 32 << 10
	// queueChunks bounds the chunks read and not yet delivered, per
	// direction of a connection.
	queueChunks = 64
	// dialTimeout bounds the connection to the target.
	dialTimeout = 5 * time.Second
)

// Stats counts what the proxy did since it started.
type Stats struct {
	// Accepted counts connections accepted and paired with the target;
	// Refused those closed at once because the proxy refused them.
	Accepted, Refused int
	// Reset counts connections closed by Reset, AgedOut those closed at
	// their maximum age, and Ended those that ended on their own (either
	// side closed or failed).
	Reset, AgedOut, Ended int
	// Open is the number of connections open now.
	Open int
	// Received, Delivered and Dropped count bytes per Direction: read from
	// the source, written to the destination, and discarded.
	Received, Delivered, Dropped [2]int64
}

// Proxy listens on a loopback port and forwards each connection to one
// target, applying the faults set on it. Create it with Listen and stop it
// with Close.
type Proxy struct {
	target string
	lis    net.Listener
	wg     sync.WaitGroup

	mu sync.Mutex
	// changed is closed and replaced whenever a mode or a stat changes;
	// writers waiting out a blackhole and WaitStats wait on it.
	changed  chan struct{}
	rng      *rand.Rand
	modes    [2]Mode
	delay    [2]time.Duration
	jitter   [2]time.Duration
	maxAge   time.Duration
	refusing bool
	closed   bool
	conns    map[*conn]struct{}
	stats    Stats
	lastByte [2]time.Time
	lastData [2]time.Time
}

// Listen starts a proxy on 127.0.0.1 (a free port) in front of target.
// seed makes the jitter of the delays reproducible.
func Listen(target string, seed uint64) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: listening: %w", err)
	}
	p := &Proxy{
		target:  target,
		lis:     lis,
		changed: make(chan struct{}),
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		conns:   make(map[*conn]struct{}),
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr returns the address clients dial instead of the target's.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Close stops accepting, resets every connection and waits until every
// goroutine of the proxy has returned. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.lis.Close()
	p.Reset()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Set puts direction d in mode m for every connection, open or future, and
// returns the moment the change took effect: no writer checks the mode
// after that without seeing m. (A chunk whose write had already begun
// still arrives; LastByte and LastData say when.)
func (p *Proxy) Set(d Direction, m Mode) time.Time {
	p.mu.Lock()
	p.modes[d] = m
	p.broadcastLocked()
	p.mu.Unlock()
	return time.Now()
}

// SetDelay delays every chunk read from now on in direction d by mean plus
// a uniform jitter in [-jitter, +jitter] (never below zero). Chunks keep
// their order: one is never delivered before the one read before it.
func (p *Proxy) SetDelay(d Direction, mean, jitter time.Duration) {
	p.mu.Lock()
	p.delay[d], p.jitter[d] = mean, jitter
	p.mu.Unlock()
}

// SetMaxAge resets each connection accepted from now on once it has been
// open for age, as a load balancer enforcing a maximum connection age
// does; 0 turns it off.
func (p *Proxy) SetMaxAge(age time.Duration) {
	p.mu.Lock()
	p.maxAge = age
	p.mu.Unlock()
}

// Refuse makes the proxy reset every connection as soon as it is accepted,
// while on is true: a peer that is down.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refusing = on
	p.mu.Unlock()
}

// Reset closes every open connection at once with a TCP reset, on both
// sides, and returns how many it closed.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	var open []*conn
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	n := 0
	for _, c := range open {
		if c.end(endReset) {
			n++
		}
	}
	return n
}

// LastByte returns when the proxy last began delivering bytes in direction
// d (the peer cannot have had them earlier), or the zero time.
func (p *Proxy) LastByte(d Direction) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastByte[d]
}

// LastData returns when the proxy last began delivering, in direction d,
// the final byte of a non-empty HTTP/2 DATA frame (for gRPC, a message or
// its last piece), or the zero time: the peer cannot have had that message
// earlier. Control frames (pings, window updates,
// settings) do not count. A connection stops being followed once bytes of
// it were dropped.
func (p *Proxy) LastData(d Direction) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastData[d]
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// WaitStats waits until cond holds for the proxy's counts and returns
// them, or returns ctx's error. cond is called with the proxy's lock held
// and must not call the proxy.
func (p *Proxy) WaitStats(ctx context.Context, cond func(Stats) bool) (Stats, error) {
	for {
		p.mu.Lock()
		st, changed := p.stats, p.changed
		ok := cond(st)
		p.mu.Unlock()
		if ok {
			return st, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
}

// broadcastLocked wakes everyone waiting for a change. p.mu must be held.
func (p *Proxy) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// serve accepts connections until the listener closes.
func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refusing || p.closed
		if p.refusing {
			p.stats.Refused++
			p.broadcastLocked()
		}
		p.mu.Unlock()
		if refuse {
			abort(c)
			continue
		}
		p.wg.Add(1)
		go p.open(c)
	}
}

// open pairs an accepted connection with one to the target and starts its
// four goroutines.
func (p *Proxy) open(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		abort(client)
		return
	}
	c := &conn{p: p, client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		abort(client)
		abort(server)
		return
	}
	p.conns[c] = struct{}{}
	p.stats.Accepted++
	p.stats.Open++
	p.broadcastLocked()
	if p.maxAge > 0 {
		c.timer = time.AfterFunc(p.maxAge, func() { c.end(endAged) })
	}
	p.mu.Unlock()
	p.wg.Add(4)
	for _, d := range []Direction{ToServer, ToClient} {
		src, dst := client, server
		if d == ToClient {
			src, dst = server, client
		}
		q := make(chan chunk, queueChunks)
		go c.read(d, src, q)
		go c.write(d, dst, q)
	}
}

// abort closes a connection with a TCP reset.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// How a connection ended.
type endCause int

const (
	endOnItsOwn endCause = iota
	endReset
	endAged
)

// conn is one client connection paired with its connection to the target.
type conn struct {
	p              *Proxy
	client, server net.Conn
	// done is closed when the pair ends; every goroutine of it returns.
	done chan struct{}
	once sync.Once
	// timer resets the pair at its maximum age, if one is set; guarded by
	// Proxy.mu.
	timer *time.Timer
}

// chunk is bytes read from one side, due for delivery at due.
type chunk struct {
	b   []byte
	due time.Time
}

// end closes both sides (with a reset unless the pair ended on its own)
// and reports whether this call ended it.
func (c *conn) end(why endCause) bool {
	ended := false
	c.once.Do(func() {
		ended = true
		close(c.done)
		if why == endOnItsOwn {
			_ = c.client.Close()
			_ = c.server.Close()
		} else {
			abort(c.client)
			abort(c.server)
		}
		p := c.p
		p.mu.Lock()
		if c.timer != nil { // set under p.mu, possibly after the timer fired
			c.timer.Stop()
		}
		delete(p.conns, c)
		p.stats.Open--
		switch why {
		case endReset:
			p.stats.Reset++
		case endAged:
			p.stats.AgedOut++
		default:
			p.stats.Ended++
		}
		p.broadcastLocked()
		p.mu.Unlock()
	})
	return ended
}

// read reads chunks from src and queues them with their due time, or
// discards them while the direction drops. It closes q when src ends.
func (c *conn) read(d Direction, src net.Conn, q chan<- chunk) {
	defer c.p.wg.Done()
	defer close(q)
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			due, drop := c.p.received(d, n)
			if !drop {
				select {
				case q <- chunk{b: slices.Clone(buf[:n]), due: due}:
				case <-c.done:
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// received counts n bytes read in direction d and returns when they are
// due, or drop if the direction discards them.
func (p *Proxy) received(d Direction, n int) (due time.Time, drop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Received[d] += int64(n)
	if p.modes[d] == Drop {
		p.stats.Dropped[d] += int64(n)
		p.broadcastLocked()
		return time.Time{}, true
	}
	p.broadcastLocked()
	wait := p.delay[d]
	if j := p.jitter[d]; j > 0 {
		wait += time.Duration(p.rng.Int64N(int64(2*j)+1)) - j
	}
	return time.Now().Add(max(wait, 0)), false
}

// write delivers the queued chunks to dst in order, each once due and
// while the direction forwards. The pair ends when src has ended and
// everything read was delivered, or when dst fails.
func (c *conn) write(d Direction, dst net.Conn, q <-chan chunk) {
	defer c.p.wg.Done()
	defer c.end(endOnItsOwn)
	frames := &frameReader{}
	if d == ToServer {
		frames.skip = len(http2Preface)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ch := range q {
		deliver, ok := c.await(d, ch.due, timer)
		if !ok {
			return
		}
		if !deliver {
			c.p.dropped(d, len(ch.b))
			frames = nil // the stream lost bytes: its frames cannot be followed
			continue
		}
		// The peer cannot have the bytes before the write begins: that is
		// the moment recorded, so that a test may rely on it as a lower
		// bound.
		start := time.Now()
		if _, err := dst.Write(ch.b); err != nil {
			return
		}
		data := 0
		if frames != nil {
			data = frames.feed(ch.b)
		}
		c.p.delivered(d, len(ch.b), data > 0, start)
	}
}

// await waits until a chunk due at due may go: it reports deliver when the
// direction forwards and the chunk is due, !deliver when the direction
// drops it, and !ok when the pair ended first.
func (c *conn) await(d Direction, due time.Time, timer *time.Timer) (deliver, ok bool) {
	for {
		c.p.mu.Lock()
		mode, changed := c.p.modes[d], c.p.changed
		c.p.mu.Unlock()
		switch mode {
		case Drop:
			return false, true
		case Forward:
			wait := time.Until(due)
			if wait <= 0 {
				return true, true
			}
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-changed:
				timer.Stop()
			case <-c.done:
				return false, false
			}
		case Blackhole:
			select {
			case <-changed:
			case <-c.done:
				return false, false
			}
		}
	}
}

// dropped counts n bytes discarded after they were queued.
func (p *Proxy) dropped(d Direction, n int) {
	p.mu.Lock()
	p.stats.Dropped[d] += int64(n)
	p.broadcastLocked()
	p.mu.Unlock()
}

// delivered counts n bytes written in direction d from now on, data
// saying whether a DATA frame ended in them.
func (p *Proxy) delivered(d Direction, n int, data bool, now time.Time) {
	p.mu.Lock()
	p.stats.Delivered[d] += int64(n)
	p.lastByte[d] = now
	if data {
		p.lastData[d] = now
	}
	p.broadcastLocked()
	p.mu.Unlock()
}
