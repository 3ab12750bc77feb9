package pgaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// A task that just drained the audit table reads spinReads more times,
// spinWait apart, before it asks writers for NOTIFYs.
const (
	spinReads = 3
	spinWait  = 5 * time.Millisecond
)

// maxInflightBatches bounds how many polled, not yet committed batches a
// task keeps excluded from its reads; beyond that Poll waits for Commit.
const maxInflightBatches = 4

// Task reads its tables' rows from the connector's audit table, in id
// order, and deletes exactly the rows whose records Kafka acknowledged.
//
// A lost database connection is retried with exponential backoff (100 ms to
// 5 s) for as long as it lasts; the task stays RUNNING and logs each failed
// attempt. Nothing is lost: undelivered rows stay in the audit table, and
// acknowledged rows whose DELETE failed are deleted on the next attempt.
type Task struct {
	host   *connect.Host
	s      settings
	n      names
	tables []tableName
	all    bool // the task reads every table of the connector

	// stopCtx is created lazily by whichever of Start and Stop comes first:
	// the runtime may call Stop while Start runs, or before it assigns.
	stopMu     sync.Mutex
	stopCtx    context.Context
	stopCancel context.CancelFunc

	pool     *pgxpool.Pool
	listener *pgx.Conn // used only by Poll; closed in Stopped
	db       string
	meta     map[tableName]*tableMeta

	selectSQL      [3]string // by readKind
	deleteSQL      string
	deleteRangeSQL string
	markSQL        string
	unmarkSQL      string

	// waiting mirrors this task's row in the wakeup table: while it is
	// true the capture trigger sends NOTIFYs. idleStep is the next wait
	// without a notification, doubling up to poll.interval.ms.
	waiting    bool
	idleStep   time.Duration
	emptyReads int // reads that found nothing since the last change

	inflight      map[int64]struct{} // polled, neither deleted nor pending
	pendingDelete []int64            // acknowledged, DELETE not yet done
	backoff       time.Duration
	closeOnce     sync.Once
}

var _ connect.SourceTask = (*Task)(nil)

// tableMeta is what records of one table share.
type tableMeta struct {
	topic     string
	partition map[string]any
	source    []byte   // `{"connector":..,"db":..,"schema":..,"table":..,`
	pkJSON    [][]byte // quoted primary-key column names; nil: no key
	pkCols    []string
}

// Start connects (a small pool and a LISTEN connection, both named by
// application_name) and reads the primary keys of its tables.
func (t *Task) Start(ctx context.Context, cfg connect.Config) error {
	t.host = connect.HostFrom(ctx)
	// Stop interrupts provisioning as it interrupts Poll; a Stop that came
	// first makes Start return at once.
	stopCtx := t.stopContext()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(stopCtx, cancel)()
	if stopCtx.Err() != nil {
		return fmt.Errorf("task %d was stopped before it started; nothing to do: %w", t.host.Task, stopCtx.Err())
	}
	if err := t.start(ctx, cfg); err != nil {
		if stopCtx.Err() != nil {
			return fmt.Errorf("task %d was stopped while starting: %w", t.host.Task, err)
		}
		return err
	}
	return nil
}

func (t *Task) start(ctx context.Context, cfg connect.Config) error {
	s, errs := parseSettings(connectorName(t.host, cfg), cfg)
	if err := configError(errs); err != nil {
		return err
	}
	t.s, t.n = s, objectNames(s.name)
	t.tables = s.tables
	if v := cfg[keyTaskTables]; v != "" {
		ts, err := parseTables(v)
		if err != nil {
			return fmt.Errorf("task configuration %s: %w", keyTaskTables, err)
		}
		t.tables = ts
	}
	t.all = len(t.tables) == len(s.tables)
	t.inflight = map[int64]struct{}{}

	pc, err := pgxpool.ParseConfig(s.url)
	if err != nil {
		return fmt.Errorf("%s is not a valid libpq URL or DSN: fix %s", connect.MaskCredentials(s.url), KeyURL)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = ApplicationName(s.name, fmt.Sprintf("task-%d", t.host.Task))
	if pc.ConnConfig.ConnectTimeout == 0 || pc.ConnConfig.ConnectTimeout > 10*time.Second {
		pc.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pc.MaxConns = 2
	pc.MinConns = 0
	t.pool, err = pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return fmt.Errorf("creating the connection pool for %s: %w", connect.MaskCredentials(s.url), err)
	}
	if err := t.loadMeta(ctx); err != nil {
		return err
	}
	at := pgx.Identifier{s.auditSchema, t.n.table}.Sanitize()
	t.selectSQL = readQueries(at, t.all)
	t.deleteSQL = `DELETE FROM ` + at + ` WHERE id = ANY($1::bigint[])`
	t.deleteRangeSQL = `DELETE FROM ` + at + ` WHERE id BETWEEN $1 AND $2`
	wt := pgx.Identifier{s.auditSchema, t.n.wakeup}.Sanitize()
	t.markSQL = `INSERT INTO ` + wt + ` (task, waiting) VALUES ($1, $2) ON CONFLICT (task) DO UPDATE SET waiting = excluded.waiting`
	t.unmarkSQL = `DELETE FROM ` + wt + ` WHERE task = $1`
	if err := t.listen(ctx); err != nil {
		return err
	}
	t.host.Logger.Info("task started", "tables", len(t.tables))
	return nil
}

func (t *Task) loadMeta(ctx context.Context) error {
	schemas := make([]string, len(t.tables))
	names := make([]string, len(t.tables))
	for i, tb := range t.tables {
		schemas[i], names[i] = tb.Schema, tb.Name
	}
	if err := t.pool.QueryRow(ctx, `SELECT current_database()::text`).Scan(&t.db); err != nil {
		return fmt.Errorf("connecting to PostgreSQL at %s (check %s and that the server is up): %w", connect.MaskCredentials(t.s.url), KeyURL, err)
	}
	rows, err := t.pool.Query(ctx, `
SELECT x.s, x.n, coalesce((
  SELECT array_agg(a.attname::text ORDER BY k.ord)
  FROM pg_catalog.pg_namespace ns
  JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = x.n
  JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND i.indisprimary
  CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
  WHERE ns.nspname = x.s), '{}')
FROM unnest($1::text[], $2::text[]) AS x(s, n)`, schemas, names)
	if err != nil {
		return fmt.Errorf("reading the primary keys of the captured tables: %w", err)
	}
	t.meta = map[tableName]*tableMeta{}
	for rows.Next() {
		var tb tableName
		var pk []string
		if err := rows.Scan(&tb.Schema, &tb.Name, &pk); err != nil {
			rows.Close()
			return err
		}
		t.meta[tb] = t.newMeta(tb, pk)
	}
	rows.Close()
	return rows.Err()
}

func (t *Task) newMeta(tb tableName, pk []string) *tableMeta {
	m := &tableMeta{
		topic:     topicName(t.s.topicPrefix, tb),
		partition: map[string]any{"schema": tb.Schema, "table": tb.Name},
		pkCols:    pk,
	}
	src := []byte(`{"connector":`)
	src = appendJSONString(src, t.s.name)
	src = append(src, `,"db":`...)
	src = appendJSONString(src, t.db)
	src = append(src, `,"schema":`...)
	src = appendJSONString(src, tb.Schema)
	src = append(src, `,"table":`...)
	src = appendJSONString(src, tb.Name)
	m.source = append(src, ',')
	for _, c := range pk {
		m.pkJSON = append(m.pkJSON, appendJSONString(nil, c))
	}
	return m
}

// listen opens the wake-up connection. Its context watcher interrupts a
// wait with a deadline instead of a cancel request, so an interrupted wait
// leaves the connection usable.
func (t *Task) listen(ctx context.Context) error {
	cc, err := connConfig(t.s.url, ApplicationName(t.s.name, fmt.Sprintf("listen-%d", t.host.Task)))
	if err != nil {
		return err
	}
	cc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("connecting the LISTEN connection to %s (check %s): %w", connect.MaskCredentials(t.s.url), KeyURL, err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{t.n.channel}.Sanitize()); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("LISTEN %s: %w", t.n.channel, err)
	}
	t.listener = conn
	return nil
}

// Poll returns the next batch of changes, waiting for a NOTIFY wake-up or
// the poll interval when there is none.
func (t *Task) Poll(ctx context.Context) ([]connect.SourceRecord, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(t.stopContext(), cancel)
	defer stop()

	interval := time.Duration(t.s.pollInterval) * time.Millisecond
	deadline := time.Now().Add(interval)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		recs, err := t.pollOnce(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if !transient(err) {
				return nil, fmt.Errorf("reading the audit table %s.%s: %w", t.s.auditSchema, t.n.table, err)
			}
			t.retryLater(ctx, "reading the audit table", err)
			return nil, nil
		}
		if recs != nil {
			t.backoff = 0
			if len(recs) > 0 {
				t.idleStep = 0
				t.emptyReads = 0
				if t.waiting {
					// Busy again: writers need not notify. A failure only
					// costs writers some needless NOTIFYs.
					if _, err := t.pool.Exec(ctx, t.markSQL, t.host.Task, false); err == nil {
						t.waiting = false
					}
				}
			}
			return recs, nil
		}
		if !time.Now().Before(deadline) {
			return nil, nil
		}
		if !t.waiting && t.emptyReads < spinReads {
			// Just drained: under a steady stream the next change is a few
			// milliseconds away. Reading again shortly, rather than asking
			// writers for NOTIFYs at once, spares them the NOTIFY's
			// database-wide commit lock and the mark's two updates.
			t.emptyReads++
			if err := sleepCtx(ctx, spinWait); err != nil {
				return nil, err
			}
			continue
		}
		if !t.waiting {
			// Ask for NOTIFYs, then read once more: a change committed
			// before the mark was visible would otherwise wait.
			if _, err := t.pool.Exec(ctx, t.markSQL, t.host.Task, true); err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if !transient(err) {
					return nil, fmt.Errorf("marking task %d as waiting in %s.%s: %w", t.host.Task, t.s.auditSchema, t.n.wakeup, err)
				}
				t.retryLater(ctx, "marking the task as waiting", err)
				return nil, nil
			}
			t.waiting = true
			continue
		}
		// A writer that checked the mark just before it was set commits
		// without a NOTIFY: short first waits pick its change up quickly.
		t.idleStep = min(max(2*t.idleStep, 10*time.Millisecond), interval)
		until := time.Now().Add(t.idleStep)
		if until.After(deadline) {
			until = deadline
		}
		t.wait(ctx, until)
	}
}

// retryLater logs a lost connection and waits the next backoff step.
func (t *Task) retryLater(ctx context.Context, what string, err error) {
	t.backoff = min(max(2*t.backoff, 100*time.Millisecond), 5*time.Second)
	t.host.Logger.Warn(what+" failed; retrying (the database may be down or restarting)", "error", err, "retry_in", t.backoff)
	_ = sleepCtx(ctx, t.backoff)
}

// wait blocks until a notification arrives, the deadline passes or ctx is
// done. A broken LISTEN connection is reopened; notifications sent meanwhile
// are lost, so the caller polls again either way.
func (t *Task) wait(ctx context.Context, deadline time.Time) {
	if t.listener == nil || t.listener.IsClosed() {
		if t.listener != nil {
			_ = t.listener.Close(context.WithoutCancel(ctx))
			t.listener = nil
		}
		lctx, cancel := context.WithDeadline(ctx, deadline)
		err := t.listen(lctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				t.retryLater(ctx, "reopening the LISTEN connection", err)
			}
			return
		}
		return // poll at once: notifications were lost while disconnected
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	_, _ = t.listener.WaitForNotification(wctx)
}

func (t *Task) pollOnce(ctx context.Context) ([]connect.SourceRecord, error) {
	if len(t.pendingDelete) > 0 {
		if _, err := t.deleteIDs(ctx, t.pendingDelete); err != nil {
			return nil, err
		}
		t.pendingDelete = nil
	}
	if len(t.inflight) >= maxInflightBatches*t.s.pollMax {
		// Commit runs between Polls: return so the runtime can call it.
		_ = sleepCtx(ctx, 5*time.Millisecond)
		return []connect.SourceRecord{}, nil
	}
	kind, args := readAll, []any{t.s.pollMax}
	if len(t.inflight) > 0 {
		ids := make([]int64, 0, len(t.inflight))
		for id := range t.inflight {
			ids = append(ids, id)
		}
		lo, hi := slices.Min(ids), slices.Max(ids)
		kind, args = readAround, append(args, lo, hi)
		if hi-lo+1 != int64(len(ids)) {
			kind, args = readAroundGaps, append(args, multirange(t.inflight))
		}
	}
	if !t.all {
		schemas := make([]string, len(t.tables))
		names := make([]string, len(t.tables))
		for i, tb := range t.tables {
			schemas[i], names[i] = tb.Schema, tb.Name
		}
		args = append(args, schemas, names)
	}
	rows, err := t.pool.Query(ctx, t.selectSQL[kind], args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var recs []connect.SourceRecord
	for rows.Next() {
		var (
			id, tsMS      int64
			txid, op      string
			schema, table string
			before, after []byte
		)
		if err := rows.Scan(&id, &txid, &tsMS, &schema, &table, &op, &before, &after); err != nil {
			return nil, err
		}
		tb := tableName{schema, table}
		m := t.meta[tb]
		if m == nil {
			// A table added by a reconfiguration this task was not told
			// about yet: its meta is built on first sight.
			m = t.newMeta(tb, nil)
			t.meta[tb] = m
		}
		recs = append(recs, connect.SourceRecord{
			SourcePartition: m.partition,
			SourceOffset:    map[string]any{"id": id, "txid": txid},
			Topic:           m.topic,
			Partition:       -1,
			Key:             m.key(op, before, after),
			Value:           m.envelope(op, before, after, txid, id, tsMS),
			Timestamp:       time.UnixMilli(tsMS),
		})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, r := range recs {
		t.inflight[r.SourceOffset["id"].(int64)] = struct{}{}
	}
	return recs, nil
}

// Read queries, by what is in flight (polled, not yet deleted).
const (
	readAll        = iota // nothing in flight
	readAround            // in flight: exactly the ids lo..hi ($2, $3)
	readAroundGaps        // in flight: some ids in lo..hi, listed in $4
)

// readQueries builds the three read queries. Rows in flight must not be
// read again, and scanning past them costs as much as reading them, so the
// query reads below the in-flight ids (only late commits are still there:
// everything delivered below them is deleted), above them, and between
// them only when the in-flight ids have gaps a late commit could fill.
func readQueries(auditTable string, all bool) [3]string {
	const cols = `id, txid::text, (extract(epoch FROM ts) * 1000)::bigint, schema_name, table_name, op::text, before::text, after::text`
	filter := func(first int) string {
		if all {
			return ""
		}
		return fmt.Sprintf(` AND (schema_name, table_name) IN (SELECT * FROM unnest($%d::text[], $%d::text[]))`, first, first+1)
	}
	part := func(cond string, f int) string {
		return `(SELECT ` + cols + ` FROM ` + auditTable + ` WHERE ` + cond + filter(f) + ` ORDER BY id LIMIT $1)`
	}
	return [3]string{
		readAll:    `SELECT ` + cols + ` FROM ` + auditTable + ` WHERE TRUE` + filter(2) + ` ORDER BY id LIMIT $1`,
		readAround: part(`id < $2`, 4) + ` UNION ALL ` + part(`id > $3`, 4) + ` ORDER BY 1 LIMIT $1`,
		// The sub-select makes the multirange an InitPlan, parsed once.
		readAroundGaps: part(`id < $2`, 5) + ` UNION ALL ` +
			part(`id > $2 AND id < $3 AND NOT ((SELECT $4::text::int8multirange) @> id)`, 5) + ` UNION ALL ` +
			part(`id > $3`, 5) + ` ORDER BY 1 LIMIT $1`,
	}
}

// multirange renders ids as an int8multirange literal of consecutive runs.
func multirange(set map[int64]struct{}) string {
	ids := make([]int64, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "[%d,%d]", ids[i], ids[j])
		i = j + 1
	}
	b.WriteByte('}')
	return b.String()
}

// Commit deletes the acknowledged rows. A lost connection keeps them for
// the next Poll (still excluded from reads, so they are not sent twice).
func (t *Task) Commit(ctx context.Context, acked []connect.SourceRecord) error {
	if len(acked) == 0 {
		return nil
	}
	ids := make([]int64, 0, len(acked))
	for _, r := range acked {
		switch id := r.SourceOffset["id"].(type) {
		case int64:
			ids = append(ids, id)
		case float64:
			ids = append(ids, int64(id))
		case json.Number:
			n, _ := id.Int64()
			ids = append(ids, n)
		}
	}
	for _, id := range ids {
		delete(t.inflight, id)
	}
	if _, err := t.deleteIDs(ctx, ids); err != nil {
		if ctx.Err() != nil {
			// Stopping: the next instance's reads skip nothing, and these
			// rows are delivered again (at-least-once).
			t.pendingDelete = append(t.pendingDelete, ids...)
			return nil
		}
		if !transient(err) {
			t.pendingDelete = append(t.pendingDelete, ids...)
			return fmt.Errorf("deleting %d delivered rows from the audit table %s.%s: %w", len(ids), t.s.auditSchema, t.n.table, err)
		}
		t.pendingDelete = append(t.pendingDelete, ids...)
		t.host.Logger.Warn("deleting delivered rows failed; retrying on the next poll (they are not sent again meanwhile)", "error", err, "rows", len(ids))
	}
	return nil
}

// deleteIDs deletes delivered rows: one index range scan when the ids are
// consecutive (the usual case), else an id list.
func (t *Task) deleteIDs(ctx context.Context, ids []int64) (pgconn.CommandTag, error) {
	lo, hi := slices.Min(ids), slices.Max(ids)
	if hi-lo+1 == int64(len(ids)) && len(ids) == len(uniq(ids)) {
		return t.pool.Exec(ctx, t.deleteRangeSQL, lo, hi)
	}
	return t.pool.Exec(ctx, t.deleteSQL, ids)
}

func uniq(ids []int64) map[int64]struct{} {
	m := make(map[int64]struct{}, len(ids))
	for _, id := range ids {
		m[id] = struct{}{}
	}
	return m
}

// stopContext returns the context Stop cancels, creating it on first use.
func (t *Task) stopContext() context.Context {
	t.stopMu.Lock()
	defer t.stopMu.Unlock()
	if t.stopCtx == nil {
		t.stopCtx, t.stopCancel = context.WithCancel(context.Background())
	}
	return t.stopCtx
}

// Stop interrupts a blocking Poll or a running Start; the connections stay
// open until Stopped.
func (t *Task) Stop(bool) {
	t.stopContext()
	t.stopMu.Lock()
	t.stopCancel()
	t.stopMu.Unlock()
}

// Stopped closes the LISTEN connection and the pool. Tasks own no objects:
// the connector drops them on deletion.
func (t *Task) Stopped(ctx context.Context) error {
	t.closeOnce.Do(func() {
		t.Stop(false)
		if t.listener != nil {
			_ = t.listener.Close(ctx)
			t.listener = nil
		}
		if t.pool != nil {
			if t.waiting {
				// No NOTIFYs for a task that is gone; best effort (a row
				// left behind only costs writers needless NOTIFYs).
				uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, _ = t.pool.Exec(uctx, t.unmarkSQL, t.host.Task)
				cancel()
			}
			t.pool.Close()
		}
	})
	return nil
}

// key is the row's primary key as a JSON object, or nil.
func (m *tableMeta) key(op string, before, after []byte) []byte {
	if len(m.pkCols) == 0 || op == "t" {
		return nil
	}
	img := after
	if img == nil {
		img = before
	}
	var cols map[string]json.RawMessage
	if err := json.Unmarshal(img, &cols); err != nil {
		return nil
	}
	out := make([]byte, 0, 32)
	out = append(out, '{')
	for i, c := range m.pkCols {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, m.pkJSON[i]...)
		out = append(out, ':')
		if v, ok := cols[c]; ok {
			out = append(out, v...)
		} else {
			out = append(out, "null"...)
		}
	}
	return append(out, '}')
}

// envelope is the record value:
// {"op","before","after","source":{connector,db,schema,table,txid,seq},"ts_ms"}.
func (m *tableMeta) envelope(op string, before, after []byte, txid string, seq, tsMS int64) []byte {
	out := make([]byte, 0, 96+len(m.source)+len(before)+len(after))
	out = append(out, `{"op":"`...)
	out = append(out, op...)
	out = append(out, `","before":`...)
	out = appendRaw(out, before)
	out = append(out, `,"after":`...)
	out = appendRaw(out, after)
	out = append(out, `,"source":`...)
	out = append(out, m.source...)
	out = append(out, `"txid":`...)
	out = append(out, txid...)
	out = append(out, `,"seq":`...)
	out = strconv.AppendInt(out, seq, 10)
	out = append(out, `},"ts_ms":`...)
	out = strconv.AppendInt(out, tsMS, 10)
	return append(out, '}')
}

func appendRaw(out, v []byte) []byte {
	if v == nil {
		return append(out, "null"...)
	}
	return append(out, v...)
}

func appendJSONString(out []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(out, b...)
}
