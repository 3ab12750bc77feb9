package pgaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
)

// TestReconfiguredUnderLoad drives pgaudit through REST, the herder, the
// worker and Kafka while writers never stop, and compares what PostgreSQL
// committed with what the topics hold: tasks.max up and down (tables move
// between tasks), a reordered table list, poll.max.records, both
// capture.level and capture.order switches, pause/resume, STOPPED with
// PATCH/DELETE offsets and a topic.prefix change, and restarts with their
// tasks must lose no change and never deliver one of a row before an
// earlier one it had not delivered yet (a replay is at-least-once, a
// first delivery out of order is not). Then DELETE while the writers go
// on leaves no trigger, audit table or connection and fails no writer,
// and the name can be used again at once.
func TestReconfiguredUnderLoad(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	s := newSchema(t, db)
	tables := []string{"a", "b", "c"}
	for _, tb := range tables {
		mustExec(t, db, `CREATE TABLE `+qualified(s, tb)+` (id int PRIMARY KEY, v int NOT NULL)`)
		mustExec(t, db, `INSERT INTO `+qualified(s, tb)+` SELECT g, 0 FROM generate_series(1, 70) g`)
	}
	st := newStack(t)
	audit := auditSchemaFor(t, db)
	name := testenv.Unique("reconf-")
	cfg := baseConfig(name, url, audit, s+".a", s+".b", s+".c")
	cfg[KeyTopicPrefix] = "rc1"
	cons := consumeRows(t, st.seeds, `^rc[0-9]\.`+s+`\.`)
	if code, body := st.call("POST", "/connectors", map[string]any{"name": name, "config": cfg}); code != http.StatusCreated {
		t.Fatalf("POST /connectors = %d %s", code, body)
	}
	st.awaitTasks(name, 1)
	w := writeRows(t, db, s, tables, 70)

	put := func(what string, tasks int, edit func()) {
		t.Helper()
		time.Sleep(700 * time.Millisecond)
		edit()
		if code, body := st.call("PUT", "/connectors/"+name+"/config", cfg); code != http.StatusOK {
			t.Fatalf("%s: PUT config = %d %s", what, code, body)
		}
		st.awaitTasks(name, tasks)
	}
	put("tasks.max 3", 3, func() { cfg[KeyTasksMax] = "3" })
	put("tasks.max 2, reordered", 2, func() { cfg[KeyTasksMax] = "2"; cfg[KeyTables] = s + ".c," + s + ".a," + s + ".b" })
	put("poll.max.records 7", 2, func() { cfg[KeyPollMaxRecords] = "7" })
	put("capture.level row", 2, func() { cfg[KeyCaptureLevel] = levelRow })
	put("capture.order commit", 2, func() { cfg[KeyCaptureOrder] = orderCommit })
	put("both back, tasks.max 1", 1, func() {
		cfg[KeyCaptureLevel], cfg[KeyCaptureOrder], cfg[KeyTasksMax] = levelStatement, orderStatement, "1"
	})
	for _, p := range []string{"pause", "resume"} {
		time.Sleep(500 * time.Millisecond)
		if code, body := st.call("PUT", "/connectors/"+name+"/"+p, nil); code != http.StatusAccepted {
			t.Fatalf("%s = %d %s", p, code, body)
		}
	}
	st.awaitTasks(name, 1)
	time.Sleep(500 * time.Millisecond)
	if code, body := st.call("PUT", "/connectors/"+name+"/stop", nil); code != http.StatusNoContent {
		t.Fatalf("stop = %d %s", code, body)
	}
	time.Sleep(500 * time.Millisecond) // changes wait in the audit table
	// pgaudit reads no offsets: altering or resetting them changes nothing.
	code, body := st.call("PATCH", "/connectors/"+name+"/offsets", map[string]any{"offsets": []any{map[string]any{
		"partition": map[string]any{"schema": s, "table": "a"}, "offset": map[string]any{"id": 1, "idx": 0, "txid": "1"}}}})
	if code != http.StatusOK || !strings.Contains(body, "manages offsets externally") {
		t.Errorf("PATCH offsets = %d %s", code, body)
	}
	if code, body := st.call("DELETE", "/connectors/"+name+"/offsets", nil); code != http.StatusOK || !strings.Contains(body, "manages offsets externally") {
		t.Errorf("DELETE offsets = %d %s", code, body)
	}
	// The waiting changes go to the new prefix's topics.
	cfg[KeyTopicPrefix], cfg[KeyTasksMax] = "rc2", "2"
	if code, body := st.call("PUT", "/connectors/"+name+"/config", cfg); code != http.StatusOK {
		t.Fatalf("PUT config while stopped = %d %s", code, body)
	}
	if code, body := st.call("PUT", "/connectors/"+name+"/resume", nil); code != http.StatusAccepted {
		t.Fatalf("resume = %d %s", code, body)
	}
	st.awaitTasks(name, 2)
	time.Sleep(500 * time.Millisecond)
	if code, body := st.call("POST", "/connectors/"+name+"/restart?includeTasks=true", nil); code != http.StatusAccepted {
		t.Fatalf("restart = %d %s", code, body)
	}
	time.Sleep(300 * time.Millisecond)
	st.awaitTasks(name, 2)
	time.Sleep(500 * time.Millisecond)

	// Everything committed so far reaches Kafka while the writers go on.
	cons.await(t, w.snapshot(), nil)
	if n := cons.topics(); n["rc2."+s+".a"] == 0 || n["rc1."+s+".a"] == 0 {
		t.Errorf("records per topic %v: want both prefixes", n)
	}

	// DELETE while the writers write (what waits then is dropped with the
	// audit table).
	if code, body := st.call("DELETE", "/connectors/"+name, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", code, body)
	}
	for _, tb := range tables {
		if n := triggerCount(t, db, s, tb); n != 0 {
			t.Errorf("after DELETE: %d triggers on %s", n, tb)
		}
	}
	if relExists(t, db, audit, objectNames(name).table) {
		t.Error("after DELETE: the audit table is left")
	}
	if n, err := connections(ctx, db, name); err != nil || n != 0 {
		t.Errorf("after DELETE: %d connections named for the connector (%v)", n, err)
	}

	// The name again, at once, while the writers go on.
	if code, body := st.call("POST", "/connectors", map[string]any{"name": name, "config": cfg}); code != http.StatusCreated {
		t.Fatalf("POST /connectors again = %d %s", code, body)
	}
	st.awaitTasks(name, 2)
	from := w.snapshot()
	time.Sleep(700 * time.Millisecond)
	w.halt()
	if n := w.errs.Load(); n != 0 {
		t.Errorf("%d writes failed, the last: %v", n, w.lastErr.Load())
	}
	upTo := w.snapshot()
	progressed := false
	for k, v := range upTo {
		progressed = progressed || v > from[k]
	}
	if !progressed {
		t.Fatal("no write committed after the name was used again: the last check would compare nothing")
	}
	cons.await(t, upTo, from)
	if code, body := st.call("DELETE", "/connectors/"+name, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", code, body)
	}
	awaitNoConnections(t, db, name)
}

// awaitTasks waits for the connector and exactly n tasks to be RUNNING.
func (s *stack) awaitTasks(name string, n int) {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, body := s.call("GET", "/connectors/"+name+"/status", nil)
		var st struct {
			Connector struct{ State string }
			Tasks     []struct{ State string }
		}
		_ = json.Unmarshal([]byte(body), &st)
		ok := st.Connector.State == "RUNNING" && len(st.Tasks) == n
		for _, ts := range st.Tasks {
			ok = ok && ts.State == "RUNNING"
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("connector not RUNNING with %d tasks: %s", n, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rowWriters update rows of the tables, each in its own transaction, some
// one row at a time and some all at once (grouped audit rows), and
// remember each row's last committed value of v.
type rowWriters struct {
	mu        sync.Mutex
	committed map[string]int // "table/id": last committed v
	errs      atomic.Int64
	lastErr   atomic.Value
	stop      chan struct{}
	wg        sync.WaitGroup
}

func writeRows(t *testing.T, db *pgxpool.Pool, schema string, tables []string, rows int) *rowWriters {
	w := &rowWriters{committed: map[string]int{}, stop: make(chan struct{})}
	for i, tb := range tables {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-w.stop:
					return
				default:
				}
				q := `UPDATE ` + qualified(schema, tb) + ` SET v = v + 1`
				if n%10 != 9 {
					q += fmt.Sprintf(` WHERE id = %d`, 1+(n*7+i)%rows)
				}
				if err := w.update(db, tb, q+` RETURNING id, v`); err != nil {
					w.errs.Add(1)
					w.lastErr.Store(err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	t.Cleanup(w.halt)
	return w
}

func (w *rowWriters) update(db *pgxpool.Pool, table, q string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := db.Query(ctx, q)
	if err != nil {
		return err
	}
	got := map[string]int{}
	for rows.Next() {
		var id, v int
		if err := rows.Scan(&id, &v); err != nil {
			rows.Close()
			return err
		}
		got[fmt.Sprintf("%s/%d", table, id)] = v
	}
	if err := rows.Err(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, v := range got {
		w.committed[k] = v
	}
	return nil
}

func (w *rowWriters) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

func (w *rowWriters) snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := make(map[string]int, len(w.committed))
	for k, v := range w.committed {
		m[k] = v
	}
	return m
}

// rowConsumer reads the connector's topics from the start and keeps, per
// row, the values of v in the order Kafka holds them (one partition per
// topic; a row's records share a key).
type rowConsumer struct {
	mu      sync.Mutex
	seen    map[string][]int
	byTopic map[string]int
}

func consumeRows(t *testing.T, seeds []string, topics string) *rowConsumer {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeRegex(), kgo.ConsumeTopics(topics),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(200*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c := &rowConsumer{seen: map[string][]int{}, byTopic: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				var env struct {
					After  struct{ ID, V int }
					Source struct{ Table string }
				}
				if err := json.Unmarshal(r.Value, &env); err != nil {
					t.Errorf("record %s: %v", r.Value, err)
					return
				}
				c.mu.Lock()
				k := fmt.Sprintf("%s/%d", env.Source.Table, env.After.ID)
				c.seen[k] = append(c.seen[k], env.After.V)
				c.byTopic[r.Topic]++
				c.mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return c
}

func (c *rowConsumer) topics() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.byTopic))
	for k, v := range c.byTopic {
		m[k] = v
	}
	return m
}

// await waits until every value after from (nil: from 0) up to upTo of
// every row is in Kafka, then fails on a value first delivered after a
// higher one: a change overtaken by a later change of its row.
func (c *rowConsumer) await(t *testing.T, upTo, from map[string]int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var missing []string
		c.mu.Lock()
		for k, last := range upTo {
			got := map[int]bool{}
			for _, v := range c.seen[k] {
				got[v] = true
			}
			for v := from[k] + 1; v <= last; v++ {
				if !got[v] {
					missing = append(missing, fmt.Sprintf("%s v=%d", k, v))
				}
			}
		}
		c.mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d committed changes not in Kafka, e.g. %v", len(missing), missing[:min(len(missing), 10)])
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, vs := range c.seen {
		seen, high := map[int]bool{}, 0
		for _, v := range vs {
			if !seen[v] && v < high {
				t.Errorf("row %s: v=%d first delivered after v=%d: %v", k, v, high, vs)
				break
			}
			seen[v], high = true, max(high, v)
		}
	}
}
