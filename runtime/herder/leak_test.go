package herder

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// ownedGoroutine reports whether g runs the runtime's code, or is the
// life of a franz-go client (each client has one metadata loop), which
// the worker owns.
func ownedGoroutine(g string) bool {
	return strings.Contains(g, "tidyconnect/tidyconnect/runtime/") ||
		strings.Contains(g, "kgo.(*Client).updateMetadataLoop") ||
		strings.Contains(g, "kgo.(*Client).reapConnectionsLoop")
}

// Close, after connectors ran, failed to delete (a background retry is
// scheduled), were restarted and a boot start blocks, leaves no goroutine of
// the herder, the worker or their Kafka clients behind.
func TestLeakHerderClose(t *testing.T) {
	seeds := testenv.KafkaBrokers(t)
	rec := sampleconn.NewRecorder()
	dir := t.TempDir()
	hs := newHarness(t, kindReal, dir, rec, seeds, WithDeletionRetry(50*time.Millisecond, 100*time.Millisecond))
	t.Cleanup(rec.ReleaseBlocked)
	ctx := testCtx(t)
	before := testenv.GoroutineIDs()

	src, flaky, blocked := testenv.Unique("lk-src-"), testenv.Unique("lk-flaky-"), testenv.Unique("lk-blk-")
	topic := testenv.Unique("lk-topic-")
	hs.dropTopic(topic)
	if _, err := hs.h.CreateConnector(ctx, src, sourceConfig(topic, 2), ""); err != nil {
		t.Fatal(err)
	}
	sink := testenv.Unique("lk-sink-")
	if _, err := hs.h.CreateConnector(ctx, sink, connect.Config{KeyConnectorClass: sampleconn.SinkClass, KeyTopics: topic, worker.KeyOffsetFlushInterval: "50"}, ""); err != nil {
		t.Fatal(err)
	}
	fcfg := sourceConfig(topic, 1)
	fcfg[KeyConnectorClass] = flakyClass
	if _, err := hs.h.CreateConnector(ctx, flaky, fcfg, ""); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(src, 2)
	hs.awaitRunning(sink, 1)
	hs.awaitRunning(flaky, 1)
	pollUntil(t, "records in the sink", func() bool { return len(rec.Sunk(sink)) > 0 })
	if _, err := hs.h.Restart(ctx, src, true, false); err != nil {
		t.Fatal(err)
	}
	failCleanup.Store(true)
	t.Cleanup(func() { failCleanup.Store(false) })
	if err := hs.h.DeleteConnector(ctx, flaky); err == nil {
		t.Fatal("want a failed deletion")
	}
	// Restarted: the connectors start in the background at boot.
	hs.restart()
	hs.awaitRunning(src, 2)
	// A create whose Start blocks until its context ends: Close interrupts it.
	created := make(chan error, 1)
	go func() {
		_, err := hs.h.CreateConnector(context.Background(), blocked, sourceConfig(topic, 1, sampleconn.KeyBlockStart, sampleconn.BlockUntilCtx), "")
		created <- err
	}()
	pollUntil(t, "the blocked Start", func() bool {
		return strings.Contains(strings.Join(rec.CallsOf(sampleconn.ConnectorInstance(blocked)), ","), "Start")
	})
	closeCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := hs.h.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	<-created
	testenv.AwaitNoNewGoroutines(t, before, "Close", 20*time.Second, ownedGoroutine)
}
