package pgaudit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// TestIncrementalSnapshotThroughWorkerUnderSteadyWrites: in the real
// worker, a Poll that has records in flight is interrupted for a Commit
// 50 ms after an ack arrives. A chunk longer than that (here: rows whose
// documents are stored out of line, 26 MB per page) must still get
// copied while a steady stream of changes keeps records in flight:
// cut off at every such Poll and redone, it never was.
func TestIncrementalSnapshotThroughWorkerUnderSteadyWrites(t *testing.T) {
	override(t, &snapshotChunkPages, 1) // 136 rows, 26 MB: about 150 ms
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "docs")+` (id int PRIMARY KEY, doc text)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "docs")+` ALTER COLUMN doc SET STORAGE EXTERNAL`)
	mustExec(t, db, `INSERT INTO `+qualified(s, "docs")+` SELECT g, repeat(md5(g::text), 6000) FROM generate_series(1, 400) g`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "hot")+` (id bigserial PRIMARY KEY, n int NOT NULL)`)

	reg, err := plugins.New(Plugin())
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.WithPlugins(reg), worker.WithOffsetStore(worker.NewMemoryOffsetStore()), worker.WithKafka(testenv.KafkaBrokers(t)),
		worker.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Close(context.Background()); err != nil {
			t.Errorf("closing the worker: %v", err)
		}
	}()
	name := testenv.Unique("incr-worker-")
	cfg := baseConfig(name, url, auditSchemaFor(t, db), s+".docs", s+".hot")
	cfg[KeySnapshotMode] = snapshotIncremental
	cfg[KeyColumnExcludeList] = s + ".docs.doc" // small records; the chunks still copy whole rows
	ledger := connect.NewMemoryLedger()
	if err := w.StartConnector(ctx, worker.ConnectorRun{Name: name, Config: cfg, Ledger: ledger, Target: worker.TargetRunning}); err != nil {
		t.Fatal(err)
	}
	tcs, err := w.TaskConfigs(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wctx.Err() == nil {
			_, _ = db.Exec(wctx, `INSERT INTO `+qualified(s, "hot")+` (n) VALUES (1)`)
			time.Sleep(steadyWriterPause)
		}
	}()
	defer func() { cancel(); <-done }()
	var ids []worker.TaskID
	for i, tc := range tcs {
		id := worker.TaskID{Connector: name, Task: i}
		if err := w.StartTask(ctx, worker.TaskRun{ID: id, ConnectorConfig: cfg, TaskConfig: tc, Ledger: ledger, Target: worker.TargetRunning}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	defer func() {
		for id, err := range w.StopTasks(context.Background(), ids, true) {
			if err != nil {
				t.Errorf("task %v: %v", id, err)
			}
		}
		if err := w.StopConnector(context.Background(), name, true); err != nil {
			t.Error(err)
		}
	}()

	progress := qualified(cfg[KeyAuditSchema], objectNames(name).snapshot)
	await(t, 30*time.Second, func() (bool, string, error) {
		var pending, next int64
		err := db.QueryRow(ctx, `SELECT count(*), coalesce(max(next_block), 0) FROM `+progress).Scan(&pending, &next)
		return pending == 0, fmt.Sprintf("the copy of docs (3 chunks of a page) not done within 30 s under a steady stream: %d pages copied", next), err
	})
}
