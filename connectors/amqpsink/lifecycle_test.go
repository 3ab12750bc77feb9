package amqpsink

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestCleanupHonoursItsContext: a deletion whose broker stalls a delete (the
// owned queue's process suspended) returns when its context ends, naming
// the cut, rather than hang until the broker answers; what is left stays in
// the ledger, and a retry once the broker answers removes it.
func TestCleanupHonoursItsContext(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	rabbitmqctl(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "stall")
	cfg[KeyQueueType] = "classic"
	name := cfg["name"]
	q := name + ".stall"
	cleanupByName(t, b, name, q)
	ledger := connect.NewMemoryLedger()
	s := startSink(t, cfg, ledger, &reporter{})
	s.task.Stop(true)
	if err := s.task.Stopped(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	resume := suspendQueue(t, u, q)

	s.conn.Stop(true)
	ctx, cancel := context.WithTimeout(connect.WithHost(context.Background(), testHost(name, -1, ledger, nil)), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.conn.Stopped(ctx) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "cut short") {
			t.Errorf("Stopped with the queue stalled: %v, want the cut named", err)
		}
	case <-time.After(15 * time.Second):
		resume()
		<-done
		t.Fatal("Stopped still ran 15 s after its 2 s context ended")
	}
	if rs := listLedger(t, ledger); len(rs) == 0 {
		t.Error("the ledger was emptied although the deletion was cut short")
	}
	resume()
	retry := &Connector{}
	h := testHost(name, -1, ledger, nil)
	h.CleanupOnly = true
	rctx := connect.WithHost(ctxT(t), h)
	if err := retry.Start(rctx, cfg); err != nil {
		t.Fatal(err)
	}
	retry.Stop(true)
	if err := retry.Stopped(rctx); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if rs := listLedger(t, ledger); len(rs) != 0 {
		t.Errorf("after the retry the ledger still lists %v", rs)
	}
}
