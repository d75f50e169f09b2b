// Package faultproxy is a TCP proxy for tests that sits between a client
// (typically a Redis client) and a real server and injects faults: latency,
// a network link's delay, cut connections, hangs, refused connections and
// lost replies.
//
// Each accepted connection is paired with a fresh connection to the current
// target and bytes are copied both ways in chunks (one chunk is whatever one
// Read returned). When either side of a pair ends, both are closed; there is
// no half-close. Every method is safe for concurrent use, and Close waits
// for every goroutine the proxy started.
//
// Two kinds of delay: SetLatency stalls each chunk before forwarding it, so
// the chunks behind it on the same connection wait too (a slow server, or
// a stalled link); SetDelay is a link's propagation delay, a distant
// server: every chunk arrives the delay after it was read, and the chunks
// behind it are not held up, so a pipelining client keeps many requests in
// flight on one connection, as over a long network path.
package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// dialTimeout bounds the dial to the target for each accepted connection.
const dialTimeout = 5 * time.Second

// bufSize is the largest chunk forwarded at once.
const bufSize = 32 << 10

// lineChunks is how many chunks a delay line holds (SetDelay).
const lineChunks = 256

// Stats are cumulative counters of a Proxy.
type Stats struct {
	// Accepted is the number of client connections accepted, including
	// those closed at once by Refuse and those whose dial failed.
	Accepted int64
	// Active is the number of connection pairs currently open.
	Active int
	// BytesUp is the number of bytes forwarded client -> server.
	BytesUp int64
	// BytesDown is the number of bytes forwarded server -> client.
	BytesDown int64
	// RepliesDropped is the number of server -> client chunks swallowed
	// by DropReplies.
	RepliesDropped int64
}

// Proxy is a fault-injecting TCP proxy listening on a loopback port. Make one
// with New and stop it with Close.
type Proxy struct {
	ln     net.Listener
	ctx    context.Context // canceled by Close; bounds dials
	cancel context.CancelFunc
	wg     sync.WaitGroup

	latency atomic.Int64           // time.Duration
	link    atomic.Int64           // time.Duration: one-way delay of new connections
	drop    atomic.Int64           // replies still to drop
	marker  atomic.Pointer[[]byte] // DropReplyTo: the request whose reply to lose

	accepted  atomic.Int64
	bytesUp   atomic.Int64
	bytesDown atomic.Int64
	dropped   atomic.Int64

	mu      sync.Mutex
	target  string
	blockCh chan struct{} // non-nil while blocked; closed on unblock
	refuse  bool
	closed  bool
	conns   map[*pair]struct{}

	closeOnce sync.Once
	closeErr  error
}

// pair is one proxied connection: the client side and the server side.
type pair struct {
	client, server net.Conn
	done           chan struct{} // closed when the pair is torn down
	once           sync.Once
	armed          atomic.Bool // the next reply on this pair is to be lost
}

func (c *pair) close() {
	c.once.Do(func() {
		close(c.done)
		c.client.Close()
		c.server.Close()
	})
}

// New starts a proxy listening on 127.0.0.1:0 that forwards every accepted
// connection to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{ln: ln, ctx: ctx, cancel: cancel, target: target, conns: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the address the proxy listens on, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency sets the delay added before forwarding every chunk, in either
// direction (a round trip therefore pays it twice). 0 removes it. It applies
// to chunks read after the call.
func (p *Proxy) SetLatency(d time.Duration) {
	if d < 0 {
		d = 0
	}
	p.latency.Store(int64(d))
}

// SetDelay sets the one-way delay of the link between client and server
// for connections accepted from now on: every chunk, in either direction,
// is forwarded d after the proxy read it (a request and its reply
// therefore take 2d more), without holding up the chunks read after it,
// which keep their order. It models distance, not a slow server: unlike
// SetLatency, a connection carries as many requests per second as without
// it. Open connections keep the delay they were accepted with; 0 removes
// it for new ones. The faults of the other methods apply to a chunk when
// its delay has passed.
func (p *Proxy) SetDelay(d time.Duration) {
	if d < 0 {
		d = 0
	}
	p.link.Store(int64(d))
}

// Cut closes every open connection now, both the client and the server side.
// The proxy keeps accepting new connections.
func (p *Proxy) Cut() {
	p.mu.Lock()
	conns := p.takeConns()
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// takeConns empties the connection set and returns what it held; p.mu must
// be held.
func (p *Proxy) takeConns() []*pair {
	conns := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	clear(p.conns)
	return conns
}

// Block(true) makes the proxy hang: new connections are still accepted (and
// dialed through), but nothing is forwarded in either direction and open
// connections stall, holding what they read. Block(false) resumes
// forwarding, in order.
func (p *Proxy) Block(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.blockCh == nil:
		p.blockCh = make(chan struct{})
	case !on && p.blockCh != nil:
		close(p.blockCh)
		p.blockCh = nil
	}
}

// Refuse(true) closes every new connection as soon as it is accepted and cuts
// the open ones. Refuse(false) accepts and forwards again.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	var conns []*pair
	if on {
		conns = p.takeConns()
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// DropReplies arranges for the next n server -> client chunks, on any
// connection, to be swallowed; the connection that carried each is then
// closed. The server applied the command but the client never sees the
// reply: a lost reply. It replaces any earlier pending count; n <= 0
// cancels it.
func (p *Proxy) DropReplies(n int) {
	if n < 0 {
		n = 0
	}
	p.drop.Store(int64(n))
}

// DropReplyTo arranges for the reply to the next request that contains
// marker (the first client -> server chunk holding those bytes, on any
// connection) to be lost: the request reaches the server, the server's next
// chunk on that connection is swallowed and the connection closed. Unlike
// DropReplies it cannot hit a handshake or another client's reply. A nil or
// empty marker cancels it.
func (p *Proxy) DropReplyTo(marker []byte) {
	if len(marker) == 0 {
		p.marker.Store(nil)
		return
	}
	m := append([]byte(nil), marker...)
	p.marker.Store(&m)
}

// SetTarget makes connections accepted from now on go to addr. Open
// connections keep their server.
func (p *Proxy) SetTarget(addr string) {
	p.mu.Lock()
	p.target = addr
	p.mu.Unlock()
}

// Stats returns a snapshot of the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	active := len(p.conns)
	p.mu.Unlock()
	return Stats{
		Accepted:       p.accepted.Load(),
		Active:         active,
		BytesUp:        p.bytesUp.Load(),
		BytesDown:      p.bytesDown.Load(),
		RepliesDropped: p.dropped.Load(),
	}
}

// Close stops listening, closes every connection and waits until every
// goroutine of the proxy has returned. Later calls return the first result.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		conns := p.takeConns()
		if p.blockCh != nil {
			close(p.blockCh)
			p.blockCh = nil
		}
		p.mu.Unlock()
		p.cancel()
		p.closeErr = p.ln.Close()
		for _, c := range conns {
			c.close()
		}
		p.wg.Wait()
	})
	return p.closeErr
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // listener closed
		}
		p.accepted.Add(1)
		p.mu.Lock()
		if p.closed || p.refuse {
			p.mu.Unlock()
			c.Close()
			continue
		}
		target := p.target
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(c, target)
	}
}

func (p *Proxy) handle(client net.Conn, target string) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	server, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		client.Close()
		return
	}
	c := &pair{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.refuse {
		p.mu.Unlock()
		c.close()
		return
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()

	link := time.Duration(p.link.Load())
	go func() {
		defer p.wg.Done()
		p.pipe(c, client, server, false, link)
	}()
	p.pipe(c, server, client, true, link)
}

// pipe copies src to dst chunk by chunk until either fails or the pair is
// closed, then closes the pair. down is true for server -> client. With a
// link delay, the chunks go through a delay line (see delayLine).
func (p *Proxy) pipe(c *pair, src, dst net.Conn, down bool, link time.Duration) {
	defer p.remove(c)
	if link > 0 {
		p.delayLine(c, src, dst, down, link)
		return
	}
	buf := make([]byte, bufSize)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.forward(c, buf[:n], dst, down) {
			return
		}
		if err != nil {
			return
		}
	}
}

// forward applies the faults to one chunk and writes it to dst; false when
// the pair is to end (closed, reply dropped, write failed).
func (p *Proxy) forward(c *pair, chunk []byte, dst net.Conn, down bool) bool {
	if !p.waitUnblocked(c) || !p.delay(c) {
		return false
	}
	if down && (c.armed.Swap(false) || p.takeDrop()) {
		p.dropped.Add(1)
		return false // swallow the reply and close the connection
	}
	if !down {
		if m := p.marker.Load(); m != nil && bytes.Contains(chunk, *m) && p.marker.CompareAndSwap(m, nil) {
			c.armed.Store(true)
		}
	}
	if _, err := dst.Write(chunk); err != nil {
		return false
	}
	if down {
		p.bytesDown.Add(int64(len(chunk)))
	} else {
		p.bytesUp.Add(int64(len(chunk)))
	}
	return true
}

// timedChunk is a chunk read at a known time, on its way through a delay line.
type timedChunk struct {
	data []byte
	due  time.Time
}

// delayLine is pipe for a link with a one-way delay: this goroutine reads
// chunks and queues each with the time it is due (read time + link); a
// second one forwards each when it is due. The queue holds lineChunks
// chunks: a reader that gets that far ahead waits, as a full TCP window
// would make it.
func (p *Proxy) delayLine(c *pair, src, dst net.Conn, down bool, link time.Duration) {
	q := make(chan timedChunk, lineChunks)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer c.close() // the writer ends the pair when it stops, whatever the reason
		t := time.NewTimer(time.Hour)
		defer t.Stop()
		for {
			var ch timedChunk
			select {
			case ch = <-q:
			case <-c.done:
				return
			}
			if ch.data == nil {
				return // the reader stopped: everything before it was forwarded
			}
			if d := time.Until(ch.due); d > 0 {
				t.Reset(d)
				select {
				case <-t.C:
				case <-c.done:
					return
				}
			}
			if !p.forward(c, ch.data, dst, down) {
				return
			}
		}
	}()
	buf := make([]byte, bufSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			due := time.Now().Add(link)
			select {
			case q <- timedChunk{data: append([]byte(nil), buf[:n]...), due: due}:
			case <-c.done:
				return
			}
		}
		if err != nil {
			// Let what was read arrive before the pair ends, as a link
			// delivers what was sent before a close.
			select {
			case q <- timedChunk{}:
				<-c.done
			case <-c.done:
			}
			return
		}
	}
}

// remove closes the pair and forgets it.
func (p *Proxy) remove(c *pair) {
	c.close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// waitUnblocked waits while the proxy is blocked; false if the pair was
// closed meanwhile.
func (p *Proxy) waitUnblocked(c *pair) bool {
	for {
		p.mu.Lock()
		ch := p.blockCh
		p.mu.Unlock()
		if ch == nil {
			select {
			case <-c.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-ch:
		case <-c.done:
			return false
		}
	}
}

// delay sleeps for the configured latency; false if the pair was closed
// meanwhile.
func (p *Proxy) delay(c *pair) bool {
	d := time.Duration(p.latency.Load())
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.done:
		return false
	}
}

// takeDrop consumes one pending dropped reply, if any.
func (p *Proxy) takeDrop() bool {
	for {
		n := p.drop.Load()
		if n <= 0 {
			return false
		}
		if p.drop.CompareAndSwap(n, n-1) {
			return true
		}
	}
}
