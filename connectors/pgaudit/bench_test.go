package pgaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Benchmarks need PostgreSQL (TIDYCONNECT_TEST_POSTGRES_URL) and are
// skipped only without it. Kafka is kfake unless TIDYCONNECT_TEST_KAFKA_BROKERS
// names a real broker. Run:
//
//	go test -run '^$' -bench . -benchtime 1x ./connectors/pgaudit

const benchColumns = `(id int PRIMARY KEY, a int NOT NULL, b text NOT NULL, c numeric(12,2) NOT NULL, d timestamptz NOT NULL)`

const benchRows = 200_000

// benchTables creates an uncaptured and a captured table of identical shape
// and starts a connector (with its task LISTENing, as in production) on the
// captured one.
// extra holds configuration keys to set (capture.order, capture.level).
func benchTables(b *testing.B, db *pgxpool.Pool, url string, extra connect.Config) (plain, captured string, r *running) {
	s := newSchema(b, db)
	plain, captured = qualified(s, "plain"), qualified(s, "captured")
	mustExec(b, db, `CREATE TABLE `+plain+` `+benchColumns)
	mustExec(b, db, `CREATE TABLE `+captured+` `+benchColumns)
	cfg := baseConfig(testenv.Unique("bench-"), url, auditSchemaFor(b, db), s+".captured")
	for k, v := range extra {
		cfg[k] = v
	}
	r = startConnector(b, cfg, connect.NewMemoryLedger())
	b.Cleanup(func() { _ = r.stop(true) })
	return plain, captured, r
}

// benchPartitionedTables is benchTables with both tables partitioned by
// hash of id into 4 partitions: pgaudit captures the partitioned one row
// by row (docs/decisions/0048).
func benchPartitionedTables(b *testing.B, db *pgxpool.Pool, url string) (plain, captured string, r *running) {
	s := newSchema(b, db)
	plain, captured = qualified(s, "plain"), qualified(s, "captured")
	for _, t := range []string{"plain", "captured"} {
		mustExec(b, db, `CREATE TABLE `+qualified(s, t)+` `+benchColumns+` PARTITION BY HASH (id)`)
		for i := range 4 {
			mustExec(b, db, fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES WITH (MODULUS 4, REMAINDER %d)`, qualified(s, fmt.Sprintf("%s_%d", t, i)), qualified(s, t), i))
		}
	}
	r = startConnector(b, baseConfig(testenv.Unique("bench-"), url, auditSchemaFor(b, db), s+".captured"), connect.NewMemoryLedger())
	b.Cleanup(func() { _ = r.stop(true) })
	return plain, captured, r
}

func auditTable(r *running) string {
	return qualified(r.cfg[KeyAuditSchema], objectNames(r.name).table)
}

func timed(b *testing.B, db *pgxpool.Pool, sql string) time.Duration {
	b.Helper()
	start := time.Now()
	mustExec(b, db, sql)
	return time.Since(start)
}

func insertSQL(table string) string {
	return `INSERT INTO ` + table + ` SELECT g, g % 1000, 'name-' || g, g * 1.25, now() FROM generate_series(1, ` + fmt.Sprint(benchRows) + `) g`
}

// BenchmarkWriteOverhead compares the same writes on an uncaptured and a
// captured table, in one run: the ratio is the cost of capture.
func BenchmarkWriteOverhead(b *testing.B) {
	db, url := admin(b)

	// The bulk statements under the defaults (capture.order = commit, whose
	// deferred trigger looks at each audit row at COMMIT), under
	// capture.order = statement, and under capture.level = row, one trigger
	// call and audit row per changed row.
	for _, v := range []struct {
		suffix string
		extra  connect.Config
	}{
		{"", nil},
		{"_statement_order", connect.Config{KeyCaptureOrder: orderStatement}},
		{"_row_level", connect.Config{KeyCaptureLevel: levelRow}},
	} {
		suffix, extra := v.suffix, v.extra
		b.Run("bulk_insert_200k"+suffix, func(b *testing.B) {
			plain, captured, r := benchTables(b, db, url, extra)
			bulkInsertRounds(b, db, plain, captured, auditTable(r))
		})

		b.Run("bulk_update_200k"+suffix, func(b *testing.B) {
			plain, captured, r := benchTables(b, db, url, extra)
			bulkUpdateRounds(b, db, plain, captured, `TRUNCATE `+auditTable(r))
		})
	}

	// capture.method=logical with its slot in place and nobody reading it:
	// what the writers pay (WAL kept, nothing decoded), the measurement of
	// the trigger variants above.
	b.Run("bulk_insert_200k_logical_slot_only", func(b *testing.B) {
		plain, captured, r := benchLogicalTables(b, db, url)
		stopTasks(b, r)
		bulkInsertRounds(b, db, plain, captured, captured)
	})
	b.Run("bulk_update_200k_logical_slot_only", func(b *testing.B) {
		plain, captured, r := benchLogicalTables(b, db, url)
		stopTasks(b, r)
		bulkUpdateRounds(b, db, plain, captured, "")
	})

	// Partitioned tables are captured row by row (docs/decisions/0048).
	b.Run("bulk_insert_200k_partitioned", func(b *testing.B) {
		plain, captured, r := benchPartitionedTables(b, db, url)
		bulkInsertRounds(b, db, plain, captured, auditTable(r))
	})

	// A classic row-level PL/pgSQL audit trigger with to_jsonb per row, for
	// the decision record (docs/decisions/0040): not what pgaudit installs.
	b.Run("bulk_insert_200k_rowlevel_reference", func(b *testing.B) {
		s := newSchema(b, db)
		plain, captured := qualified(s, "plain"), qualified(s, "captured")
		mustExec(b, db, `CREATE TABLE `+plain+` `+benchColumns)
		mustExec(b, db, `CREATE TABLE `+captured+` `+benchColumns)
		mustExec(b, db, `CREATE TABLE `+qualified(s, "log")+` (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, txid xid8 NOT NULL, ts timestamptz NOT NULL DEFAULT now(), schema_name text NOT NULL, table_name text NOT NULL, op "char" NOT NULL, before jsonb, after jsonb)`)
		mustExec(b, db, `CREATE FUNCTION `+qualified(s, "row_audit")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO `+qualified(s, "log")+` (txid, schema_name, table_name, op, after)
  VALUES (pg_current_xact_id(), TG_TABLE_SCHEMA, TG_TABLE_NAME, 'c', to_jsonb(NEW));
  RETURN NULL;
END $$`)
		mustExec(b, db, `CREATE TRIGGER row_audit AFTER INSERT ON `+captured+` FOR EACH ROW EXECUTE FUNCTION `+qualified(s, "row_audit")+`()`)
		bulkInsertRounds(b, db, plain, captured, qualified(s, "log"))
	})

	// "consumed": the task drains the audit table meanwhile (Poll, Commit;
	// no Kafka), so writers that commit while it waits also pay for the
	// NOTIFY, and the database serves the task's reads and deletes.
	// "statement_order": capture.order = statement, with nothing at COMMIT
	// (the default, commit, renumbers rows others drew past; decision 0046).
	// "explicit_tx": each statement inside BEGIN ... COMMIT, as ORMs and
	// pgbench scripts send them (two more round trips per transaction);
	// the others are autocommit statements.
	for _, v := range []struct {
		name     string
		extra    connect.Config
		consumed bool
		explicit bool
	}{
		{"single_row_tx_4_clients", nil, false, false},
		{"single_row_tx_4_clients_consumed", nil, true, false},
		{"single_row_tx_4_clients_statement_order", connect.Config{KeyCaptureOrder: orderStatement}, false, false},
		{"single_row_tx_4_clients_row_level", connect.Config{KeyCaptureLevel: levelRow}, false, false},
		{"single_row_tx_4_clients_row_level_consumed", connect.Config{KeyCaptureLevel: levelRow}, true, false},
		{"single_row_explicit_tx_4_clients", nil, false, true},
		{"single_row_explicit_tx_4_clients_statement_order", connect.Config{KeyCaptureOrder: orderStatement}, false, true},
	} {
		b.Run(v.name, func(b *testing.B) { singleRowOverhead(b, db, url, v.extra, v.consumed, v.explicit) })
	}

	b.Run("single_row_tx_4_clients_partitioned", func(b *testing.B) {
		plain, captured, r := benchPartitionedTables(b, db, url)
		singleRowRounds(b, db, plain, captured, `TRUNCATE `+plain+`, `+captured+`, `+auditTable(r), false)
	})

	// capture.method=logical (docs/decisions/0074). "slot_only": the slot
	// exists and nobody reads it, so the writers pay what they pay (WAL
	// kept, nothing decoded), as in the trigger variants above, which
	// nobody consumes either. "consumed": the task streams and confirms
	// during the captured rounds and is stopped during the plain ones, so
	// the plain table runs with no decoding at all and the captured one
	// pays for decoding the plain round's WAL too: all of logical
	// decoding's cost on the server's CPU, which these 2 vCPUs share with
	// the clients.
	b.Run("single_row_tx_4_clients_logical_slot_only", func(b *testing.B) {
		plain, captured, r := benchLogicalTables(b, db, url)
		stopTasks(b, r)
		singleRowRounds(b, db, plain, captured, `TRUNCATE `+plain+`, `+captured, false)
	})
	b.Run("single_row_tx_4_clients_logical_consumed", func(b *testing.B) {
		plain, captured, r := benchLogicalTables(b, db, url)
		var stopConsuming func()
		prepare := func(capturedNext bool) {
			if stopConsuming != nil {
				stopConsuming()
				stopConsuming = nil
			}
			if !capturedNext {
				return
			}
			r2, err := tryStart(b, r.cfg, r.ledger)
			if err != nil {
				b.Fatal(err)
			}
			stopConsuming = consume(b, r2)
			// Caught up with the plain round's WAL before the clock runs:
			// the captured round pays for decoding its own.
			var flushed pglogrepl.LSN
			if err := db.QueryRow(testCtx(b), `SELECT pg_current_wal_flush_lsn()::text`).Scan(&flushed); err != nil {
				b.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for r2.tasks[0].lg.confirmed.Load() < uint64(flushed) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		stopTasks(b, r)
		singleRowRoundsWith(b, db, plain, captured, `TRUNCATE `+plain+`, `+captured, false, prepare)
		if stopConsuming != nil {
			stopConsuming()
		}
	})

	// The floor of any trigger-based capture on this machine: the same
	// workload against a table whose statement-level triggers (with
	// transition tables, as pgaudit's) call a SECURITY DEFINER PL/pgSQL
	// function, without SET search_path as pgaudit's, that does nothing
	// (docs/decisions/0045). Not what pgaudit installs.
	b.Run("single_row_tx_4_clients_empty_trigger_reference", func(b *testing.B) {
		s := newSchema(b, db)
		plain, captured := qualified(s, "plain"), qualified(s, "captured")
		mustExec(b, db, `CREATE TABLE `+plain+` `+benchColumns)
		mustExec(b, db, `CREATE TABLE `+captured+` `+benchColumns)
		fn := qualified(s, "nothing")
		mustExec(b, db, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$BEGIN RETURN NULL; END$$`)
		mustExec(b, db, `CREATE TRIGGER ins AFTER INSERT ON `+captured+` REFERENCING NEW TABLE AS n FOR EACH STATEMENT EXECUTE FUNCTION `+fn+`()`)
		mustExec(b, db, `CREATE TRIGGER upd AFTER UPDATE ON `+captured+` REFERENCING OLD TABLE AS o NEW TABLE AS n FOR EACH STATEMENT EXECUTE FUNCTION `+fn+`()`)
		singleRowRounds(b, db, plain, captured, `TRUNCATE `+plain+`, `+captured, false)
	})
}

// bulkInsertRounds inserts benchRows rows into plain and captured in turn,
// emptying both and the audit table log before each round, and reports the
// ratio.
func bulkInsertRounds(b *testing.B, db *pgxpool.Pool, plain, captured, log string) {
	var tp, tc time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		mustExec(b, db, `TRUNCATE `+plain+`, `+captured+`, `+log)
		mustExec(b, db, `CHECKPOINT`)
		b.StartTimer()
		// Alternate the order: neither table profits from going second.
		if i%2 == 0 {
			tp += timed(b, db, insertSQL(plain))
			tc += timed(b, db, insertSQL(captured))
		} else {
			tc += timed(b, db, insertSQL(captured))
			tp += timed(b, db, insertSQL(plain))
		}
	}
	report(b, tp, tc)
}

// bulkUpdateRounds updates every row of plain and captured in turn (200k,
// inserted once), running reset (if any), VACUUM and CHECKPOINT before
// each round, and reports the ratio.
func bulkUpdateRounds(b *testing.B, db *pgxpool.Pool, plain, captured, reset string) {
	mustExec(b, db, insertSQL(plain))
	mustExec(b, db, insertSQL(captured))
	var tp, tc time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if reset != "" {
			mustExec(b, db, reset)
		}
		mustExec(b, db, `VACUUM `+plain)
		mustExec(b, db, `VACUUM `+captured)
		mustExec(b, db, `CHECKPOINT`)
		b.StartTimer()
		if i%2 == 0 {
			tp += timed(b, db, `UPDATE `+plain+` SET a = a + 1, b = b || 'x'`)
			tc += timed(b, db, `UPDATE `+captured+` SET a = a + 1, b = b || 'x'`)
		} else {
			tc += timed(b, db, `UPDATE `+captured+` SET a = a + 1, b = b || 'x'`)
			tp += timed(b, db, `UPDATE `+plain+` SET a = a + 1, b = b || 'x'`)
		}
	}
	report(b, tp, tc)
}

// stopTasks stops r's tasks (not a deletion): the slot stays, unread.
func stopTasks(b *testing.B, r *running) {
	for _, task := range r.tasks {
		task.Stop(false)
		_ = task.Stopped(testCtx(b))
	}
	r.tasks = nil
}

// benchLogicalTables is benchTables under capture.method=logical.
func benchLogicalTables(b *testing.B, db *pgxpool.Pool, url string) (plain, captured string, r *running) {
	logicalAdmin(b)
	s := newSchema(b, db)
	plain, captured = qualified(s, "plain"), qualified(s, "captured")
	mustExec(b, db, `CREATE TABLE `+plain+` `+benchColumns)
	mustExec(b, db, `CREATE TABLE `+captured+` `+benchColumns)
	name := testenv.Unique("bench-logical-")
	dropSlotAfter(b, db, name)
	logicalBenchChecks(b)
	r = startConnector(b, logicalConfig(name, url, s+".captured"), connect.NewMemoryLedger())
	b.Cleanup(func() {
		r2, err := tryStart(b, r.cfg, r.ledger)
		if err != nil {
			b.Error(err)
			return
		}
		if err := r2.stop(true); err != nil {
			b.Error(err)
		}
	})
	return plain, captured, r
}

// consume polls and commits r's tasks until the returned function, which
// stops them (not a deletion), is called.
func consume(b *testing.B, r *running) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	wait := pollAndCommit(ctx, b, r.tasks)
	return func() {
		cancel()
		wait()
		if err := r.stop(false); err != nil {
			b.Error(err)
		}
	}
}

// pollAndCommit polls and commits each task, as the worker does, until
// ctx ends; wait waits for that.
func pollAndCommit(ctx context.Context, b *testing.B, tasks []*Task) (wait func()) {
	var wg sync.WaitGroup
	for _, task := range tasks {
		wg.Go(func() {
			for ctx.Err() == nil {
				recs, err := task.Poll(ctx)
				if err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				if err := task.Commit(ctx, recs); err != nil && ctx.Err() == nil {
					b.Error(err)
					return
				}
			}
		})
	}
	return wg.Wait
}

func singleRowOverhead(b *testing.B, db *pgxpool.Pool, url string, extra connect.Config, consumed, explicit bool) {
	plain, captured, r := benchTables(b, db, url, extra)
	if consumed {
		ctx, cancel := context.WithCancel(context.Background())
		wait := pollAndCommit(ctx, b, r.tasks[:1])
		defer func() { cancel(); wait() }()
	}
	singleRowRounds(b, db, plain, captured, `TRUNCATE `+plain+`, `+captured+`, `+auditTable(r), explicit)
}

// singleRowRounds runs 4 clients of single-row transactions (an INSERT,
// then an UPDATE of that row, each its own transaction: an autocommit
// statement, or inside BEGIN ... COMMIT if explicit) against plain and
// captured in turn, truncating before each round, and reports the ratio.
func singleRowRounds(b *testing.B, db *pgxpool.Pool, plain, captured, truncate string, explicit bool) {
	singleRowRoundsWith(b, db, plain, captured, truncate, explicit, nil)
}

// singleRowRoundsWith is singleRowRounds with prepare called, untimed,
// before each table's round.
func singleRowRoundsWith(b *testing.B, db *pgxpool.Pool, plain, captured, truncate string, explicit bool, prepare func(capturedNext bool)) {
	const clients, perClient = 4, 1000
	exec := func(sql string, args ...any) error {
		if !explicit {
			_, err := db.Exec(context.Background(), sql, args...)
			return err
		}
		return pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), sql, args...)
			return err
		})
	}
	run := func(table string, round int) time.Duration {
		if prepare != nil {
			b.StopTimer()
			prepare(table == captured)
			b.StartTimer()
		}
		var wg sync.WaitGroup
		start := time.Now()
		for c := range clients {
			wg.Go(func() {
				for k := range perClient {
					id := ((round*clients+c)*perClient + k)
					if err := exec(`INSERT INTO `+table+` VALUES ($1, $2, $3, $4, now())`, id, id%1000, "name", 1.25); err != nil {
						b.Error(err)
						return
					}
					if err := exec(`UPDATE `+table+` SET a = a + 1 WHERE id = $1`, id); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	var tp, tc time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		mustExec(b, db, truncate)
		b.StartTimer()
		// Alternate the order so neither table profits from a warmer cache.
		if i%2 == 0 {
			tp += run(plain, i)
			tc += run(captured, i)
		} else {
			tc += run(captured, i)
			tp += run(plain, i)
		}
	}
	b.ReportMetric(float64(2*clients*perClient*b.N)/tc.Seconds(), "captured-tx/s")
	report(b, tp, tc)
}

func report(b *testing.B, plain, captured time.Duration) {
	b.ReportMetric(float64(plain.Milliseconds())/float64(b.N), "plain-ms/op")
	b.ReportMetric(float64(captured.Milliseconds())/float64(b.N), "captured-ms/op")
	b.ReportMetric(captured.Seconds()/plain.Seconds(), "x-overhead")
}

// producer mimics the worker's source path: produce a batch, wait for
// acks=all, then Commit the acknowledged records.
func producer(b *testing.B) *kgo.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.KafkaBrokers(b)...), kgo.AllowAutoTopicCreation(), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	return cl
}

func produce(ctx context.Context, cl *kgo.Client, recs []connect.SourceRecord) error {
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		krs[i] = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
	}
	return cl.ProduceSync(ctx, krs...).FirstErr()
}

// BenchmarkCaptureThroughput: one task, audit rows to Kafka records
// acknowledged (kfake) and deleted from the audit table. "sequential" waits
// for each batch's acks before the next Poll; "pipelined" keeps polling
// while earlier batches are in flight and commits them in order, as
// runtime/worker does.
// rows is how many rows a throughput round captures.
const rows = 100_000

func BenchmarkCaptureThroughput(b *testing.B) {
	for _, pipelined := range []bool{false, true} {
		name := "sequential"
		if pipelined {
			name = "pipelined"
		}
		b.Run(name, func(b *testing.B) { captureThroughput(b, pipelined, false) })
		b.Run("logical_"+name, func(b *testing.B) { captureThroughput(b, pipelined, true) })
	}
}

func captureThroughput(b *testing.B, pipelined, logical bool) {
	db, url := admin(b)
	s := newSchema(b, db)
	tbl := qualified(s, "src")
	mustExec(b, db, `CREATE TABLE `+tbl+` `+benchColumns)
	cfg := baseConfig(testenv.Unique("tput-"), url, auditSchemaFor(b, db), s+".src")
	// Each round's changes: the rows and the truncate that follows them.
	// Under logical decoding the truncate before them is a change too
	// (triggers: the audit rows of a truncated table go with it).
	want := rows + 1
	if logical {
		logicalAdmin(b)
		cfg = logicalConfig(testenv.Unique("tput-logical-"), url, s+".src")
		dropSlotAfter(b, db, cfg["name"])
		logicalBenchChecks(b)
		want = rows + 2
	}
	cfg[KeyPollMaxRecords] = "1000"
	r := startConnector(b, cfg, connect.NewMemoryLedger())
	b.Cleanup(func() { _ = r.stop(true) })
	cl := producer(b)
	ctx := context.Background()
	task := r.tasks[0]
	type batch struct {
		recs []connect.SourceRecord
		done chan error
	}
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		mustExec(b, db, `TRUNCATE `+tbl)
		mustExec(b, db, `INSERT INTO `+tbl+` SELECT g, g % 1000, 'name-' || g, g * 1.25, now() FROM generate_series(1, `+fmt.Sprint(rows)+`) g`)
		mustExec(b, db, `TRUNCATE `+tbl) // one more change: the truncate record
		b.StartTimer()
		start := time.Now()
		got := 0
		var queue []batch
		commitFront := func() {
			if err := <-queue[0].done; err != nil {
				b.Fatal(err)
			}
			if err := task.Commit(ctx, queue[0].recs); err != nil {
				b.Fatal(err)
			}
			got += len(queue[0].recs)
			queue = queue[1:]
		}
		for got < want {
			if len(queue) > 0 && (!pipelined || len(queue) >= maxInflightBatches) {
				commitFront()
				continue
			}
			recs, err := task.Poll(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(recs) == 0 {
				if len(queue) > 0 {
					commitFront()
				}
				continue
			}
			bt := batch{recs: recs, done: make(chan error, 1)}
			go func() { bt.done <- produce(ctx, cl, recs) }()
			queue = append(queue, bt)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(want*b.N)/total.Seconds(), "rows/s")
}

// BenchmarkCommitToAckLatency: 1000 single-row transactions per second from
// 4 writers; latency from COMMIT returning to the record acknowledged by
// Kafka.
func BenchmarkCommitToAckLatency(b *testing.B) { commitToAckLatency(b, false) }

// BenchmarkCommitToAckLatencyLogical is BenchmarkCommitToAckLatency under
// capture.method=logical.
func BenchmarkCommitToAckLatencyLogical(b *testing.B) { commitToAckLatency(b, true) }

func commitToAckLatency(b *testing.B, logical bool) {
	db, url := admin(b)
	s := newSchema(b, db)
	tbl := qualified(s, "lat")
	mustExec(b, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, v text)`)
	cfg := baseConfig(testenv.Unique("lat-"), url, auditSchemaFor(b, db), s+".lat")
	if logical {
		logicalAdmin(b)
		cfg = logicalConfig(testenv.Unique("lat-logical-"), url, s+".lat")
		dropSlotAfter(b, db, cfg["name"])
	}
	cfg[KeyPollIntervalMS] = "1000" // latency must come from NOTIFY (or the stream), not polling
	r := startConnector(b, cfg, connect.NewMemoryLedger())
	b.Cleanup(func() { _ = r.stop(true) })
	cl := producer(b)
	task := r.tasks[0]

	const rate, seconds, writers = 1000, 5, 4
	var lat []time.Duration
	for i := 0; i < b.N; i++ {
		mustExec(b, db, `TRUNCATE `+tbl)
		// Drain the truncate record.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for {
			recs, err := task.Poll(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(recs) > 0 {
				_ = task.Commit(ctx, recs)
				break
			}
		}
		cancel()

		var (
			mu        sync.Mutex
			committed = map[int64]time.Time{}
			wg        sync.WaitGroup
		)
		total := rate * seconds
		start := time.Now()
		for w := range writers {
			wg.Go(func() {
				interval := time.Second * writers / rate
				for k := 0; k < total/writers; k++ {
					due := start.Add(time.Duration(k) * interval)
					if d := time.Until(due); d > 0 {
						time.Sleep(d) // pacing the load generator
					}
					id := int64(k*writers + w)
					if _, err := db.Exec(context.Background(), `INSERT INTO `+tbl+` VALUES ($1, 'x')`, id); err != nil {
						b.Error(err)
						return
					}
					now := time.Now()
					mu.Lock()
					committed[id] = now
					mu.Unlock()
				}
			})
		}
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		got := 0
		for got < total {
			recs, err := task.Poll(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if len(recs) == 0 {
				continue
			}
			if err := produce(ctx, cl, recs); err != nil {
				b.Fatal(err)
			}
			acked := time.Now()
			if err := task.Commit(ctx, recs); err != nil {
				b.Fatal(err)
			}
			for _, rec := range recs {
				var k struct{ ID int64 }
				if err := json.Unmarshal(rec.Key, &k); err != nil {
					b.Fatal(err)
				}
				// The writer records its time after Exec returns: wait for it.
				var t0 time.Time
				for {
					mu.Lock()
					t0 = committed[k.ID]
					mu.Unlock()
					if !t0.IsZero() {
						break
					}
					time.Sleep(50 * time.Microsecond)
				}
				lat = append(lat, max(acked.Sub(t0), 0))
			}
			got += len(recs)
		}
		cancel()
		wg.Wait()
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(1.0), "max-ms")
}

// BenchmarkDelete50Tables: deleting a connector that captures 50 tables,
// from Stop(true) until every object is gone.
func BenchmarkDelete50Tables(b *testing.B) { delete50Tables(b, false) }

// BenchmarkDelete50TablesLogical is BenchmarkDelete50Tables under
// capture.method=logical: the slot and the publication.
func BenchmarkDelete50TablesLogical(b *testing.B) { delete50Tables(b, true) }

func delete50Tables(b *testing.B, logical bool) {
	db, url := admin(b)
	if logical {
		logicalAdmin(b)
	}
	s := newSchema(b, db)
	var tables []string
	for i := range 50 {
		name := fmt.Sprintf("t%02d", i)
		mustExec(b, db, `CREATE TABLE `+qualified(s, name)+` (id int PRIMARY KEY, v text)`)
		tables = append(tables, s+"."+name)
	}
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		l := connect.NewMemoryLedger()
		cfg := baseConfig(testenv.Unique("del50-"), url, auditSchemaFor(b, db), tables...)
		if logical {
			cfg = logicalConfig(testenv.Unique("del50-"), url, tables...)
			dropSlotAfter(b, db, cfg["name"])
		}
		r := startConnector(b, cfg, l)
		owned, _ := l.List(context.Background())
		b.StartTimer()
		start := time.Now()
		if err := r.stop(true); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		b.StopTimer()
		for _, res := range owned {
			if ok, err := resourceExists(context.Background(), db, res); err != nil || ok {
				b.Fatalf("%v survived the deletion (%v)", res, err)
			}
		}
		// 4 triggers per table; schema, audit table, wake-up table and
		// its sequence, the statement- and row-level functions, and the
		// commit-order function and its trigger (the default order).
		want := 50*4 + 8
		if logical {
			want = 2
		}
		if len(owned) != want {
			b.Fatalf("owned %d objects, want %d", len(owned), want)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/delete")
}

// logicalBenchChecks gives a logical benchmark the production interval of
// the publication check (tests check at every Poll), so that a Poll costs
// the server no statement, as in production.
func logicalBenchChecks(b *testing.B) {
	was := captureCheckInterval
	captureCheckInterval = 10 * time.Second
	b.Cleanup(func() { captureCheckInterval = was })
}
