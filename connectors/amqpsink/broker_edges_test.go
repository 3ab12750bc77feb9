package amqpsink

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestPauseResumeKeepsTheOutage: a broker that stays unreachable while the
// task is paused and resumed again and again (each pause cancels the Put
// that is reconnecting; the resumed Put reconnects again) fails the task
// once rabbitmq.reconnect.timeout.ms has passed since the outage began.
// Each resumed Put used to start a fresh outage, so a task paused and
// resumed more often than the timeout stayed RUNNING, delivering nothing.
func TestPauseResumeKeepsTheOutage(t *testing.T) {
	proxy, s, _, _ := proxiedSink(t, "pr", "2000")
	defer func() { proxy.up(); _ = s.stop(true) }()
	s.put(rec("pr", 0, 0, "", "v0"))
	s.flush()
	proxy.down()
	awaitSessionGone(t, s.task)

	batch := []connect.SinkRecord{rec("pr", 0, 1, "", "v1")}
	began := time.Now()
	var err error
	for time.Since(began) < 8*time.Second {
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(700*time.Millisecond, cancel) // the pause
		err = s.task.Put(ctx, batch)
		stop.Stop()
		cancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			break
		}
		time.Sleep(100 * time.Millisecond) // paused, then resumed
	}
	if err == nil || !strings.Contains(err.Error(), KeyReconnectTimeout) {
		t.Fatalf("after %v of an unreachable broker, paused and resumed every 0.7 s, Put = %v; want a failure naming %s (the timeout is 2 s)",
			time.Since(began).Round(time.Millisecond), err, KeyReconnectTimeout)
	}
	// Expected at about 2.4 s (the first resumed Put after 2 s fails at its
	// first attempt); 5 s leaves room for a loaded machine and is still far
	// below the bug, which never fails the task (the loop gives up at 8 s).
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("the task failed only %v after the outage began; the timeout is 2 s", d.Round(time.Millisecond))
	}
	// The broker back: a fresh task (the runtime restarts the failed one)
	// is not needed for this probe; the same one would reconnect too.
}

// A pause shorter than the timeout, with the broker back on resume, does
// not fail the task: the continued outage still tries at once.
func TestResumeWithTheBrokerBackReconnects(t *testing.T) {
	proxy, s, _, _ := proxiedSink(t, "rb", "1500")
	defer func() { proxy.up(); _ = s.stop(true) }()
	tp := connect.TopicPartition{Topic: "rb", Partition: 0}
	s.put(rec("rb", 0, 0, "", "v0"))
	s.flush()
	proxy.down()
	awaitSessionGone(t, s.task)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err := s.task.Put(ctx, []connect.SinkRecord{rec("rb", 0, 1, "", "v1")})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put during the outage = %v, want its context's error", err)
	}
	time.Sleep(1500 * time.Millisecond) // paused past the timeout
	proxy.up()
	if err := s.task.Put(ctxT(t), []connect.SinkRecord{rec("rb", 0, 1, "", "v1")}); err != nil {
		t.Fatalf("Put after the resume, the broker back: %v", err)
	}
	if o := s.flush()[tp]; o != 2 {
		t.Errorf("flushed offset %d, want 2", o)
	}
}

// slowProxy forwards TCP to the broker and, while throttled, holds every
// content-body frame from the client for a while before forwarding it: a
// broker under credit-based flow control, which reads a publishing
// connection slowly but sends no connection.blocked.
type slowProxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // per body frame, ns
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func newSlowProxy(t *testing.T, rawURL string) (*slowProxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{ln: ln, target: u.Host}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	pu := *u
	pu.Host = ln.Addr().String()
	return p, pu.String()
}

func (p *slowProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		_ = c.(*net.TCPConn).SetReadBuffer(64 << 10)
		p.mu.Lock()
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		p.wg.Go(func() {
			defer func() { _ = b.Close(); _ = c.Close() }()
			r := bufio.NewReader(c)
			header := make([]byte, 8)
			if _, err := io.ReadFull(r, header); err != nil {
				return
			}
			if _, err := b.Write(header); err != nil {
				return
			}
			for {
				f, err := readFrame(r)
				if err != nil {
					return
				}
				if d := time.Duration(p.delay.Load()); d > 0 && f[0] == 3 {
					time.Sleep(d)
				}
				if _, err := b.Write(f); err != nil {
					return
				}
			}
		})
		p.wg.Go(func() {
			defer func() { _ = b.Close(); _ = c.Close() }()
			_, _ = io.Copy(c, b)
		})
	}
}

// TestFlowControlIsNotCut: a healthy but slow connection (flow control,
// no connection.blocked) is not cut. The cut is armed only once the call's
// context ended (or the task stopped), and then only an operation that is
// still the same one a second later is cut: a Put publishes nothing more
// after its context ends, so a long batch is never cut, and a cancelled
// Put returns after at most the publish under way.
func TestFlowControlIsNotCut(t *testing.T) {
	proxy, cfg := slowProxiedConfig(t, "fc")
	s, logs := startSinkWithLog(t, cfg)
	tp := connect.TopicPartition{Topic: "fc", Partition: 0}
	s.put(rec("fc", 0, 0, "", "v0"))
	s.flush()
	sess := s.task.live()

	// About 8 body frames per record, 25 ms each: ~0.2 s per publish once
	// the socket buffers are full.
	proxy.delay.Store(int64(25 * time.Millisecond))
	body := strings.Repeat("x", 1<<20)
	var recs []connect.SinkRecord
	for i := int64(1); i <= 40; i++ {
		recs = append(recs, rec("fc", 0, i, "", body))
	}
	// Live context: the batch takes well over a second; nothing is cut.
	began := time.Now()
	if err := s.task.Put(ctxT(t), recs[:15]); err != nil {
		t.Fatal(err)
	}
	t.Logf("15 slow publishes took %v", time.Since(began).Round(time.Millisecond))
	// Paused halfway through a slow batch: the Put returns after the
	// publish under way (< 1 s), and nothing is cut.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(1500*time.Millisecond, cancel)
	began = time.Now()
	err := s.task.Put(ctx, recs[15:])
	returnedAfter := time.Since(began) - 1500*time.Millisecond
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("paused Put = %v, want context.Canceled", err)
	}
	t.Logf("the paused Put returned %v after the pause", returnedAfter.Round(time.Millisecond))
	time.Sleep(1500 * time.Millisecond) // a cut would come within stuckIOGrace
	if strings.Contains(logs.String(), "closing the connection") || s.task.live() != sess || s.task.reconnects != 0 {
		t.Errorf("a slow but healthy connection was cut (reconnects %d)", s.task.reconnects)
	}
	proxy.delay.Store(0)
	s.put(recs[15:]...)
	if o := s.flush()[tp]; o != 41 {
		t.Errorf("flushed offset %d, want 41", o)
	}
	if s.task.reconnects != 0 || s.task.republished != 0 {
		t.Errorf("%d reconnects, %d republished: the healthy connection was cut", s.task.reconnects, s.task.republished)
	}
}

// TestSingleSlowPublishAfterPauseIsCut documents the residual case: one
// publish that by itself takes over a second after the call's context
// ended (a large message under heavy flow control) is cut. Nothing is lost
// or flushed early: the message goes back to the backlog and is
// republished by the next Flush or Put, a reconnect being the only cost.
func TestSingleSlowPublishAfterPauseIsCut(t *testing.T) {
	proxy, cfg := slowProxiedConfig(t, "fc1")
	s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
	defer func() { _ = s.stop(true) }()
	tp := connect.TopicPartition{Topic: "fc1", Partition: 0}
	s.put(rec("fc1", 0, 0, "", "v0"))
	s.flush()
	proxy.delay.Store(int64(20 * time.Millisecond))
	big := rec("fc1", 0, 1, "", strings.Repeat("y", 24<<20)) // ~190 frames: ~4 s
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	err := s.task.Put(ctx, []connect.SinkRecord{big})
	cancel()
	t.Logf("Put = %v; session cut: %v", err, s.task.live() == nil)
	if err == nil {
		t.Errorf("Put = nil, want the context's error (the big record was not published)")
	}
	proxy.delay.Store(0)
	// The re-Put reconnects and republishes the backlog (the big record),
	// then skips the record as taken.
	s.put(big)
	if o := s.flush()[tp]; o != 2 {
		t.Errorf("flushed offset %d, want 2", o)
	}
	t.Logf("after the re-Put: reconnects %d, republished %d", s.task.reconnects, s.task.republished)
}

// TestReturnIsSeenBeforeItsConfirm: within one partition, records routed
// and records the broker returns (mandatory, no binding for their key) are
// interleaved; after every Flush every returned record below the flushed
// offset has been reported, and with errors.tolerance=none no offset
// passes the first returned record.
func TestReturnIsSeenBeforeItsConfirm(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	for _, tc := range []struct {
		qtype    string
		tolerate bool
	}{{"quorum", true}, {"classic", true}, {"quorum", false}} {
		t.Run(fmt.Sprintf("%s,tolerate=%v", tc.qtype, tc.tolerate), func(t *testing.T) {
			cfg := baseConfig(t, u, "rr")
			cfg[KeyRoutingKey] = "${topic}.${key}"
			cfg[KeyQueueType] = tc.qtype
			cfg[KeyMaxInFlight] = "256"
			name := cfg["name"]
			q := name + ".rr"
			cleanupByName(t, b, name, q)
			rep := &reporter{tolerate: tc.tolerate}
			l := connect.NewMemoryLedger()
			s := startSink(t, cfg, l, rep)
			defer func() { _ = s.stop(true) }()
			owner := recordedOwner(listLedger(t, l))
			// Only key "good" is routed from now on.
			err := b.on(func(ch *amqp.Channel) error {
				if err := ch.QueueBind(q, "rr.good", name, false, nil); err != nil {
					return err
				}
				return ch.QueueUnbind(q, "rr.#", name, amqp.Table{OwnerArg: owner})
			})
			if err != nil {
				t.Fatal(err)
			}
			tp := connect.TopicPartition{Topic: "rr", Partition: 0}
			bad := map[int64]bool{}
			firstBad := int64(-1)
			rng := rand.New(rand.NewPCG(1, 2))
			var off int64
			for batch := 0; batch < 20; batch++ {
				var recs []connect.SinkRecord
				for range 100 {
					key := "good"
					if rng.IntN(3) == 0 {
						key, bad[off] = "bad", true
						if firstBad < 0 {
							firstBad = off
						}
					}
					recs = append(recs, rec("rr", 0, off, key, fmt.Sprint("v", off)))
					off++
				}
				perr := s.task.Put(ctxT(t), recs)
				fctx, fcancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(20))*time.Millisecond)
				offs, ferr := s.task.Flush(fctx)
				fcancel()
				reported := map[int64]bool{}
				for _, r := range rep.got() {
					reported[r.rec.Offset] = true
				}
				for o := range offs[tp] {
					if bad[o] && !reported[o] {
						t.Fatalf("batch %d: Flush reported offset %d, past returned record %d that was not reported (Put %v, Flush %v)", batch, offs[tp], o, perr, ferr)
					}
				}
				if !tc.tolerate {
					if offs[tp] > firstBad {
						t.Fatalf("errors.tolerance=none: flushed offset %d past the returned record %d", offs[tp], firstBad)
					}
					if perr != nil || ferr != nil {
						return // the task fails, as it must
					}
				} else if perr != nil {
					t.Fatalf("Put: %v", perr)
				}
			}
			if !tc.tolerate {
				t.Fatal("a returned record under errors.tolerance=none never failed the task")
			}
			offs := s.flush()
			if offs[tp] != off {
				t.Errorf("final flushed offset %d, want %d", offs[tp], off)
			}
			got := rep.got()
			if len(got) != len(bad) {
				t.Errorf("%d reports, want %d", len(got), len(bad))
			}
			for _, r := range got {
				if !bad[r.rec.Offset] || !strings.Contains(r.err.Error(), "NO_ROUTE") {
					t.Errorf("report for offset %d: %v", r.rec.Offset, r.err)
				}
			}
			if n := len(b.drainDistinct(q, int(off)-len(bad))); n != int(off)-len(bad) {
				t.Errorf("%d routed messages arrived, want %d", n, int(off)-len(bad))
			}
		})
	}
}

// TestHeadersOverFrameMaxAreReported: a record whose headers do not fit in
// one AMQP frame (the broker's frame_max, RabbitMQ's default 128 KiB) made
// the broker close the connection (FRAME_ERROR frame_too_large) on every
// publish and republish: the task reconnected until the reconnect timeout
// and failed as if the broker were unreachable, never reporting the
// record. It is now reported under errors.tolerance like other records the
// protocol cannot carry, and the records around it are delivered. The
// limit is exact: a header frame of exactly frame_max is published.
func TestHeadersOverFrameMaxAreReported(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "hh")
	cfg[KeyReconnectTimeout] = "3000"
	name := cfg["name"]
	q := name + ".hh"
	cleanupByName(t, b, name, q)
	rep := &reporter{tolerate: true}
	s := startSink(t, cfg, connect.NewMemoryLedger(), rep)
	defer func() { _ = s.stop(true) }()
	frameMax := s.task.live().conn.Config.FrameSize
	withHeader := func(off int64, size int) connect.SinkRecord {
		r := rec("hh", 0, off, "", fmt.Sprint("v", off))
		r.Headers = []connect.Header{{Key: "h", Value: []byte(strings.Repeat("z", size))}}
		return r
	}
	// The header value size that makes the frame exactly frame_max.
	base := headerFramePayload(s.task.message(withHeader(1, 0), messageID(withHeader(1, 0))))
	fits := frameMax - 8 - base
	recs := []connect.SinkRecord{
		withHeader(0, 200<<10), // far too large
		withHeader(1, fits),    // exactly fits
		withHeader(2, fits+1),  // one byte too many
		rec("hh", 0, 3, "", "v3"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.task.Put(ctx, recs); err != nil {
		t.Fatalf("Put: %v", err)
	}
	offs, err := s.task.Flush(ctx)
	if err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if o := offs[connect.TopicPartition{Topic: "hh", Partition: 0}]; o != 4 {
		t.Errorf("flushed offset %d, want 4", o)
	}
	var reported []int64
	for _, r := range rep.got() {
		reported = append(reported, r.rec.Offset)
		if !strings.Contains(r.err.Error(), "frame_max") {
			t.Errorf("report for offset %d: %v, want it to name frame_max", r.rec.Offset, r.err)
		}
	}
	if fmt.Sprint(reported) != "[0 2]" {
		t.Errorf("reported offsets %v, want [0 2]", reported)
	}
	if s.task.reconnects != 0 {
		t.Errorf("%d reconnects: a record broke the connection", s.task.reconnects)
	}
	got := map[string]bool{}
	for _, d := range b.drainDistinct(q, 2) {
		got[d.MessageId] = true
	}
	if !got["hh-0-1"] || !got["hh-0-3"] {
		t.Errorf("delivered %v, want hh-0-1 and hh-0-3", got)
	}
}

// slowProxiedConfig is the config of a sink of one topic, on a classic
// queue, reaching the broker through a slow proxy; the connector's objects
// are removed by name at the end of the test.
func slowProxiedConfig(t *testing.T, topic string) (*slowProxy, connect.Config) {
	t.Helper()
	u := testenv.RabbitMQURL(t)
	proxy, purl := newSlowProxy(t, u)
	cfg := baseConfig(t, purl, topic)
	cfg[KeyQueueType] = "classic"
	cleanupByName(t, newBroker(t, u), cfg["name"], cfg["name"]+"."+topic)
	return proxy, cfg
}

// A queue whose policy refuses messages beyond its length
// (overflow=reject-publish) nacks them: under errors.tolerance=all each is
// reported as errant and its offset still committed; under none no offset
// passes the first nacked record. RabbitMQ recommends policies over queue
// arguments for limits, TTLs and dead-lettering (docs/amqpsink.md).
// Classic queues only: a quorum queue of RabbitMQ 3.10 took all 50
// pipelined publishes past a limit of 2 and nacked none (it enforced the
// limit only for publishes confirmed one at a time).
func TestPolicyRejectPublishNacksAreErrant(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	const n = 50
	for _, tc := range []struct {
		qtype    string
		tolerate bool
	}{{"classic", true}, {"classic", false}} {
		t.Run(fmt.Sprintf("%s,tolerate=%v", tc.qtype, tc.tolerate), func(t *testing.T) {
			vhost, vurl := testVhost(t, u)
			ctl(t, "set_policy", "-p", vhost, "--apply-to", "queues", "cap", ".*",
				`{"max-length":2,"overflow":"reject-publish"}`)
			b := newBroker(t, vurl)
			cfg := baseConfig(t, vurl, "np")
			cfg[KeyQueueType] = tc.qtype
			rep := &reporter{tolerate: tc.tolerate}
			s := startSink(t, cfg, connect.NewMemoryLedger(), rep)
			defer func() { _ = s.stop(true) }()
			recs := make([]connect.SinkRecord, n)
			for i := range recs {
				recs[i] = rec("np", 0, int64(i), "", fmt.Sprint(i))
			}
			putErr := s.task.Put(ctxT(t), recs)
			offs, err := s.task.Flush(ctxT(t))
			tp := connect.TopicPartition{Topic: "np", Partition: 0}
			got := rep.got()
			if len(got) == 0 {
				t.Fatalf("no nacked record reported (Put %v, Flush %v, %v)", putErr, offs, err)
			}
			first := int64(n)
			for _, r := range got {
				first = min(first, r.rec.Offset)
				if r.rec.Offset < 2 || !strings.Contains(r.err.Error(), "nack") {
					t.Errorf("reported offset %d: %v; want only records past the queue's 2 nacked", r.rec.Offset, r.err)
				}
			}
			if tc.tolerate {
				if putErr != nil || err != nil || offs[tp] != n {
					t.Errorf("tolerated: Put %v, Flush = %v, %v; want offset %d", putErr, offs, err, n)
				}
				if q := b.messages(cfg["name"] + ".np"); q+len(got) != n {
					t.Errorf("%d messages in the queue and %d reported, want %d in all", q, len(got), n)
				}
				return
			}
			if o, ok := offs[tp]; ok && o > first {
				t.Errorf("errors.tolerance=none: Flush reported offset %d past the first nacked record %d (Put %v, Flush %v)", o, first, putErr, err)
			}
			if putErr == nil && err == nil {
				t.Error("errors.tolerance=none: neither Put nor Flush failed on a nacked record")
			}
		})
	}
}
