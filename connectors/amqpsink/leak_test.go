package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// awaitNoNewGoroutines waits until no goroutine started since before runs
// code of amqp091-go or of the connector (the test's proxy and its own
// broker connection excepted).
func awaitNoNewGoroutines(t *testing.T, before map[string]bool, own *broker) {
	t.Helper()
	ownConn := fmt.Sprintf("(*Connection).reader(%p", own.conn)
	ownBeat := fmt.Sprintf("(*Connection).heartbeater(%p", own.conn)
	testenv.AwaitNoNewGoroutines(t, before, "Stopped", 15*time.Second, func(g string) bool {
		if strings.Contains(g, "amqpProxy") || strings.Contains(g, ownConn) || strings.Contains(g, ownBeat) {
			return false
		}
		return strings.Contains(g, "rabbitmq/amqp091-go") || strings.Contains(g, "connectors/amqpsink.")
	})
}

// A task whose Start fails after it connected (the exchange exists with
// another type) leaves no connection goroutine or pump behind once Stopped
// returned.
func TestLeakTaskStartFailsHalfway(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "half")
	name := cfg["name"]
	cleanupByName(t, b, name, name+".half")
	if err := b.on(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(name, "fanout", true, false, false, false, nil)
	}); err != nil {
		t.Fatal(err)
	}
	before := testenv.GoroutineIDs()
	task := &Task{}
	ctx := connect.WithHost(ctxT(t), testHost(name, 0, connect.NewMemoryLedger(), &reporter{}))
	if err := task.Start(ctx, cfg); err == nil {
		t.Fatal("Start succeeded against an exchange of another type")
	}
	task.Stop(false)
	if err := task.Stopped(ctx); err != nil {
		t.Fatal(err)
	}
	awaitNoNewGoroutines(t, before, b)
}

// A connector whose Start fails after it connected leaves nothing running
// once Stopped returned.
func TestLeakConnectorStartFailsHalfway(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "halfc")
	name := cfg["name"]
	cleanupByName(t, b, name, name+".halfc")
	if err := b.on(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(name, "fanout", true, false, false, false, nil)
	}); err != nil {
		t.Fatal(err)
	}
	before := testenv.GoroutineIDs()
	c := &Connector{}
	ctx := connect.WithHost(ctxT(t), testHost(name, -1, connect.NewMemoryLedger(), nil))
	if err := c.Start(ctx, cfg); err == nil {
		t.Fatal("Start succeeded against an exchange of another type")
	}
	c.Stop(true)
	if err := c.Stopped(ctx); err != nil {
		t.Fatal(err)
	}
	awaitNoNewGoroutines(t, before, b)
}

// A Put reconnecting to a broker that went away is ended by Stop; after
// Stopped nothing of the task runs.
func TestLeakStopDuringReconnect(t *testing.T) {
	before := testenv.GoroutineIDs()
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	proxy, purl := newAMQPProxy(t, u)
	cfg := baseConfig(t, purl, "gone")
	cfg[KeyReconnectTimeout] = "300000"
	cleanupByName(t, b, cfg["name"], cfg["name"]+".gone")
	logs := &testenv.SyncBuffer{}
	lg := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := tryStartSinkLogged(t, cfg, connect.NewMemoryLedger(), &reporter{}, lg)
	if err != nil {
		t.Fatal(err)
	}
	s.put(rec("gone", 0, 0, "", "v0"))
	s.flush()
	proxy.down()
	awaitSessionGone(t, s.task)
	done := make(chan error, 1)
	go func() { done <- s.task.Put(context.Background(), []connect.SinkRecord{rec("gone", 0, 1, "", "v1")}) }()
	// Stopped while it backs off between failed dials.
	if !eventually(10*time.Second, func() bool { return strings.Count(logs.String(), "reconnecting to RabbitMQ failed") >= 2 }) {
		t.Fatalf("the task does not try to reconnect; log:\n%s", logs.String())
	}
	s.task.Stop(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Put after Stop: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not end a reconnecting Put")
	}
	if err := s.task.Stopped(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	proxy.up()
	s.conn.Stop(true)
	if err := s.conn.Stopped(connect.WithHost(ctxT(t), testHost(s.name, -1, s.ledger, nil))); err != nil {
		t.Fatal(err)
	}
	awaitNoNewGoroutines(t, before, b)
}

// A broker that closes the channel (404 on a misrouted publish) but keeps
// the connection: after Stop and Stopped, no goroutine of the session is
// left, whatever the broker still sends on the connection.
func TestLeakChannelClosedByBroker(t *testing.T) {
	before := testenv.GoroutineIDs()
	proxy, s, b, _ := proxiedSink(t, "ch404", "300000")
	s.put(rec("ch404", 0, 0, "", "v0"))
	s.flush()
	proxy.misroute(testenv.Unique("tc-missing-"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.task.Put(ctx, []connect.SinkRecord{rec("ch404", 0, 1, "", "v1")})
	if err == nil {
		_, err = s.task.Flush(ctx)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("Put/Flush: %v", err)
	}
	s.task.Stop(false)
	if err := s.task.Stopped(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	s.conn.Stop(true)
	if err := s.conn.Stopped(connect.WithHost(ctxT(t), testHost(s.name, -1, s.ledger, nil))); err != nil {
		t.Fatal(err)
	}
	awaitNoNewGoroutines(t, before, b)
}

// A Put stuck in a publish to a broker that blocks the connection is cut
// by Stop; nothing is left after Stopped.
func TestLeakStopWhileBlocked(t *testing.T) {
	before := testenv.GoroutineIDs()
	proxy, s, b, _ := proxiedSink(t, "blk", "300000")
	defer proxy.unblock()
	s.put(rec("blk", 0, 0, "", "v0"))
	s.flush()
	proxy.block("memory alarm")
	body := strings.Repeat("x", 24<<20)
	done := make(chan error, 1)
	go func() { done <- s.task.Put(context.Background(), []connect.SinkRecord{rec("blk", 0, 1, "", body)}) }()
	if !eventually(30*time.Second, publishStuckInWrite) {
		t.Fatal("the publish never got stuck in a write")
	}
	s.task.Stop(false)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Stop did not end a blocked Put")
	}
	if err := s.task.Stopped(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	proxy.unblock()
	s.conn.Stop(true)
	if err := s.conn.Stopped(connect.WithHost(ctxT(t), testHost(s.name, -1, s.ledger, nil))); err != nil {
		t.Fatal(err)
	}
	awaitNoNewGoroutines(t, before, b)
}

// A task whose Start is cut short by the end of its context (the runtime
// cancels it on Stop), wherever that lands, leaves nothing behind once
// Stopped returned.
func TestLeakStopDuringStart(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "sds")
	name := cfg["name"]
	cleanupByName(t, b, name, name+".sds")
	for _, delay := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond} {
		before := testenv.GoroutineIDs()
		task := &Task{}
		ctx, cancel := context.WithCancel(connect.WithHost(ctxT(t), testHost(name, 0, connect.NewMemoryLedger(), &reporter{})))
		started := make(chan error, 1)
		go func() { started <- task.Start(ctx, cfg) }()
		time.Sleep(delay) // where the Stop lands, not a wait for a condition
		task.Stop(false)
		cancel()
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatal("Start still running 20s after Stop")
		}
		if err := task.Stopped(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		awaitNoNewGoroutines(t, before, b)
	}
}
