package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaNames collects, per topic, the "after"/"before" names of the
// changes on the topics under prefix, from the start of each topic.
type kafkaNames struct {
	mu    sync.Mutex
	names map[string]map[string]int // topic -> name -> times seen
	raw   map[string][]string
}

func consumeKafka(t *testing.T, brokers []string, prefix string) *kafkaNames {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeRegex(), kgo.ConsumeTopics("^"+strings.ReplaceAll(prefix, ".", `\.`)+`\..*`),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(200*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	k := &kafkaNames{names: map[string]map[string]int{}, raw: map[string][]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				var m change
				name := "?"
				if r.Value == nil {
					name = "<tombstone>"
				} else if json.Unmarshal(r.Value, &m) == nil {
					name = m.name()
				}
				k.mu.Lock()
				if k.names[r.Topic] == nil {
					k.names[r.Topic] = map[string]int{}
				}
				k.names[r.Topic][name]++
				k.raw[r.Topic] = append(k.raw[r.Topic], string(r.Value))
				k.mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return k
}

func (k *kafkaNames) count(topic, name string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.names[topic][name]
}

// await waits until every name was seen on topic.
func (k *kafkaNames) await(t *testing.T, topic string, names []string, within time.Duration) {
	t.Helper()
	if !eventually(within, func() bool {
		for _, n := range names {
			if k.count(topic, n) == 0 {
				return false
			}
		}
		return true
	}) {
		var missing []string
		for _, n := range names {
			if k.count(topic, n) == 0 {
				missing = append(missing, n)
			}
		}
		t.Fatalf("on %s, not delivered within %s: %v", topic, within, missing)
	}
}

func (c *chain) insertCustomers(phase string, n int) []string {
	c.t.Helper()
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s-%d", phase, i)
		c.exec("INSERT INTO "+c.table("customers")+" (name, email) VALUES ($1, $2)", name, name+"@"+c.id+".example")
		names = append(names, name)
	}
	return names
}

func (c *chain) logicalSrcConfig(pgURL string) map[string]string {
	src := c.srcConfig()
	src["capture.method"] = "logical"
	src["postgres.url"] = pgURL
	delete(src, "audit.schema")
	return src
}

func (c *chain) slotLeft(slot string) (slots, pubs int) {
	c.t.Helper()
	if err := c.pg.QueryRow(c.ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
       (SELECT count(*) FROM pg_publication WHERE pubname = $1)`, slot).Scan(&slots, &pubs); err != nil {
		c.t.Fatal(err)
	}
	return slots, pubs
}

func (c *chain) dropSlotAtEnd() {
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		like := "tidyconnect_it_src_" + strings.ReplaceAll(c.id, "-", "_") + "%"
		_, _ = c.pg.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name LIKE $1 AND active_pid IS NOT NULL`, like)
		time.Sleep(500 * time.Millisecond)
		_, _ = c.pg.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE $1 AND NOT active`, like)
		rows, err := c.pg.Query(ctx, `SELECT pubname FROM pg_publication WHERE pubname LIKE $1`, like)
		if err == nil {
			var pubs []string
			for rows.Next() {
				var p string
				_ = rows.Scan(&p)
				pubs = append(pubs, p)
			}
			rows.Close()
			for _, p := range pubs {
				_, _ = c.pg.Exec(ctx, `DROP PUBLICATION IF EXISTS "`+p+`"`)
			}
		}
	})
}

// TestLogicalLifecycle drives capture.method=logical through the
// binary: pause/resume, STOPPED and resume, restart with includeTasks, a
// PUT of the config GET returned, validation of it, a worker restart
// (SIGTERM, writes meanwhile), a reconfiguration removing and adding a
// table, then DELETE. Nothing is lost; duplicates are counted.
func TestLogicalLifecycle(t *testing.T) {
	c := newChain(t)
	c.dropSlotAtEnd()
	k := consumeKafka(t, c.brokers, c.prefix)
	cust := c.topic("customers")
	c.api.create(c.src, c.logicalSrcConfig(c.pgURL))
	c.api.awaitRunning(c.src)
	var slot string
	for _, r := range c.api.resources(c.src) {
		if r.Kind == "postgres.replication_slot" {
			slot = r.Name
		}
	}
	if slot == "" {
		t.Fatal("no slot in the resources")
	}
	var all []string
	step := func(what string, names []string) {
		t.Helper()
		k.await(t, cust, names, 60*time.Second)
		all = append(all, names...)
		t.Logf("%s: %d delivered", what, len(names))
	}
	step("running", c.insertCustomers("run", 5))

	// Pause: nothing goes out; the slot keeps the changes; resume sends them.
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/pause", nil, http.StatusAccepted, http.StatusOK, http.StatusNoContent)
	c.api.awaitState(c.src, "PAUSED", "PAUSED")
	paused := c.insertCustomers("paused", 5)
	time.Sleep(2 * time.Second)
	for _, n := range paused {
		if k.count(cust, n) != 0 {
			t.Errorf("%s delivered while paused", n)
		}
	}
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/resume", nil, http.StatusAccepted, http.StatusOK, http.StatusNoContent)
	c.api.awaitRunning(c.src)
	step("paused, resumed", paused)

	// STOPPED: tasks gone, slot kept; resume picks up.
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/stop", nil, http.StatusAccepted, http.StatusOK, http.StatusNoContent)
	c.api.awaitState(c.src, "STOPPED", "")
	if s, _ := c.slotLeft(slot); s != 1 {
		t.Fatalf("slot gone while STOPPED")
	}
	stopped := c.insertCustomers("stopped", 5)
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/resume", nil, http.StatusAccepted, http.StatusOK, http.StatusNoContent)
	c.api.awaitRunning(c.src)
	step("stopped, resumed", stopped)

	// Restart with its tasks, writes around it.
	before := c.insertCustomers("restart-before", 3)
	c.api.must(http.MethodPost, "/connectors/"+c.src+"/restart?includeTasks=true", nil, http.StatusAccepted, http.StatusOK, http.StatusNoContent)
	after := c.insertCustomers("restart-after", 3)
	c.api.awaitRunning(c.src)
	step("restart includeTasks", append(before, after...))

	// GET config, validate it, PUT it back.
	var cfg map[string]string
	if err := json.Unmarshal(c.api.must(http.MethodGet, "/connectors/"+c.src+"/config", nil, http.StatusOK), &cfg); err != nil {
		t.Fatal(err)
	}
	for key := range cfg {
		if strings.HasPrefix(key, "task.") {
			t.Errorf("GET config shows internal key %s", key)
		}
	}
	vb := c.api.must(http.MethodPut, "/connector-plugins/pgaudit/config/validate", cfg, http.StatusOK)
	var vr struct {
		ErrorCount int `json:"error_count"`
	}
	if err := json.Unmarshal(vb, &vr); err != nil || vr.ErrorCount != 0 || strings.Contains(string(vb), "task.table.oids") {
		t.Errorf("validate of the GET config: %d errors, %v: %.2000s", vr.ErrorCount, err, vb)
	}
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/config", cfg, http.StatusOK, http.StatusCreated)
	c.api.awaitRunning(c.src)
	step("PUT of GET config", c.insertCustomers("put-same", 3))

	// Worker restart: SIGTERM, writes meanwhile, start on the same data dir.
	c.w.terminate()
	down := c.insertCustomers("worker-down", 5)
	c.w.restart()
	c.api.awaitRunning(c.src)
	step("worker restart", append(down, c.insertCustomers("worker-up", 3)...))
	st, _, _ := c.api.status(c.src)
	if st.Connector.State != "RUNNING" || len(st.Tasks) != 1 || st.Tasks[0].State != "RUNNING" {
		t.Errorf("after worker restart: %+v", st)
	}

	// SIGKILL: nothing lost (duplicates allowed).
	c.insertCustomers("kill-before", 3)
	c.w.kill()
	killed := c.insertCustomers("killed", 3)
	c.w.restart()
	c.api.awaitRunning(c.src)
	step("SIGKILL", append(killed, c.insertCustomers("kill-after", 2)...))

	// Reconfiguration: orders removed while a change of it waits
	// (STOPPED): that change is left out, customers' are delivered.
	ord := c.topic("orders")
	var custID int64
	if err := c.pg.QueryRow(c.ctx, "SELECT min(id) FROM "+c.table("customers")).Scan(&custID); err != nil {
		t.Fatal(err)
	}
	c.exec("INSERT INTO "+c.table("orders")+" (customer_id, amount, status) VALUES ($1, 1, 'delivered-order')", custID)
	if !eventually(60*time.Second, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return len(k.raw[ord]) > 0
	}) {
		t.Fatal("orders change not delivered")
	}
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/stop", nil, http.StatusAccepted, http.StatusOK, http.StatusNoContent)
	c.api.awaitState(c.src, "STOPPED", "")
	k.mu.Lock()
	ordersBefore := len(k.raw[ord])
	k.mu.Unlock()
	c.exec("INSERT INTO "+c.table("orders")+" (customer_id, amount, status) VALUES ($1, 2, 'pending-order')", custID)
	pendingCust := c.insertCustomers("reconf-pending", 2)
	cfg["tables"] = c.schema + ".customers"
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/config", cfg, http.StatusOK, http.StatusCreated)
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/resume", nil, http.StatusAccepted, http.StatusOK, http.StatusNoContent)
	c.api.awaitRunning(c.src)
	step("reconfigured (orders removed)", append(pendingCust, c.insertCustomers("reconf-after", 2)...))
	time.Sleep(2 * time.Second)
	k.mu.Lock()
	if n := len(k.raw[ord]); n != ordersBefore {
		t.Errorf("orders (removed) got %d more record(s) after the reconfiguration: %v", n-ordersBefore, k.raw[ord][ordersBefore:])
	}
	k.mu.Unlock()

	dups := 0
	for _, n := range all {
		if k.count(cust, n) > 1 {
			dups++
			t.Logf("duplicate: %s x%d", n, k.count(cust, n))
		}
	}
	t.Logf("%d changes, %d delivered more than once", len(all), dups)

	c.api.deleteEventually(c.src, 60*time.Second)
	if s, p := c.slotLeft(slot); s != 0 || p != 0 {
		t.Errorf("after DELETE: %d slot(s), %d publication(s)", s, p)
	}
}

// TestLogicalDeleteWhileDatabaseDown: DELETE while PostgreSQL is
// unreachable fails and keeps the connector (deletion pending, slot and
// publication still owned); once it is back, a repeated DELETE (or the
// retry) drops both and the ledger empties.
func TestLogicalDeleteWhileDatabaseDown(t *testing.T) {
	c := newChain(t)
	c.dropSlotAtEnd()
	proxy, pgURL := c.viaProxy()
	k := consumeKafka(t, c.brokers, c.prefix)
	c.api.create(c.src, c.logicalSrcConfig(pgURL))
	c.api.awaitRunning(c.src)
	var slot string
	for _, r := range c.api.resources(c.src) {
		if r.Kind == "postgres.replication_slot" {
			slot = r.Name
		}
	}
	k.await(t, c.topic("customers"), c.insertCustomers("up", 2), 60*time.Second)

	proxy.down()
	c.insertCustomers("while-down", 2) // straight to PostgreSQL
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	code, body, err := c.api.do(ctx, http.MethodDelete, "/connectors/"+c.src, nil)
	if err != nil || code == http.StatusNoContent || code == http.StatusOK {
		t.Fatalf("DELETE while PostgreSQL is down = %d %s, %v; want a failure", code, body, err)
	}
	s, found, err := c.api.status(c.src)
	if err != nil || !found || s.Deletion == nil || len(s.Deletion.Remaining) != 2 {
		t.Fatalf("after the failed DELETE: status %+v (found %v, %v); want it visible with its slot and publication remaining", s, found, err)
	}
	if sl, p := c.slotLeft(slot); sl != 1 || p != 1 {
		t.Fatalf("while down: %d slot(s), %d publication(s)", sl, p)
	}
	t.Logf("failed DELETE: %d %.600s; deletion %+v", code, body, *s.Deletion)
	proxy.up()
	// The background retry alone completes it.
	c.api.awaitGone(c.src, 90*time.Second)
	if sl, p := c.slotLeft(slot); sl != 0 || p != 0 {
		t.Errorf("after DELETE: %d slot(s), %d publication(s)", sl, p)
	}
	code, body, _ = c.api.do(context.Background(), http.MethodGet, "/connectors/"+c.src+"/resources", nil)
	if code != http.StatusNotFound && strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("resources after DELETE = %d %s", code, body)
	}
}

// TestLogicalAddTableUnderWrites: a PUT adding a table while writers
// change it: every change committed after the PUT answered is delivered.
func TestLogicalAddTableUnderWrites(t *testing.T) {
	c := newChain(t)
	c.dropSlotAtEnd()
	k := consumeKafka(t, c.brokers, c.prefix)
	cfg := c.logicalSrcConfig(c.pgURL)
	cfg["tables"] = c.schema + ".customers"
	c.api.create(c.src, cfg)
	c.api.awaitRunning(c.src)
	var custID int64
	if err := c.pg.QueryRow(c.ctx, "SELECT min(id) FROM "+c.table("customers")).Scan(&custID); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	var mu sync.Mutex
	var written []string
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			st := fmt.Sprintf("w-%d", i)
			if _, err := c.pg.Exec(c.ctx, "INSERT INTO "+c.table("orders")+" (customer_id, amount, status) VALUES ($1, 1, $2)", custID, st); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			written = append(written, st)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	cfg["tables"] = c.schema + ".customers," + c.schema + ".orders"
	c.api.must(http.MethodPut, "/connectors/"+c.src+"/config", cfg, http.StatusOK)
	mu.Lock()
	from := len(written)
	mu.Unlock()
	c.api.awaitRunning(c.src)
	time.Sleep(time.Second)
	close(stop)
	<-done
	mu.Lock()
	after := slices.Clone(written[from:])
	total := len(written)
	mu.Unlock()
	ord := c.topic("orders")
	statuses := func() map[string]int {
		k.mu.Lock()
		defer k.mu.Unlock()
		out := map[string]int{}
		for _, v := range k.raw[ord] {
			var m change
			if json.Unmarshal([]byte(v), &m) == nil {
				out[fmt.Sprint(m.row()["status"])]++
			}
		}
		return out
	}
	if !eventually(60*time.Second, func() bool {
		got := statuses()
		for _, s := range after {
			if got[s] == 0 {
				return false
			}
		}
		return true
	}) {
		got := statuses()
		var missing []string
		for _, s := range after {
			if got[s] == 0 {
				missing = append(missing, s)
			}
		}
		t.Fatalf("%d of the %d changes written after the PUT answered are missing: %v", len(missing), len(after), missing)
	}
	t.Logf("%d written, %d after the PUT answered (all delivered), %d delivered in all", total, len(after), len(statuses()))
	c.api.deleteEventually(c.src, 60*time.Second)
}
