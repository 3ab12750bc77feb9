package amqpsink

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// amqpProxy forwards AMQP 0-9-1 connections to the broker frame by frame and
// plays two broker behaviours that a test cannot cause on a shared broker
// without node-wide effects:
//   - block: what RabbitMQ does under a memory or disk alarm: it sends
//     connection.blocked to every connection and stops reading from a
//     connection as soon as it publishes, until unblock;
//   - misroute: every basic.publish goes to an exchange that does not exist,
//     so the broker closes the channel (404 NOT_FOUND) on every publish.
type amqpProxy struct {
	t      testing.TB
	ln     net.Listener
	target string
	closed chan struct{}
	wg     sync.WaitGroup

	mu        sync.Mutex
	conns     map[*proxyConn]struct{}
	accepted  int
	unblocked chan struct{} // non-nil while blocked; closed by unblock
	exchange  string        // non-empty: publishes are rewritten to it
	refusing  bool          // down: new connections are closed at once
	isClosed  bool
}

type proxyConn struct {
	client, broker net.Conn
	wmu            sync.Mutex // one frame at a time to the client
	once           sync.Once
}

func (pc *proxyConn) close() {
	pc.once.Do(func() {
		_ = pc.client.Close()
		_ = pc.broker.Close()
	})
}

func (pc *proxyConn) toClient(frame []byte) error {
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	_, err := pc.client.Write(frame)
	return err
}

// newAMQPProxy starts a proxy to the broker of rawURL and returns it with
// the URL that reaches the broker through it. It is closed when the test
// ends.
func newAMQPProxy(t testing.TB, rawURL string) (*amqpProxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5672")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &amqpProxy{t: t, ln: ln, target: target, closed: make(chan struct{}), conns: map[*proxyConn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	pu := *u
	pu.Host = ln.Addr().String()
	return p, pu.String()
}

func (p *amqpProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		// A small receive buffer, so a client that the proxy stops reading
		// fills the socket soon.
		_ = c.(*net.TCPConn).SetReadBuffer(64 << 10)
		pc := &proxyConn{client: c, broker: b}
		p.mu.Lock()
		if p.isClosed {
			p.mu.Unlock()
			pc.close()
			return
		}
		if p.refusing {
			p.mu.Unlock()
			pc.close()
			continue
		}
		p.conns[pc] = struct{}{}
		p.accepted++
		p.wg.Add(2)
		p.mu.Unlock()
		go p.clientToBroker(pc)
		go p.brokerToClient(pc)
	}
}

// Close closes every connection and waits for the proxy's goroutines.
func (p *amqpProxy) Close() {
	p.mu.Lock()
	if p.isClosed {
		p.mu.Unlock()
		return
	}
	p.isClosed = true
	close(p.closed)
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	_ = p.ln.Close()
	for pc := range conns {
		pc.close()
	}
	p.wg.Wait()
}

// connections counts the client connections accepted so far.
func (p *amqpProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// block sends connection.blocked with reason to every open connection and
// stops forwarding (and reading) a connection's frames at its next publish.
func (p *amqpProxy) block(reason string) {
	p.mu.Lock()
	p.unblocked = make(chan struct{})
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	args := append([]byte{byte(len(reason))}, reason...)
	for _, pc := range conns {
		_ = pc.toClient(methodFrame(10, 60, args)) // connection.blocked
	}
}

// unblock lets blocked connections go on and sends connection.unblocked.
func (p *amqpProxy) unblock() {
	p.mu.Lock()
	if p.unblocked != nil {
		close(p.unblocked)
		p.unblocked = nil
	}
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		_ = pc.toClient(methodFrame(10, 61, nil)) // connection.unblocked
	}
}

// down closes every connection and, until up, every new one at once: the
// broker is unreachable.
func (p *amqpProxy) down() {
	p.mu.Lock()
	p.refusing = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		pc.close()
	}
}

func (p *amqpProxy) up() {
	p.mu.Lock()
	p.refusing = false
	p.mu.Unlock()
}

// misroute makes every later basic.publish name exchange instead.
func (p *amqpProxy) misroute(exchange string) {
	p.mu.Lock()
	p.exchange = exchange
	p.mu.Unlock()
}

func (p *amqpProxy) state() (unblocked <-chan struct{}, exchange string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unblocked, p.exchange
}

func (p *amqpProxy) drop(pc *proxyConn) {
	pc.close()
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

func (p *amqpProxy) clientToBroker(pc *proxyConn) {
	defer p.wg.Done()
	defer p.drop(pc)
	r := bufio.NewReader(pc.client)
	header := make([]byte, 8) // "AMQP" 0 0 9 1
	if _, err := io.ReadFull(r, header); err != nil {
		return
	}
	if _, err := pc.broker.Write(header); err != nil {
		return
	}
	for {
		f, err := readFrame(r)
		if err != nil {
			return
		}
		if isPublish(f) {
			unblocked, exchange := p.state()
			if unblocked != nil {
				// Read nothing more from this connection until unblocked.
				select {
				case <-unblocked:
				case <-p.closed:
					return
				}
			}
			if exchange != "" {
				f = withExchange(f, exchange)
			}
		}
		if _, err := pc.broker.Write(f); err != nil {
			return
		}
	}
}

func (p *amqpProxy) brokerToClient(pc *proxyConn) {
	defer p.wg.Done()
	r := bufio.NewReader(pc.broker)
	for {
		f, err := readFrame(r)
		if err != nil {
			break
		}
		if err := pc.toClient(f); err != nil {
			break
		}
	}
	// The broker closed its side (it misses the heartbeats of a client the
	// proxy no longer reads): a blocked client keeps its socket, as it
	// would with a broker that blocks it.
	if unblocked, _ := p.state(); unblocked != nil {
		select {
		case <-unblocked:
		case <-p.closed:
		}
	}
	p.drop(pc)
}

// readFrame reads one whole frame: type, channel, size, payload, frame-end.
func readFrame(r *bufio.Reader) ([]byte, error) {
	head := make([]byte, 7)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(head[3:7])
	f := make([]byte, 7+int(size)+1)
	copy(f, head)
	if _, err := io.ReadFull(r, f[7:]); err != nil {
		return nil, err
	}
	if f[len(f)-1] != 0xCE {
		return nil, fmt.Errorf("frame without frame-end")
	}
	return f, nil
}

func methodFrame(class, method uint16, args []byte) []byte {
	payload := binary.BigEndian.AppendUint16(nil, class)
	payload = binary.BigEndian.AppendUint16(payload, method)
	payload = append(payload, args...)
	f := []byte{1, 0, 0}
	f = binary.BigEndian.AppendUint32(f, uint32(len(payload)))
	f = append(f, payload...)
	return append(f, 0xCE)
}

// isPublish reports whether f is a basic.publish method frame.
func isPublish(f []byte) bool {
	return f[0] == 1 && len(f) >= 12 && binary.BigEndian.Uint16(f[7:9]) == 60 && binary.BigEndian.Uint16(f[9:11]) == 40
}

// withExchange is the basic.publish frame f with its exchange replaced.
func withExchange(f []byte, exchange string) []byte {
	payload := f[7 : len(f)-1]
	// class, method, reserved-1 (short), exchange (shortstr), ...
	rest := payload[6+1+int(payload[6]):]
	args := append([]byte{payload[4], payload[5], byte(len(exchange))}, exchange...)
	out := methodFrame(60, 40, append(args, rest...))
	binary.BigEndian.PutUint16(out[1:3], binary.BigEndian.Uint16(f[1:3])) // the channel
	return out
}

// publishStuckInWrite reports whether a goroutine is inside a socket write
// of the task's publish, waiting for the kernel's buffers to drain.
func publishStuckInWrite() bool {
	buf := make([]byte, 8<<20)
	n := runtime.Stack(buf, true)
	for g := range strings.SplitSeq(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "[IO wait") && strings.Contains(g, "amqpsink.(*Task).publish(") && strings.Contains(g, "net.(*conn).Write(") {
			return true
		}
	}
	return false
}
