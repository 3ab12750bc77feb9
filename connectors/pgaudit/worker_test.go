package pgaudit

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// TestThroughWorker runs pgaudit in the real worker: changes reach Kafka
// (kfake) through the worker's produce/ack/Commit path, the audit table is
// purged, and deletion through the worker drops everything.
func TestThroughWorker(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	tbl := qualified(s, "orders")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, total numeric)`)
	brokers := testenv.KafkaBrokers(t)
	reg, err := plugins.New(Plugin())
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.WithPlugins(reg), worker.WithOffsetStore(worker.NewMemoryOffsetStore()), worker.WithKafka(brokers),
		worker.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Close(context.Background()); err != nil {
			t.Errorf("closing the worker: %v", err)
		}
	}()

	name := testenv.Unique("worker-")
	cfg := baseConfig(name, url, auditSchemaFor(t, db), s+".orders")
	ledger := connect.NewMemoryLedger()
	if err := w.StartConnector(ctx, worker.ConnectorRun{Name: name, Config: cfg, Ledger: ledger, Target: worker.TargetRunning}); err != nil {
		t.Fatal(err)
	}
	tcs, err := w.TaskConfigs(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var ids []worker.TaskID
	for i, tc := range tcs {
		id := worker.TaskID{Connector: name, Task: i}
		if err := w.StartTask(ctx, worker.TaskRun{ID: id, ConnectorConfig: cfg, TaskConfig: tc, Ledger: ledger, Target: worker.TargetRunning}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` SELECT g, g * 1.5 FROM generate_series(1, 500) g`)
	mustExec(t, db, `UPDATE `+tbl+` SET total = 0 WHERE id <= 10`)

	topic := "tc." + s + ".orders"
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := 0
	updates := 0
	for got < 510 {
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		fs := cl.PollFetches(fctx)
		cancel()
		if err := fs.Err(); err != nil {
			t.Fatalf("consuming %s after %d records: %v", topic, got, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			got++
			var env struct{ Op string }
			if err := json.Unmarshal(r.Value, &env); err != nil {
				t.Errorf("value %s: %v", r.Value, err)
			}
			if env.Op == "u" {
				updates++
			}
		})
	}
	if updates != 10 {
		t.Errorf("%d updates in Kafka, want 10", updates)
	}
	// Acknowledged rows leave the audit table.
	audit := qualified(cfg[KeyAuditSchema], objectNames(name).table)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+audit).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d acknowledged rows still in the audit table", left)
		}
		time.Sleep(20 * time.Millisecond)
	}

	for id, err := range w.StopTasks(ctx, ids, true) {
		if err != nil {
			t.Errorf("task %v: %v", id, err)
		}
	}
	if err := w.StopConnector(ctx, name, true); err != nil {
		t.Fatal(err)
	}
	if rs, _ := ledger.List(ctx); len(rs) != 0 {
		t.Errorf("ledger lists %v after deletion through the worker", rs)
	}
	if relExists(t, db, cfg[KeyAuditSchema], objectNames(name).table) || triggerCount(t, db, s, "orders") != 0 {
		t.Error("objects survived deletion through the worker")
	}
	awaitNoConnections(t, db, name)
}
