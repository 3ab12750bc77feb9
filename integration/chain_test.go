package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
)

// chain is one test's slice of the world: a demo schema of its own in
// PostgreSQL, its own topic prefix, exchange and queues in RabbitMQ, and a
// tidyconnect worker process, all with names unique to the test and all
// removed when it ends.
type chain struct {
	t       testing.TB
	ctx     context.Context
	pgURL   string
	amqpURL string
	brokers []string
	pg      *pgxpool.Pool
	mq      *amqp.Connection

	id          string
	schema      string // the "user's" demo tables live here
	auditSchema string // where pgaudit provisions its objects
	prefix      string // topic prefix
	exchange    string
	src, sink   string // connector names

	w   *worker
	api *restClient
}

// newChain prepares the services and starts a worker; it skips the test
// when cmd/tidyconnect does not exist yet or a service is unavailable.
//
// By default Kafka is outside the worker (testenv.KafkaBrokers); with
// embedded true the worker runs its own broker under its data dir, as
// `tidyconnect standalone` does without --bootstrap-servers.
func newChain(t testing.TB, embedded ...bool) *chain {
	t.Helper()
	if !hasCommand() {
		t.Fatal("cmd/tidyconnect has no Go sources: the integration suite needs the tidyconnect binary")
	}
	c := &chain{t: t, pgURL: testenv.PostgresURL(t), amqpURL: testenv.RabbitMQURL(t)}
	useEmbedded := len(embedded) > 0 && embedded[0]
	if !useEmbedded {
		c.brokers = testenv.KafkaBrokers(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	c.ctx = ctx

	c.id = testenv.Unique("")
	c.schema = "it_shop_" + c.id
	c.auditSchema = "it_audit_" + c.id
	c.prefix = "it" + c.id
	c.exchange = "it.ex." + c.id
	c.src = "it-src-" + c.id
	c.sink = "it-sink-" + c.id

	pool, err := pgxpool.New(ctx, c.pgURL)
	if err != nil {
		t.Fatalf("connecting to PostgreSQL (%s): %v", testenv.PostgresEnv, err)
	}
	t.Cleanup(pool.Close)
	c.pg = pool
	mq, err := amqp.Dial(c.amqpURL)
	if err != nil {
		t.Fatalf("connecting to RabbitMQ (%s): %v", testenv.RabbitMQEnv, err)
	}
	t.Cleanup(func() { _ = mq.Close() })
	c.mq = mq

	// Registered before the worker starts, so it runs after the worker has
	// stopped: whatever a failed test left behind goes.
	t.Cleanup(c.dropEverything)
	c.loadDemoSchema()

	if useEmbedded {
		c.w = startWorker(t, withEmbeddedKafka())
	} else {
		c.w = startWorker(t, withBrokers(c.brokers))
	}
	c.api = c.w.api()
	t.Cleanup(func() {
		// A secret in a log is a bug even when every assertion passed.
		if u, err := amqp.ParseURI(c.amqpURL); err == nil && u.Password != "" {
			if c.w.logContains(u.Username + ":" + u.Password + "@") {
				t.Errorf("the worker log contains the RabbitMQ credentials in clear")
			}
		}
	})
	return c
}

var shopWord = regexp.MustCompile(`\bshop\b`)

// loadDemoSchema runs migrations/demo (the compose stack's init scripts)
// into this test's own schema.
func (c *chain) loadDemoSchema() {
	sql := shopWord.ReplaceAllString(readDemoSQL(c.t), c.schema)
	if _, err := c.pg.Exec(c.ctx, sql); err != nil {
		c.t.Fatalf("loading migrations/demo into schema %s: %v", c.schema, err)
	}
}

func (c *chain) dropEverything() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range []string{c.schema, c.auditSchema} {
		if _, err := c.pg.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE"); err != nil {
			c.t.Errorf("cleanup: dropping schema %s: %v", s, err)
		}
	}
	ch, err := c.mq.Channel()
	if err != nil {
		c.t.Errorf("cleanup: opening a RabbitMQ channel: %v", err)
		return
	}
	defer ch.Close()
	for _, q := range []string{c.queue("customers"), c.queue("orders"), c.prefix + ".mine"} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			c.t.Errorf("cleanup: deleting queue %s: %v", q, err)
			// The broker closed the channel on the error: open another.
			if ch, err = c.mq.Channel(); err != nil {
				c.t.Errorf("cleanup: opening a RabbitMQ channel: %v", err)
				return
			}
		}
	}
	if err := ch.ExchangeDelete(c.exchange, false, false); err != nil {
		c.t.Errorf("cleanup: deleting exchange %s: %v", c.exchange, err)
	}
}

func (c *chain) table(name string) string { return pgx.Identifier{c.schema, name}.Sanitize() }
func (c *chain) topic(table string) string {
	return c.prefix + "." + c.schema + "." + table
}
func (c *chain) queue(table string) string { return c.topic(table) }

func (c *chain) srcConfig() map[string]string {
	return map[string]string{
		"connector.class":   "pgaudit",
		"tasks.max":         "1",
		"postgres.url":      c.pgURL,
		"tables":            c.schema + ".customers," + c.schema + ".orders",
		"topic.prefix":      c.prefix,
		"audit.schema":      c.auditSchema,
		"poll.max.records":  "200",
		"poll.interval.ms":  "100",
		"cleanup.on.delete": "true",
	}
}

func (c *chain) sinkConfig() map[string]string {
	return map[string]string{
		"connector.class":        "amqpsink",
		"tasks.max":              "1",
		"topics":                 c.topic("customers") + "," + c.topic("orders"),
		"rabbitmq.url":           c.amqpURL,
		"rabbitmq.exchange":      c.exchange,
		"rabbitmq.exchange.type": "direct",
		"rabbitmq.queue":         "${topic}",
		"rabbitmq.queue.type":    "quorum",
		"rabbitmq.routing.key":   "${topic}",
		"cleanup.on.delete":      "true",
		"errors.tolerance":       "none",
	}
}

// deploy creates both connectors and waits for them and their queues.
// srcOverrides change the source's test config (benchmarks use the
// defaults' batch size).
func (c *chain) deploy(srcOverrides ...string) {
	c.t.Helper()
	src := c.srcConfig()
	for i := 0; i+1 < len(srcOverrides); i += 2 {
		src[srcOverrides[i]] = srcOverrides[i+1]
	}
	c.api.create(c.src, src)
	c.api.create(c.sink, c.sinkConfig())
	c.api.awaitRunning(c.src)
	c.api.awaitRunning(c.sink)
	for _, tbl := range []string{"customers", "orders"} {
		q := c.queue(tbl)
		if !eventually(60*time.Second, func() bool { return c.queueExists(q) }) {
			c.t.Fatalf("queue %s was not declared by %s within 60s", q, c.sink)
		}
	}
}

// --- RabbitMQ -----------------------------------------------------------

// queueExists checks with a passive declare (on a throwaway channel, since a
// failed passive declare closes it).
func (c *chain) queueExists(name string) bool {
	ch, err := c.mq.Channel()
	if err != nil {
		c.t.Fatalf("opening a RabbitMQ channel: %v", err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	return err == nil
}

func (c *chain) queueDepth(name string) int {
	ch, err := c.mq.Channel()
	if err != nil {
		c.t.Fatalf("opening a RabbitMQ channel: %v", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		c.t.Fatalf("queue %s: %v", name, err)
	}
	return q.Messages
}

func (c *chain) exchangeExists(name string) bool {
	ch, err := c.mq.Channel()
	if err != nil {
		c.t.Fatalf("opening a RabbitMQ channel: %v", err)
	}
	defer ch.Close()
	return ch.ExchangeDeclarePassive(name, "direct", true, false, false, false, nil) == nil
}

func (c *chain) declareQueue(name string) {
	ch, err := c.mq.Channel()
	if err != nil {
		c.t.Fatalf("opening a RabbitMQ channel: %v", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		c.t.Fatalf("declaring queue %s by hand: %v", name, err)
	}
}

// change is pgaudit's message value.
type change struct {
	Op     string         `json:"op"`
	Before map[string]any `json:"before"`
	After  map[string]any `json:"after"`
	Source map[string]any `json:"source"`
	TsMs   json.Number    `json:"ts_ms"`
	raw    []byte
	at     time.Time // when it arrived
}

// kind maps the op code to insert/update/delete whatever spelling pgaudit
// uses ("c"/"u"/"d" as Debezium, or "I"/"U"/"D").
func (ch change) kind() string {
	switch strings.ToLower(ch.Op) {
	case "c", "i", "insert", "create":
		return "insert"
	case "u", "update":
		return "update"
	case "d", "delete":
		return "delete"
	case "t", "truncate":
		return "truncate"
	}
	return "?" + ch.Op
}

// row returns the row image that identifies the row: after, or before for a
// delete.
func (ch change) row() map[string]any {
	if ch.After != nil {
		return ch.After
	}
	return ch.Before
}

func (ch change) id() string   { return fmt.Sprint(ch.row()["id"]) }
func (ch change) name() string { return fmt.Sprint(ch.row()["name"]) }

// key identifies an event of a row for duplicate detection.
func (ch change) key() string { return ch.kind() + "|" + ch.name() }

// collector consumes one queue into memory in the background; the chain
// owns it and stops it at cleanup.
type collector struct {
	queue string
	mu    sync.Mutex
	msgs  []change
	bad   []string
	// arrivals is what came, in order: a change's kind, or "other" for a
	// body that is not a change (a tombstone's empty one).
	arrivals []string
	done     chan struct{}
}

func (c *chain) collect(queue string) *collector {
	c.t.Helper()
	ch, err := c.mq.Channel()
	if err != nil {
		c.t.Fatalf("opening a RabbitMQ channel: %v", err)
	}
	deliveries, err := ch.Consume(queue, "it-"+c.id, true, true, false, false, nil)
	if err != nil {
		c.t.Fatalf("consuming from %s: %v", queue, err)
	}
	col := &collector{queue: queue, done: make(chan struct{})}
	go func() {
		defer close(col.done)
		// Ends when the channel closes: at cleanup, or when the queue is
		// deleted by the connector under test.
		for d := range deliveries {
			var m change
			m.at = time.Now()
			dec := json.NewDecoder(bytes.NewReader(d.Body))
			dec.UseNumber()
			err := dec.Decode(&m)
			col.mu.Lock()
			if err != nil {
				col.bad = append(col.bad, string(d.Body))
				col.arrivals = append(col.arrivals, "other")
			} else {
				m.raw = d.Body
				col.msgs = append(col.msgs, m)
				col.arrivals = append(col.arrivals, m.kind())
			}
			col.mu.Unlock()
		}
	}()
	c.t.Cleanup(func() {
		_ = ch.Close()
		<-col.done
	})
	return col
}

func (col *collector) snapshot() ([]change, []string) {
	col.mu.Lock()
	defer col.mu.Unlock()
	return slices.Clone(col.msgs), slices.Clone(col.bad)
}

// order is what arrived, in order (see arrivals).
func (col *collector) order() []string {
	col.mu.Lock()
	defer col.mu.Unlock()
	return slices.Clone(col.arrivals)
}

// byRow groups the received changes per row id, in arrival order.
func (col *collector) byRow() map[string][]change {
	msgs, _ := col.snapshot()
	out := map[string][]change{}
	for _, m := range msgs {
		out[m.id()] = append(out[m.id()], m)
	}
	return out
}

// --- PostgreSQL ---------------------------------------------------------

// ownedObjects lists the PostgreSQL objects marked as owned by connector:
// pgaudit comments each object it creates with tidyconnect:<connector>.
func (c *chain) ownedObjects(connector string) []string {
	c.t.Helper()
	rows, err := c.pg.Query(c.ctx, `
		SELECT 'schema ' || nspname FROM pg_namespace WHERE obj_description(oid, 'pg_namespace') = $1
		UNION ALL SELECT 'table ' || oid::regclass::text FROM pg_class WHERE obj_description(oid, 'pg_class') = $1
		UNION ALL SELECT 'function ' || oid::regprocedure::text FROM pg_proc WHERE obj_description(oid, 'pg_proc') = $1
		UNION ALL SELECT 'trigger ' || tgname || ' on ' || tgrelid::regclass::text FROM pg_trigger WHERE obj_description(oid, 'pg_trigger') = $1
		ORDER BY 1`, "tidyconnect:"+connector)
	if err != nil {
		c.t.Fatalf("listing owned objects in the catalogs: %v", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatalf("listing owned objects in the catalogs: %v", err)
	}
	return out
}

// triggersOn lists the non-internal triggers of one demo table.
func (c *chain) triggersOn(table string) []string {
	c.t.Helper()
	rows, err := c.pg.Query(c.ctx, `SELECT tgname FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal ORDER BY 1`, c.table(table))
	if err != nil {
		c.t.Fatalf("listing triggers on %s: %v", table, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatalf("listing triggers on %s: %v", table, err)
	}
	return out
}

// auditBacklog counts the changes still in pgaudit's audit table(s): rows
// not yet acknowledged by Kafka and committed (diagnostics only).
func (c *chain) auditBacklog() int {
	rows, err := c.pg.Query(c.ctx, `SELECT format('%I.%I', n.nspname, t.relname) FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
		WHERE n.nspname = $1 AND t.relkind = 'r' AND t.relname LIKE '%\_audit'`, c.auditSchema)
	if err != nil {
		return -1
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return -1
	}
	total := 0
	for _, tbl := range tables {
		var n int
		if err := c.pg.QueryRow(c.ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil {
			return -1
		}
		total += n
	}
	return total
}

func (c *chain) schemaExists(name string) bool {
	var ok bool
	if err := c.pg.QueryRow(c.ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&ok); err != nil {
		c.t.Fatalf("checking schema %s: %v", name, err)
	}
	return ok
}

func (c *chain) count(table string) int {
	var n int
	if err := c.pg.QueryRow(c.ctx, "SELECT count(*) FROM "+c.table(table)).Scan(&n); err != nil {
		c.t.Fatalf("counting %s: %v", table, err)
	}
	return n
}

func (c *chain) exec(sql string, args ...any) {
	c.t.Helper()
	if _, err := c.pg.Exec(c.ctx, sql, args...); err != nil {
		c.t.Fatalf("%s: %v", sql, err)
	}
}

// --- a stream of writes ---------------------------------------------------

// stream writes customers continuously from its own goroutine (the test
// owns it: stop ends and waits for it): each row is inserted, and every
// second row then renamed in a separate transaction.
type stream struct {
	c    *chain
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	expected map[string][]string // row id -> event keys in commit order
	written  int
	err      error
}

func (c *chain) startStream(every time.Duration) *stream {
	s := &stream{c: c, stop: make(chan struct{}), done: make(chan struct{}), expected: map[string][]string{}}
	go func() {
		defer close(s.done)
		for n := 0; ; n++ {
			select {
			case <-s.stop:
				return
			case <-time.After(every):
			}
			if err := s.writeOne(n); err != nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				return
			}
		}
	}()
	c.t.Cleanup(func() { s.halt() })
	return s
}

func (s *stream) writeOne(n int) error {
	name := fmt.Sprintf("s-%d", n)
	var id int64
	err := s.c.pg.QueryRow(s.c.ctx, "INSERT INTO "+s.c.table("customers")+" (name, email) VALUES ($1, $2) RETURNING id",
		name, fmt.Sprintf("%s-%s@example.com", name, s.c.id)).Scan(&id)
	if err != nil {
		return fmt.Errorf("inserting %s: %w", name, err)
	}
	keys := []string{"insert|" + name}
	if n%2 == 0 {
		if _, err := s.c.pg.Exec(s.c.ctx, "UPDATE "+s.c.table("customers")+" SET name = $1 WHERE id = $2", name+"-v2", id); err != nil {
			return fmt.Errorf("renaming %s: %w", name, err)
		}
		keys = append(keys, "update|"+name+"-v2")
	}
	s.mu.Lock()
	s.expected[fmt.Sprint(id)] = keys
	s.written++
	s.mu.Unlock()
	return nil
}

func (s *stream) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// end stops the writer and returns what it committed.
func (s *stream) end() map[string][]string {
	s.c.t.Helper()
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		s.c.t.Fatalf("the writer failed: %v", s.err)
	}
	return s.expected
}

func (s *stream) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written
}

// awaitWritten waits until the writer has committed n more rows than now.
func (s *stream) awaitMore(n int) {
	s.c.t.Helper()
	target := s.count() + n
	if !eventually(60*time.Second, func() bool { return s.count() >= target }) {
		s.c.t.Fatalf("the writer did not commit %d more rows within 60s (err %v)", n, s.err)
	}
}

// verdict compares what arrived with what was committed: per row, the
// first arrival of each event must follow commit order; nothing may be
// missing; anything else is a duplicate, which the caller may allow.
type verdict struct {
	missing    []string // row: events that never arrived
	outOfOrder []string
	unexpected []string
	duplicates int
	received   int
	dupRows    map[string]int // row id -> duplicate messages
}

func judge(expected map[string][]string, got map[string][]change) verdict {
	v := verdict{dupRows: map[string]int{}}
	for id, want := range expected {
		msgs := got[id]
		v.received += len(msgs)
		var firsts []string
		seen := map[string]bool{}
		for _, m := range msgs {
			k := m.key()
			if seen[k] {
				v.duplicates++
				v.dupRows[id]++
				continue
			}
			seen[k] = true
			firsts = append(firsts, k)
		}
		for _, w := range want {
			if !seen[w] {
				v.missing = append(v.missing, id+": "+w)
			}
		}
		for _, k := range firsts {
			if !slices.Contains(want, k) {
				v.unexpected = append(v.unexpected, id+": "+k)
			}
		}
		if len(firsts) == len(want) && !slices.Equal(firsts, want) {
			v.outOfOrder = append(v.outOfOrder, fmt.Sprintf("%s: got %v, want %v", id, firsts, want))
		}
	}
	sort.Strings(v.missing)
	return v
}

func (v verdict) complete() bool { return len(v.missing) == 0 }

// phaseMark is the number of rows the stream had written when a phase of a
// test began.
type phaseMark struct {
	label string
	rows  int
	at    time.Time
}

// duplicatesByArrival attributes duplicate messages to the phase in which
// they arrived.
func duplicatesByArrival(col *collector, marks []phaseMark) string {
	msgs, _ := col.snapshot()
	seen := map[string][]byte{}
	per := make([]int, len(marks))
	var example [][]byte
	for _, m := range msgs {
		k := m.id() + "|" + m.key()
		if seen[k] == nil {
			seen[k] = m.raw
			continue
		}
		if example == nil {
			example = [][]byte{seen[k], m.raw}
		}
		i := sort.Search(len(marks), func(i int) bool { return marks[i].at.After(m.at) }) - 1
		if i >= 0 {
			per[i]++
		}
	}
	var parts []string
	for i, m := range marks {
		if per[i] > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d", m.label, per[i]))
		}
	}
	if len(example) > 0 {
		parts = append(parts, "e.g. first "+string(example[0])+" then "+string(example[1]))
	}
	return strings.Join(parts, ", ")
}

// duplicatesByPhase attributes duplicate messages to the phase in which
// their row was written, to show which operation re-delivers.
func duplicatesByPhase(v verdict, expected map[string][]string, marks []phaseMark) string {
	per := make([]int, len(marks))
	for id, n := range v.dupRows {
		var seq int
		if _, err := fmt.Sscanf(strings.TrimPrefix(expected[id][0], "insert|s-"), "%d", &seq); err != nil {
			continue
		}
		i := sort.Search(len(marks), func(i int) bool { return marks[i].rows > seq }) - 1
		if i >= 0 {
			per[i] += n
		}
	}
	var parts []string
	for i, m := range marks {
		if per[i] > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d", m.label, per[i]))
		}
	}
	return strings.Join(parts, ", ")
}

// awaitDelivery waits until every committed event has arrived (or the
// deadline passes) and returns the verdict.
func awaitDelivery(col *collector, expected map[string][]string, within time.Duration) verdict {
	var v verdict
	eventually(within, func() bool {
		v = judge(expected, col.byRow())
		return v.complete()
	})
	return v
}

func (c *chain) report(v verdict, allowDuplicates bool) {
	c.t.Helper()
	if n := len(v.missing); n > 0 {
		c.t.Errorf("%d committed change(s) never arrived in RabbitMQ, e.g. %v", n, v.missing[:min(n, 10)])
	}
	if len(v.outOfOrder) > 0 {
		c.t.Errorf("changes of a row arrived out of commit order: %v", v.outOfOrder[:min(len(v.outOfOrder), 10)])
	}
	if len(v.unexpected) > 0 {
		c.t.Errorf("messages that match no committed change: %v", v.unexpected[:min(len(v.unexpected), 10)])
	}
	if v.duplicates > 0 && !allowDuplicates {
		c.t.Errorf("%d duplicate message(s) without any crash", v.duplicates)
	}
	c.t.Logf("received %d messages for the committed rows, %d of them duplicates", v.received, v.duplicates)
}
