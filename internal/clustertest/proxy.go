package clustertest

import (
	"bytes"
	"io"
	"net"
	"sync"
	"time"
)

// sniffLimit bounds how much of a connection's first bytes the proxy reads
// to learn which node dialled it, and sniffTimeout how long it waits for
// them.
const (
	sniffLimit   = 4 << 10
	sniffTimeout = 2 * time.Second
)

// partition is the network between the nodes' raft listeners: one TCP
// proxy in front of each listener, at the raft address the peers list
// names. Every node dials the others through their proxies, so the proxy
// of node j sees every connection to j. It learns which node dialled from
// the first request on the connection: hashicorp/raft's RPC header carries
// the sender's raft address (the address of the sender's own proxy), which
// msgpack writes verbatim. Cutting a node closes every connection from or
// to it and refuses new ones until it is healed; the others keep talking.
type partition struct {
	// addrs are the proxies' addresses (what the peers list names), by
	// node; targets the nodes' real raft listeners.
	addrs, targets []string
	lis            []net.Listener

	mu     sync.Mutex
	cut    []bool
	conns  map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// proxyConn is one proxied connection: from is the dialling node (-1 when
// the proxy could not tell), to the node whose listener it reaches.
type proxyConn struct {
	from, to int
	down     net.Conn

	mu   sync.Mutex
	up   net.Conn
	dead bool
}

// close closes both ends; an upstream attached later is closed at once.
func (c *proxyConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dead = true
	c.down.Close()
	if c.up != nil {
		c.up.Close()
	}
}

// attach sets the upstream end, or closes it and reports false when c was
// closed meanwhile.
func (c *proxyConn) attach(up net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		up.Close()
		return false
	}
	c.up = up
	return true
}

// newPartition opens a proxy on loopback for each of targets.
func newPartition(targets []string) (*partition, error) {
	p := &partition{targets: targets, cut: make([]bool, len(targets)), conns: map[*proxyConn]struct{}{}}
	for range targets {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.close()
			return nil, err
		}
		p.lis = append(p.lis, l)
		p.addrs = append(p.addrs, l.Addr().String())
	}
	for j, l := range p.lis {
		p.wg.Go(func() { p.serve(j, l) })
	}
	return p, nil
}

// serve accepts the connections to node j until its listener closes.
func (p *partition) serve(j int, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.relay(j, c) })
	}
}

// relay learns who dialled c, refuses it across a cut, and otherwise
// copies bytes both ways between c and node j's listener.
func (p *partition) relay(j int, down net.Conn) {
	pc := &proxyConn{from: -1, to: j, down: down}
	if !p.admit(pc) {
		pc.close()
		return
	}
	defer p.forget(pc)
	head, from := p.sniff(down)
	up, err := net.DialTimeout("tcp", p.targets[j], sniffTimeout)
	if err != nil {
		pc.close()
		return
	}
	p.mu.Lock()
	pc.from = from
	severed := p.closed || p.severedLocked(pc)
	p.mu.Unlock()
	if !pc.attach(up) {
		return
	}
	if severed {
		pc.close()
		return
	}
	if _, err := up.Write(head); err != nil {
		pc.close()
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(up, down)
		pc.close()
	})
	_, _ = io.Copy(down, up)
	pc.close()
	wg.Wait()
}

// sniff reads the first bytes of c until they name the raft address of a
// node, and returns them with that node: -1 if none does within
// sniffLimit bytes or sniffTimeout, or c ends first.
func (p *partition) sniff(c net.Conn) ([]byte, int) {
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	defer c.SetReadDeadline(time.Time{})
	var head []byte
	buf := make([]byte, 512)
	for len(head) < sniffLimit {
		n, err := c.Read(buf)
		head = append(head, buf[:n]...)
		for i, a := range p.addrs {
			if bytes.Contains(head, []byte(a)) {
				return head, i
			}
		}
		if err != nil {
			break
		}
	}
	return head, -1
}

// severedLocked reports whether a cut stands between the ends of c.
func (p *partition) severedLocked(c *proxyConn) bool {
	return p.cut[c.to] || (c.from >= 0 && p.cut[c.from])
}

// admit registers c unless a cut stands between its ends or the proxies
// are closed.
func (p *partition) admit(c *proxyConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.severedLocked(c) {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *partition) forget(c *proxyConn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// isolate cuts node i off from every other node: its connections close and
// new ones are refused until heal.
func (p *partition) isolate(i int) {
	p.mu.Lock()
	p.cut[i] = true
	var doomed []*proxyConn
	for c := range p.conns {
		if p.severedLocked(c) {
			doomed = append(doomed, c)
		}
	}
	p.mu.Unlock()
	for _, c := range doomed {
		c.close()
	}
}

// heal lets node i reach the others again.
func (p *partition) heal(i int) {
	p.mu.Lock()
	p.cut[i] = false
	p.mu.Unlock()
}

// close stops the proxies and waits for their connections to end.
func (p *partition) close() {
	for _, l := range p.lis {
		l.Close()
	}
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
