package amqpsink

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func owns(t testing.TB, l connect.Ledger, kind, name string) bool {
	t.Helper()
	rs, err := l.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Kind == kind && r.Name == name {
			return true
		}
	}
	return false
}

// Two connectors started at the same moment with the same exchange and queue
// names: exactly one owns each object, deleting the other leaves it, and
// deleting the owner drops it.
func TestConcurrentConnectorsOwnEachObjectOnce(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	const iterations = 20
	for i := 0; i < iterations; i++ {
		shared := testenv.Unique("tc-race-")
		queue := shared + ".t"
		cleanupByName(t, b, shared, queue)
		var cfgs [2]connect.Config
		var ledgers [2]*connect.MemoryLedger
		var conns [2]*Connector
		var ctxs [2]context.Context
		for j := range cfgs {
			cfgs[j] = baseConfig(t, u, "t")
			cfgs[j][KeyExchange] = shared
			cfgs[j][KeyQueue] = shared + ".${topic}"
			cfgs[j][KeyQueueType] = "classic"
			ledgers[j] = connect.NewMemoryLedger()
			conns[j] = &Connector{}
			ctxs[j] = connect.WithHost(ctxT(t), testHost(cfgs[j]["name"], -1, ledgers[j], nil))
		}
		var wg sync.WaitGroup
		var errs [2]error
		start := make(chan struct{})
		for j := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[j] = conns[j].Start(ctxs[j], cfgs[j])
			}()
		}
		close(start)
		wg.Wait()
		for j, err := range errs {
			if err != nil {
				t.Fatalf("iteration %d: connector %d Start: %v", i, j, err)
			}
		}
		exOwner, qOwner := -1, -1
		for j, l := range ledgers {
			if owns(t, l, KindExchange, shared) {
				if exOwner >= 0 {
					t.Fatalf("iteration %d: both connectors own exchange %s", i, shared)
				}
				exOwner = j
			}
			if owns(t, l, KindQueue, queue) {
				if qOwner >= 0 {
					t.Fatalf("iteration %d: both connectors own queue %s", i, queue)
				}
				qOwner = j
			}
		}
		if exOwner < 0 || qOwner < 0 {
			t.Fatalf("iteration %d: no owner: exchange owner %d, queue owner %d", i, exOwner, qOwner)
		}
		// Delete connector 0, then connector 1.
		for j := range conns {
			conns[j].Stop(true)
			if err := conns[j].Stopped(ctxs[j]); err != nil {
				t.Fatalf("iteration %d: deleting connector %d: %v", i, j, err)
			}
			if want := exOwner > j; b.exchangeExists(shared) != want {
				t.Fatalf("iteration %d: after deleting connector %d (exchange owner %d): exchange exists=%v, want %v", i, j, exOwner, !want, want)
			}
			if want := qOwner > j; b.queueExists(queue) != want {
				t.Fatalf("iteration %d: after deleting connector %d (queue owner %d): queue exists=%v, want %v", i, j, qOwner, !want, want)
			}
		}
	}
	if b.queueExists(ProvisionLockQueue) {
		t.Errorf("the provisioning lock queue %s was left behind", ProvisionLockQueue)
	}
}

func testTopology(t testing.TB, cfg connect.Config, l connect.Ledger) *topology {
	t.Helper()
	s, err := parse(cfg, cfg["name"])
	if err != nil {
		t.Fatal(err)
	}
	conn, err := dial(ctxT(t), s, ConnectionName(s.connector, -1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &topology{s: s, conn: conn, ledger: l, log: testHost(s.connector, -1, l, nil).Logger}
}

// A declare the broker refuses (403 ACCESS_REFUSED for an amq. queue name)
// after Own leaves no ledger entry: the object was never created.
func TestRefusedDeclareLeavesNoLedgerEntry(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "t")
	ledger := connect.NewMemoryLedger()
	tp := testTopology(t, cfg, ledger)
	q := "amq." + cfg["name"]
	err := tp.ensureQueue(ctxT(t), q)
	if amqpCode(err) != amqp.AccessRefused {
		t.Fatalf("ensureQueue(%q) = %v, want ACCESS_REFUSED", q, err)
	}
	if rs := listLedger(t, ledger); len(rs) != 0 {
		t.Fatalf("a refused declare left ledger entries %v", rs)
	}
	if b.queueExists(q) {
		t.Fatalf("queue %s exists", q)
	}
	if b.queueExists(ProvisionLockQueue) {
		t.Errorf("the provisioning lock was not released after a failed declare")
	}
}

// While another connection holds the provisioning lock, creating waits
// (bounded by ctx) and creates nothing; once the lock is free it proceeds.
func TestProvisionWaitsForTheLock(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "t")
	name := cfg["name"]
	cleanupByName(t, b, name)
	ledger := connect.NewMemoryLedger()
	tp := testTopology(t, cfg, ledger)

	holder, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	ch, err := holder.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(ProvisionLockQueue, false, true, true, false, nil); err != nil {
		t.Fatalf("taking the lock: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	err = tp.ensureExchange(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), ProvisionLockQueue) {
		t.Fatalf("ensureExchange while the lock is held = %v, want a lock timeout", err)
	}
	if b.exchangeExists(name) || owns(t, ledger, KindExchange, name) {
		t.Fatal("the exchange was created or owned without the lock")
	}

	done := make(chan error, 1)
	go func() { done <- tp.ensureExchange(ctxT(t)) }()
	// A wait for something not to happen: ensureExchange must not return
	// while the lock is held, and nothing marks "still waiting", so it gets
	// 300 ms to return wrongly (a pass is no proof, a return is a failure).
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("ensureExchange returned while the lock was held: %v", err)
	default:
	}
	if err := holder.Close(); err != nil { // frees the exclusive queue
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ensureExchange after the lock was freed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ensureExchange still waiting 10s after the lock was freed")
	}
	if !b.exchangeExists(name) || !owns(t, ledger, KindExchange, name) {
		t.Fatal("the exchange was not created and owned after the lock was freed")
	}
}
