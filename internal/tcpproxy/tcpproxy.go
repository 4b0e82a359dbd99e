// Package tcpproxy provides a TCP proxy that a test controls, for injecting
// network faults between a client and a server: refused connections,
// black-holed traffic and added latency.
//
// A Proxy listens on a random loopback port and forwards every connection it
// accepts to one target address. Its Mode and delay can be changed at any
// time, and a change applies at once to open connections as well as new ones.
package tcpproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode says what a Proxy does with the traffic it carries.
type Mode int

const (
	// Pass forwards bytes both ways, after the delay set by SetDelay.
	Pass Mode = iota
	// Refuse closes every open connection with a reset, and resets each new
	// connection as soon as it is accepted: a client sees a connection
	// reset or end of stream right away.
	Refuse
	// Blackhole keeps connections open but forwards nothing in either
	// direction: bytes read are dropped, and so is the end of a stream
	// until the mode changes back to Pass. New connections are accepted and
	// likewise carry nothing. A client waits until its own timeout.
	Blackhole
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Pass:
		return "Pass"
	case Refuse:
		return "Refuse"
	case Blackhole:
		return "Blackhole"
	default:
		return fmt.Sprintf("Mode(%d)", int(m))
	}
}

const (
	// dialTimeout bounds how long a connection waits for the target.
	dialTimeout = 5 * time.Second
	// readSize is the largest chunk read at once.
	readSize = 32 << 10
	// queueLen bounds the chunks read but not yet written, per direction;
	// a full queue stops the reading side, so a slow receiver slows the
	// sender as it would without the proxy.
	queueLen = 64
)

// A Proxy forwards TCP connections from a loopback address to a target.
// Its methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	ctx    context.Context // done when the Proxy is closed
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the Proxy started

	mode  atomic.Int32
	delay atomic.Int64 // nanoseconds

	mu      sync.Mutex
	closed  bool
	conns   map[*conn]struct{}
	changed chan struct{} // closed and replaced on every SetMode
}

// Start listens on a random port of 127.0.0.1 and forwards each connection
// it accepts to target, a "host:port" address. The target need not be up
// yet: it is dialed for each accepted connection, and a connection whose
// target cannot be reached within 5s is closed. The Proxy starts in Pass mode
// with no delay; the caller must Close it.
func Start(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("tcpproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		ln:      ln,
		target:  target,
		ctx:     ctx,
		cancel:  cancel,
		conns:   make(map[*conn]struct{}),
		changed: make(chan struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address the Proxy listens on, "127.0.0.1:port".
func (p *Proxy) Addr() string {
	return p.ln.Addr().String()
}

// SetMode switches the Proxy to mode m. It applies before SetMode returns:
// on Refuse every open connection is closed, and after a switch to Blackhole
// no byte is forwarded, but for a chunk whose write had already begun. A
// switch back to Pass resumes forwarding on the connections that were
// black-holed; what they carried meanwhile is lost.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	if Mode(p.mode.Load()) == m {
		p.mu.Unlock()
		return
	}
	p.mode.Store(int32(m))
	close(p.changed)
	p.changed = make(chan struct{})
	var victims []*conn
	if m == Refuse {
		victims = p.takeConnsLocked()
	}
	p.mu.Unlock()
	for _, c := range victims {
		c.close(true)
	}
}

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	return Mode(p.mode.Load())
}

// SetDelay makes the Proxy forward each chunk of bytes d after it was read,
// in each direction independently and in the order read. It applies to
// chunks read from then on; zero or less means no delay.
func (p *Proxy) SetDelay(d time.Duration) {
	p.delay.Store(int64(max(d, 0)))
}

// Conns returns the number of client connections open through the Proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening, closes every connection and returns once all the
// goroutines of the Proxy have ended. Later calls do nothing and return nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	victims := p.takeConnsLocked()
	p.mu.Unlock()

	p.cancel()
	for _, c := range victims {
		c.close(false)
	}
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("tcpproxy: close listener: %w", err)
	}
	return nil
}

// takeConnsLocked empties the set of open connections and returns what it
// held. p.mu must be held.
func (p *Proxy) takeConnsLocked() []*conn {
	cs := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	clear(p.conns)
	return cs
}

// modeWatch returns the current mode and a channel closed when it next
// changes.
func (p *Proxy) modeWatch() (Mode, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Mode(p.mode.Load()), p.changed
}

// accept accepts connections until the listener is closed.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient error, such as too many open files: back off
			// briefly rather than spin, unless the Proxy closes meanwhile.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		client := nc.(*net.TCPConn)

		p.mu.Lock()
		if p.closed || Mode(p.mode.Load()) == Refuse {
			p.mu.Unlock()
			reset(client)
			continue
		}
		ctx, cancel := context.WithCancel(p.ctx)
		c := &conn{p: p, client: client, ctx: ctx, cancel: cancel}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()

		go c.serve()
	}
}

// drop forgets c and closes it.
func (p *Proxy) drop(c *conn, reset bool) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.close(reset)
}

// reset closes c so that its peer sees a connection reset rather than an
// orderly end of stream.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// A conn is one client connection and the connection to the target that
// serves it.
type conn struct {
	p      *Proxy
	client *net.TCPConn
	ctx    context.Context // done once the conn is closed
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	upstream *net.TCPConn // nil until dialed
	ended    int          // directions whose end of stream was forwarded
}

// A chunk is bytes read from one side, due to be written to the other.
type chunk struct {
	data []byte
	due  time.Time
}

// serve dials the target and starts the four goroutines that move bytes:
// a reader and a writer per direction.
func (c *conn) serve() {
	defer c.p.wg.Done()

	var d net.Dialer
	dctx, cancel := context.WithTimeout(c.ctx, dialTimeout)
	nc, err := d.DialContext(dctx, "tcp", c.p.target)
	cancel()
	if err != nil {
		c.p.drop(c, true)
		return
	}
	upstream := nc.(*net.TCPConn)

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = upstream.Close()
		return
	}
	c.upstream = upstream
	c.mu.Unlock()

	toTarget := make(chan chunk, queueLen)
	toClient := make(chan chunk, queueLen)
	c.p.wg.Add(4)
	go c.read(c.client, toTarget)
	go c.write(upstream, toTarget)
	go c.read(upstream, toClient)
	go c.write(c.client, toClient)
}

// read reads src until it ends, queueing what it reads in Pass mode and
// dropping it otherwise. At end of stream it closes q; on any other error it
// resets the whole connection.
func (c *conn) read(src *net.TCPConn, q chan<- chunk) {
	defer c.p.wg.Done()
	buf := make([]byte, readSize)
	for {
		n, err := src.Read(buf)
		if n > 0 && c.p.Mode() == Pass {
			ch := chunk{
				data: append([]byte(nil), buf[:n]...),
				due:  time.Now().Add(time.Duration(c.p.delay.Load())),
			}
			select {
			case q <- ch:
			case <-c.ctx.Done():
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				close(q)
			} else {
				c.p.drop(c, true)
			}
			return
		}
	}
}

// write writes the chunks of q to dst, each once it is due and only if the
// Proxy is then in Pass mode. When q is closed it forwards the end of stream
// as soon as the Proxy is in Pass mode.
func (c *conn) write(dst *net.TCPConn, q <-chan chunk) {
	defer c.p.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var ch chunk
		var ok bool
		select {
		case ch, ok = <-q:
		case <-c.ctx.Done():
			return
		}
		if !ok {
			c.endStream(dst)
			return
		}
		if wait := time.Until(ch.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-c.ctx.Done():
				return
			}
		}
		if c.p.Mode() != Pass {
			continue
		}
		if _, err := dst.Write(ch.data); err != nil {
			c.p.drop(c, true)
			return
		}
	}
}

// endStream forwards an end of stream to dst once the Proxy is in Pass
// mode, and closes the connection once both directions have ended.
func (c *conn) endStream(dst *net.TCPConn) {
	for {
		m, changed := c.p.modeWatch()
		if m == Pass {
			break
		}
		select {
		case <-changed:
		case <-c.ctx.Done():
			return
		}
	}
	if err := dst.CloseWrite(); err != nil {
		c.p.drop(c, true)
		return
	}
	c.mu.Lock()
	c.ended++
	both := c.ended == 2
	c.mu.Unlock()
	if both {
		c.p.drop(c, false)
	}
}

// close closes both sides of c, with a reset if asked. It is idempotent.
func (c *conn) close(rst bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	upstream := c.upstream
	c.mu.Unlock()

	c.cancel()
	for _, nc := range []*net.TCPConn{c.client, upstream} {
		switch {
		case nc == nil:
		case rst:
			reset(nc)
		default:
			_ = nc.Close()
		}
	}
}
