package pgaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestCommitOrderConcurrentWritersKeepDependencyOrder: under capture.order
// = commit, writers commit concurrently while the task polls and
// acknowledges late (batches stay in flight, so reads go around them).
// Counter writers serialize through one counter row: each transaction
// takes the next counter value, at its first statement or after writing
// (single rows, a bulk statement of 100 rows that is grouped, an update of
// a shared row). They depend on each other in counter order, so all their
// changes must leave in that order, whatever order their statements ran
// in. Independent writers update the same shared rows and rows of their
// own. Midway the connector restarts with batches unacknowledged.
// Checked: every change delivered, and again only if it was unacknowledged
// at the restart (each of those again); in first deliveries, every row's
// changes in the order they were made (each update adds one to v), each
// writer's transactions in the order it ran them, counter transactions in
// counter order and not interleaved.
func TestCommitOrderConcurrentWritersKeepDependencyOrder(t *testing.T) {
	for _, level := range []string{levelStatement, levelRow} {
		t.Run(level, func(t *testing.T) { concurrentWritersKeepDependencyOrder(t, level) })
	}
}

func concurrentWritersKeepDependencyOrder(t *testing.T, level string) {
	const (
		counterWriters, counterTx = 3, 40
		freeWriters, freeTx       = 2, 60
		shared                    = 5
		bulkRows                  = 100 // over singleChanges: grouped under statement
	)
	db, url := admin(t)
	s := newSchema(t, db)
	counter, items, log, own := qualified(s, "counter"), qualified(s, "items"), qualified(s, "log"), qualified(s, "own")
	mustExec(t, db, `CREATE TABLE `+counter+` (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, db, `INSERT INTO `+counter+` VALUES (1, 0)`)
	mustExec(t, db, `CREATE TABLE `+items+` (id int PRIMARY KEY, v int NOT NULL)`)
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, 0 FROM generate_series(1, %d) g`, items, shared))
	mustExec(t, db, `CREATE TABLE `+log+` (id int PRIMARY KEY, v int NOT NULL, ctr int)`)
	mustExec(t, db, `CREATE TABLE `+own+` (id int PRIMARY KEY, v int NOT NULL, w int NOT NULL, k int NOT NULL)`)
	cfg := commitOrder(baseConfig(testenv.Unique("depord-"), url, auditSchemaFor(t, db), s+".counter", s+".items", s+".log", s+".own"))
	cfg[KeyCaptureLevel] = level
	l := connect.NewMemoryLedger()
	r := startConnector(t, cfg, l)
	t.Cleanup(func() { // the instance running at the end
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	})
	task := r.tasks[0]

	var written atomic.Int64 // changes the writers made
	var wg sync.WaitGroup
	errs := make(chan error, counterWriters+freeWriters)
	run := func(f func(ctx context.Context, tx pgx.Tx) error) error {
		return pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error { return f(context.Background(), tx) })
	}
	exec := func(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
		tag, err := tx.Exec(ctx, sql, args...)
		written.Add(tag.RowsAffected())
		return err
	}
	for w := range counterWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 46))
			for k := range counterTx {
				base := (w*counterTx + k) * 1000
				err := run(func(ctx context.Context, tx pgx.Tx) error {
					// Writing first, then taking the counter: the row is
					// written before the previous counter transaction
					// committed, and must still leave after it.
					late := rng.IntN(2) == 0
					if late {
						if err := exec(ctx, tx, `INSERT INTO `+log+` VALUES ($1, 0, NULL)`, base); err != nil {
							return err
						}
					}
					var c int
					if err := tx.QueryRow(ctx, `UPDATE `+counter+` SET n = n + 1 WHERE id = 1 RETURNING n`).Scan(&c); err != nil {
						return err
					}
					written.Add(1)
					if late {
						if err := exec(ctx, tx, `UPDATE `+log+` SET v = v + 1, ctr = $2 WHERE id = $1`, base, c); err != nil {
							return err
						}
					}
					if rng.IntN(3) == 0 {
						if err := exec(ctx, tx, fmt.Sprintf(`INSERT INTO %s SELECT $1::int + g, 0, $2 FROM generate_series(1, %d) g`, log, bulkRows), base, c); err != nil {
							return err
						}
					}
					return exec(ctx, tx, `UPDATE `+items+` SET v = v + 1 WHERE id = $1`, 1+rng.IntN(shared))
				})
				if err != nil {
					errs <- fmt.Errorf("counter writer %d: %w", w, err)
					return
				}
			}
		}()
	}
	for w := range freeWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 4646))
			mine := 10_000_000 * (w + 1)
			if _, err := db.Exec(context.Background(), `INSERT INTO `+own+` VALUES ($1, 0, $2, 0)`, mine, w); err != nil {
				errs <- err
				return
			}
			written.Add(1)
			for k := 1; k <= freeTx; k++ {
				err := run(func(ctx context.Context, tx pgx.Tx) error {
					if err := exec(ctx, tx, `UPDATE `+own+` SET v = v + 1, k = $2 WHERE id = $1`, mine, k); err != nil {
						return err
					}
					if rng.IntN(4) == 0 {
						if err := exec(ctx, tx, fmt.Sprintf(`INSERT INTO %s SELECT $1::int + $3::int * 1000 + g, 0, $2, $3 FROM generate_series(1, %d) g`, own, bulkRows), mine, w, k); err != nil {
							return err
						}
					}
					return exec(ctx, tx, `UPDATE `+items+` SET v = v + 1 WHERE id = $1`, 1+rng.IntN(shared))
				})
				if err != nil {
					errs <- fmt.Errorf("independent writer %d: %w", w, err)
					return
				}
			}
		}()
	}
	t.Cleanup(wg.Wait) // a failed check returns before the writers end
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()

	// The consumer: polls while the writers run and acknowledges each
	// batch only two batches later. Once, it restarts the connector with
	// those batches unacknowledged: they must come again (at-least-once),
	// and nothing else may.
	var got []change // first deliveries
	var unacked [][]connect.SourceRecord
	seen := map[int64]bool{}
	var again map[int64]bool // unacknowledged at the restart: true once delivered again
	restart := func() {
		again = map[int64]bool{}
		for _, b := range unacked {
			for _, rec := range b {
				again[decode(t, rec).Source.Seq] = false
			}
		}
		unacked = nil
		if err := r.stop(false); err != nil {
			t.Fatal(err)
		}
		r = startConnector(t, cfg, l)
		task = r.tasks[0]
	}
	ack := func() {
		if err := task.Commit(context.Background(), unacked[0]); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		unacked = unacked[1:]
	}
	poll := func() int {
		if again == nil && len(got) > 2000 && len(unacked) > 0 {
			restart()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		recs, err := task.Poll(ctx)
		ended := ctx.Err() != nil
		cancel()
		if err != nil && !ended {
			t.Fatalf("Poll: %v", err)
		}
		for _, rec := range recs {
			c := decode(t, rec)
			switch done, ok := again[c.Source.Seq]; {
			case !seen[c.Source.Seq]:
				seen[c.Source.Seq] = true
				got = append(got, c)
			case ok && !done:
				again[c.Source.Seq] = true
			default:
				t.Fatalf("change seq %d (%s %v) delivered twice", c.Source.Seq, c.Source.Table, c.Key)
			}
		}
		if len(recs) > 0 {
			unacked = append(unacked, recs)
			if len(unacked) > 2 {
				ack()
			}
		}
		return len(recs)
	}
	deadline := time.Now().Add(60 * time.Second)
writing:
	for {
		select {
		case <-writersDone:
			break writing
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the writers did not finish in time")
		}
		poll()
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	redelivered := func() int {
		n := 0
		for _, done := range again {
			if done {
				n++
			}
		}
		return n
	}
	for int64(len(got)) < written.Load() || redelivered() < len(again) {
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d changes, %d of %d unacknowledged ones again, before the deadline", len(got), written.Load(), redelivered(), len(again))
		}
		if poll() == 0 {
			for len(unacked) > 0 {
				ack()
			}
		}
	}
	for len(unacked) > 0 {
		ack()
	}
	r.quiet()
	if int64(len(got)) != written.Load() {
		t.Fatalf("received %d changes, the writers made %d", len(got), written.Load())
	}
	if again == nil || len(again) == 0 {
		t.Fatal("the connector was not restarted with changes unacknowledged")
	}
	t.Logf("%d changes, %d unacknowledged at the restart and delivered again", len(got), len(again))

	num := func(v any) int64 {
		n, _ := v.(json.Number).Int64()
		return n
	}
	ctrOf := map[uint64]int64{} // counter transactions' counter values, by txid
	for _, c := range got {
		if c.Source.Table == "counter" {
			ctrOf[c.Source.TxID] = num(c.After["n"])
		}
	}
	if len(ctrOf) != counterWriters*counterTx {
		t.Fatalf("%d counter transactions delivered, want %d", len(ctrOf), counterWriters*counterTx)
	}
	lastV := map[string]int64{}       // by table and key: the row's last v
	lastK := map[int64]int64{}        // by independent writer: its last transaction
	lastCtr, lastCtrAt := int64(0), 0 // the last counter transaction seen, and where
	for i, c := range got {
		row := c.Source.Table + " " + fmt.Sprint(c.Key["id"])
		if c.Op != "c" && c.Op != "u" {
			t.Fatalf("change %d: op %s", i, c.Op)
		}
		col := "v"
		if c.Source.Table == "counter" {
			col = "n"
		}
		// items and counter start at 0 with no change delivered; log and
		// own rows are created (v = 0) under capture.
		v, ok := lastV[row]
		switch {
		case c.Op == "c" && (ok || num(c.After[col]) != 0):
			t.Fatalf("change %d: %s created again, or with %s=%v", i, row, col, c.After[col])
		case c.Op == "u" && (!ok && c.Source.Table != "items" && c.Source.Table != "counter" || num(c.After[col]) != v+1):
			t.Fatalf("change %d of %s: %s=%v after %d (seen %v): per-row order broken", i, row, col, c.After[col], v, ok)
		}
		lastV[row] = num(c.After[col])
		if c.Source.Table == "own" && c.Op == "u" {
			w := num(c.After["w"])
			if k := num(c.After["k"]); k != lastK[w]+1 {
				t.Fatalf("change %d: writer %d's transaction %d after its transaction %d", i, w, k, lastK[w])
			}
			lastK[w] = num(c.After["k"])
		}
		if ctr, ok := ctrOf[c.Source.TxID]; ok {
			switch {
			case ctr == lastCtr:
			case ctr == lastCtr+1:
				lastCtr, lastCtrAt = ctr, i
			default:
				t.Fatalf("change %d (%s %s) of the transaction with counter %d after one of counter %d (change %d): dependency order broken", i, c.Source.Table, c.Op, ctr, lastCtr, lastCtrAt)
			}
		}
	}
	var final int64
	if err := db.QueryRow(testCtx(t), `SELECT sum(v) FROM `+items).Scan(&final); err != nil {
		t.Fatal(err)
	}
	var replayed int64
	for i := 1; i <= shared; i++ {
		replayed += lastV[fmt.Sprintf("items %d", i)]
	}
	if final != counterWriters*counterTx+freeWriters*freeTx || replayed != final {
		t.Fatalf("shared rows: replayed sum %d, table %d, want %d", replayed, final, counterWriters*counterTx+freeWriters*freeTx)
	}
}
