package pgaudit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
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
	// metaAt is when the batch tables' meta was last read (metaRefresh).
	metaAt time.Time
	// capturedAt is when the task last checked that its tables still have
	// the connector's capture triggers (captureCheckInterval).
	capturedAt time.Time
	// unmark clears the waiting mark when no Poll follows an interrupted
	// one within unmarkDelay (a pause); unmarked is closed once its
	// function has run. The next Poll and Stopped stop it or wait for it.
	unmark   *time.Timer
	unmarked chan struct{}

	selectSQL      [3]string // by readKind
	deleteSQL      string
	deleteRangeSQL string
	progressSQL    string
	lockWakeupSQL  string
	markSQL        string
	unmarkSQL      string
	pruneSQL       string
	countSQL       string
	taskCount      int // tasks of the connector; rows of higher task ids are stale

	// mark is what this task's row in the wakeup table says: while it
	// says waiting the capture trigger sends NOTIFYs (it reads the count
	// of waiting rows that setWaiting keeps in the waiters sequence).
	// idleStep is the next wait without a notification, doubling up to
	// poll.interval.ms.
	mark       markState
	idleStep   time.Duration
	emptyReads int // reads that found nothing since the last change

	inflight        map[int64]*inflightRow // polled, neither deleted nor pending
	polled          []int64                // the ids of inflight, in Poll order
	buffered        []connect.SourceRecord // read and decoded, not yet returned by Poll
	pendingDelete   []int64                // acknowledged, DELETE not yet done
	pendingProgress map[int64]int          // partly acknowledged rows: delivered count not yet written
	backoff         time.Duration
	readFailed      bool // the last read failed (retryLater)
	closeOnce       sync.Once

	// auditTable and snapshotTable are the quoted names of the audit
	// table and of the incremental snapshots' progress table;
	// snapshotPending is true until copyChunk found nothing left to copy
	// (snapshot.mode=incremental), at snapshotCheckedAt; it looks again
	// snapshotRecheck later, for copies asked for by hand.
	auditTable, snapshotTable string
	snapshotPending           bool
	snapshotCheckedAt         time.Time
	// chunkRetryAt is when a chunk that gave way is tried again;
	// chunkGaveWay counts the chunks that gave way in a row.
	chunkRetryAt time.Time
	chunkGaveWay int
	// chunkPages is how many pages the next chunk of relation chunkRelid
	// copies (chunkPagesFor).
	chunkRelid uint32
	chunkPages int64
	// chunkSkip lists the relations whose chunks gave way, the longest
	// ago first: tried last, in that order.
	chunkSkip []uint32
	// copyNext: the last Poll returned a batch that was not full, so the
	// next one copies a chunk before it reads.
	copyNext bool
	// marksClearedAt is when a task without wake-ups (wakeup.notify=false)
	// last made sure that no wake-up mark is set (marksRecheck).
	marksClearedAt time.Time

	// lg is set under capture.method=logical, which uses only pool, db,
	// meta and metaAt of the above.
	lg *logicalState
}

var _ connect.SourceTask = (*Task)(nil)

// tableMeta is what records of one table share.
type tableMeta struct {
	table     string // quoted, for messages
	topic     string
	partition map[string]any
	source    []byte   // `{"connector":..,"db":..,"schema":..,"table":..,`
	pkJSON    [][]byte // quoted primary-key column names; nil: no key
	pkCols    []string
	// customKey: pkCols come from message.key.columns, whose values may
	// be null (a primary key's never are).
	customKey bool
	// excluded: column.exclude.list's columns of the table, left out of
	// the images (not out of the key).
	excluded map[string]bool

	// rowType and arrayType are the OIDs of the table's row type and its
	// array type (0 when the table is gone); columns its live columns. The
	// task decodes row images with them.
	rowType, arrayType uint32
	columns            []column
	// stable counts the leading live columns before the first dropped one:
	// an image written before a column was dropped has that column's value
	// at its position, so only columns before it line up by position.
	stable int
}

// inflightRow is an audit row whose changes were polled and not all
// acknowledged yet.
type inflightRow struct {
	changes   int    // changes in the row
	delivered int    // leading changes Kafka acknowledged (or had before this read)
	written   int    // delivered as last written to the row
	acked     []bool // by index, beyond delivered; nil for a one-change row
	// unacked counts, by change index, the records of a change made of
	// several (a delete and its tombstone; a key change's delete,
	// tombstone and create) not acknowledged yet. The worker's final
	// commit passes records acknowledged on one Kafka partition past one
	// refused on another, and a key change's create has another key than
	// its delete: the last record alone must not deliver the change.
	unacked map[int]int
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
	if s.logical {
		return t.startLogical(ctx, s, cfg[keyTaskTableOIDs])
	}
	if v := cfg[keyTaskTables]; v != "" {
		ts, err := parseTables(v)
		if err != nil {
			return fmt.Errorf("task configuration %s: %w", keyTaskTables, err)
		}
		t.tables = ts
	}
	t.all = len(t.tables) == len(s.tables)
	// Without the key (task configs of an earlier version) no row counts
	// as stale.
	t.taskCount = math.MaxInt32
	if v, ok := cfg[keyTaskCount]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("task configuration %s: %q is not a positive task count", keyTaskCount, v)
		}
		t.taskCount = n
	}
	t.inflight = map[int64]*inflightRow{}
	t.polled = nil
	t.pendingProgress = map[int64]int{}

	pool, err := newTaskPool(s, t.host.Task)
	if err != nil {
		return err
	}
	t.pool = pool
	if err := t.pool.QueryRow(ctx, `SELECT current_database()::text`).Scan(&t.db); err != nil {
		return fmt.Errorf("connecting to PostgreSQL at %s (check %s and that the server is up): %w", connect.MaskCredentials(t.s.url), KeyURL, err)
	}
	t.meta = map[tableName]*tableMeta{}
	if err := t.loadMeta(ctx, t.tables, false); err != nil {
		return err
	}
	at := pgx.Identifier{s.auditSchema, t.n.table}.Sanitize()
	t.auditTable = at
	t.snapshotTable = pgx.Identifier{s.auditSchema, t.n.snapshot}.Sanitize()
	t.snapshotPending = s.incremental
	t.selectSQL = readQueries(at, t.all)
	t.deleteSQL = `DELETE FROM ` + at + ` WHERE id = ANY($1::bigint[])`
	t.deleteRangeSQL = `DELETE FROM ` + at + ` WHERE id BETWEEN $1 AND $2`
	t.progressSQL = `UPDATE ` + at + ` AS a SET delivered = v.n FROM unnest($1::bigint[], $2::int[]) AS v(id, n) WHERE a.id = v.id`
	wt := pgx.Identifier{s.auditSchema, t.n.wakeup}.Sanitize()
	t.lockWakeupSQL = `LOCK TABLE ` + wt + ` IN EXCLUSIVE MODE`
	t.markSQL = `INSERT INTO ` + wt + ` (task, waiting) VALUES ($1, $2) ON CONFLICT (task) DO UPDATE SET waiting = excluded.waiting`
	t.unmarkSQL = `DELETE FROM ` + wt + ` WHERE task = $1`
	// A task killed while waiting leaves its row saying so; once the
	// connector runs fewer tasks, nothing would clear it.
	t.pruneSQL = `DELETE FROM ` + wt + ` WHERE task >= $1`
	t.countSQL = `SELECT pg_catalog.setval(` + quoteLiteral(pgx.Identifier{s.auditSchema, t.n.waiters}.Sanitize()) + `::pg_catalog.regclass, (SELECT count(*) FROM ` + wt + ` WHERE waiting), true)`
	t.mark = markUnknown // a row left by an earlier run of this task may say waiting
	if !s.notify {
		// Polling only: a row an earlier run (or a task no longer
		// configured) left saying waiting would keep writers notifying,
		// and a NOTIFY makes a writer's PREPARE TRANSACTION fail.
		if err := t.setWaiting(ctx, false, false); err != nil {
			return fmt.Errorf("clearing the wake-up marks in %s.%s (%s=false): %w", s.auditSchema, t.n.wakeup, KeyWakeupNotify, err)
		}
		t.mark = markClear
		t.marksClearedAt = time.Now()
	} else if err := t.listen(ctx); err != nil {
		return err
	}
	t.host.Logger.Info("task started", "tables", len(t.tables))
	return nil
}

// loadMeta (re)reads what decoding and keying the tables' changes needs:
// primary key, row type and live columns. keepGone keeps what is known of
// a table no longer found under its name (renamed while the task runs:
// its changes still come, filed under the old name, and keyed by the key
// read before).
func (t *Task) loadMeta(ctx context.Context, tables []tableName, keepGone bool) error {
	schemas, names := splitNames(tables)
	oids, oidSchemas, oidNames := []int64{}, []string{}, []string{}
	if t.lg != nil {
		for oid, tb := range t.lg.byOID {
			oids, oidSchemas, oidNames = append(oids, int64(oid)), append(oidSchemas, tb.Schema), append(oidNames, tb.Name)
		}
	}
	rows, err := t.pool.Query(ctx, `
SELECT x.s, x.n, coalesce((
  SELECT array_agg(a.attname::text ORDER BY k.ord)
  FROM pg_catalog.pg_index i
  CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
  -- its key columns: an INCLUDE column is not part of the key
  WHERE i.indrelid = c.oid AND i.indisprimary AND k.ord <= i.indnkeyatts), '{}'),
  coalesce(c.reltype, 0)::int8, coalesce(ty.typarray, 0)::int8,
  coalesce((SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
            WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
  coalesce((SELECT array_agg(a.atttypid::int8 ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
            WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
  (SELECT count(*) FROM pg_catalog.pg_attribute a
   WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     AND a.attnum < coalesce((SELECT min(d.attnum) FROM pg_catalog.pg_attribute d
                              WHERE d.attrelid = c.oid AND d.attnum > 0 AND d.attisdropped), 32767))
FROM unnest($1::text[], $2::text[]) AS x(s, n)
-- The table of that name, else the table whose capture trigger files its
-- changes under it: a captured table renamed (or moved to another schema)
-- while the connector runs, until the configuration follows. A task
-- started meanwhile would otherwise know neither its key nor the columns
-- of the changes written before the rename (docs/decisions/0049).
-- The table of that name wins only while its own capture trigger files
-- under the name: a table made under the old name of a renamed one is not
-- where the waiting (and later) changes come from, and its columns and key
-- would decode them wrongly. COALESCE scans the triggers only for a name
-- that is gone or taken over; the first lookup uses pg_trigger's index.
LEFT JOIN pg_catalog.pg_class c ON c.oid = coalesce(
  -- Under capture.method=logical: the table in the publication under
  -- this configured name, wherever it was renamed to since.
  (SELECT r.oid FROM unnest($5::int8[], $6::text[], $7::text[]) AS o(oid, s, n)
   JOIN pg_catalog.pg_class r ON r.oid = o.oid::oid WHERE o.s = x.s AND o.n = x.n),
  (SELECT r.oid FROM pg_catalog.pg_class r JOIN pg_catalog.pg_namespace ns ON ns.oid = r.relnamespace
   WHERE ns.nspname = x.s AND r.relname = x.n
     AND EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg
                 WHERE tg.tgrelid = r.oid AND tg.tgparentid = 0 AND NOT tg.tgisinternal
                   AND tg.tgfoid IN (pg_catalog.to_regprocedure($3), pg_catalog.to_regprocedure($4))
                   AND tg.tgargs = pg_catalog.convert_to(x.s, pg_catalog.getdatabaseencoding()) || '\x00'::bytea
                                   || pg_catalog.convert_to(x.n, pg_catalog.getdatabaseencoding()) || '\x00'::bytea)),
  (SELECT tg.tgrelid FROM pg_catalog.pg_trigger tg
   WHERE tg.tgparentid = 0 AND NOT tg.tgisinternal
     AND tg.tgfoid IN (pg_catalog.to_regprocedure($3), pg_catalog.to_regprocedure($4))
     AND tg.tgargs = pg_catalog.convert_to(x.s, pg_catalog.getdatabaseencoding()) || '\x00'::bytea
                     || pg_catalog.convert_to(x.n, pg_catalog.getdatabaseencoding()) || '\x00'::bytea
   ORDER BY tg.tgrelid LIMIT 1),
  (SELECT r.oid FROM pg_catalog.pg_class r JOIN pg_catalog.pg_namespace ns ON ns.oid = r.relnamespace
   WHERE ns.nspname = x.s AND r.relname = x.n))
LEFT JOIN pg_catalog.pg_type ty ON ty.oid = c.reltype`, schemas, names,
		pgx.Identifier{t.s.auditSchema, t.n.function}.Sanitize()+"()",
		pgx.Identifier{t.s.auditSchema, t.n.rowFunction}.Sanitize()+"()", oids, oidSchemas, oidNames)
	if err != nil {
		return fmt.Errorf("reading the primary keys and columns of the captured tables: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			tb                 tableName
			pk, colNames       []string
			rowType, arrayType int64
			colTypes           []int64
			stable             int64
		)
		if err := rows.Scan(&tb.Schema, &tb.Name, &pk, &rowType, &arrayType, &colNames, &colTypes, &stable); err != nil {
			return err
		}
		if _, known := t.meta[tb]; known && keepGone && rowType == 0 {
			continue
		}
		cols, custom := t.s.keyColumns[tb]
		if custom {
			pk = cols
		}
		m := t.newMeta(tb, pk)
		m.customKey = custom
		m.excluded = t.s.excluded[tb]
		m.rowType, m.arrayType = uint32(rowType), uint32(arrayType)
		m.stable = int(stable)
		for i, n := range colNames {
			m.columns = append(m.columns, column{name: n, oid: uint32(colTypes[i])})
		}
		t.meta[tb] = m
	}
	return rows.Err()
}

func (t *Task) newMeta(tb tableName, pk []string) *tableMeta {
	m := &tableMeta{
		table:     tb.quoted(),
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
	if t.lg != nil {
		return t.logicalPoll(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(t.stopContext(), cancel)
	defer stop()

	t.cancelUnmark()
	// Interrupted: by the runtime (a Commit, a pause, a stop), or by Stop
	// itself, whichever cancellation arrived first.
	interrupted := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return t.stopContext().Err()
	}
	interval := time.Duration(t.s.pollInterval) * time.Millisecond
	deadline := time.Now().Add(interval)
	// chunk copies the next chunk of an incremental snapshot; stop says
	// the Poll returns (nil, err).
	chunk := func() (copied, stop bool, err error) {
		copied, again, err := t.chunkStep(ctx, interval)
		switch {
		case err != nil && interrupted() != nil:
			t.scheduleUnmark()
			return false, true, interrupted()
		case err != nil:
			return false, true, err
		}
		return copied, again, nil
	}
	if t.copyNext && t.snapshotPending && !time.Now().Before(t.chunkRetryAt) {
		// The task keeps up with the changes (its last batch was not
		// full) but may never find the audit table empty: a chunk before
		// each read, so that a steady stream does not hold the snapshot
		// back. A task that falls behind reads full batches and copies
		// only once it has caught up.
		t.copyNext = false
		if _, stop, err := chunk(); stop {
			return nil, err
		}
	}
	for {
		if err := interrupted(); err != nil {
			t.scheduleUnmark()
			return nil, err
		}
		if time.Since(t.capturedAt) >= captureCheckInterval {
			if err := t.checkCapture(ctx); err != nil {
				return nil, err
			}
		}
		recs, err := t.pollOnce(ctx)
		if err != nil {
			if err := interrupted(); err != nil {
				t.scheduleUnmark()
				return nil, err
			}
			if !transient(err) {
				return nil, fmt.Errorf("reading the audit table %s.%s: %w", t.s.auditSchema, t.n.table, err)
			}
			t.readFailed = true
			t.retryLater(ctx, "reading the audit table", err)
			return nil, nil
		}
		if t.readFailed {
			// The database answers again, also to an idle task: the next
			// outage backs off from the first step. (Not on every read: a
			// LISTEN connection that cannot be reopened while reads work,
			// connection slots used up, keeps backing off.)
			t.readFailed, t.backoff = false, 0
		}
		if recs != nil {
			t.backoff = 0
			t.copyNext = len(recs) > 0 && len(recs) < t.s.pollMax
			if len(recs) > 0 {
				t.host.Logger.Debug("read changes from the audit table", "records", len(recs), "rows_in_flight", len(t.inflight))
				t.idleStep = 0
				t.emptyReads = 0
				if t.mark != markClear {
					// Busy again: writers need not notify. After a failure
					// the row and the count are unknown (setval is not
					// transactional): the next wait marks and recounts.
					// Not under Poll's context: interrupted (a pause) after
					// reading, the mark would stay for the whole pause.
					uctx, cancel := context.WithTimeout(t.stopContext(), 2*time.Second)
					t.mark = markUnknown
					if err := t.setWaiting(uctx, false, false); err == nil {
						t.mark = markClear
					} else if interrupted() != nil {
						t.scheduleUnmark() // try again if no Poll follows
					}
					cancel()
				}
			}
			return recs, nil
		}
		if t.s.incremental && !t.snapshotPending && time.Since(t.snapshotCheckedAt) >= snapshotRecheck {
			t.snapshotPending = true
		}
		if t.snapshotPending && !time.Now().Before(t.chunkRetryAt) {
			// Nothing waiting: copy the next chunk of an incremental
			// snapshot, and read it.
			copied, stop, err := chunk()
			switch {
			case stop:
				return nil, err
			case copied && time.Now().Before(deadline):
				continue
			case copied:
				return nil, nil // the next Poll reads it
			}
		}
		if !time.Now().Before(deadline) {
			return nil, nil
		}
		if !t.s.notify && t.emptyReads >= spinReads {
			// No NOTIFYs (wakeup.notify=false): read again at the
			// deadline. Now and then, clear marks that an older instance
			// of a task, still stopping when this one cleared them at
			// Start, set since: writers would NOTIFY again.
			if time.Since(t.marksClearedAt) >= marksRecheck {
				t.marksClearedAt = time.Now()
				var waiters *int64
				err := t.pool.QueryRow(ctx, `SELECT pg_catalog.pg_sequence_last_value($1::pg_catalog.regclass)`, pgx.Identifier{t.s.auditSchema, t.n.waiters}.Sanitize()).Scan(&waiters)
				if err == nil && (waiters == nil || *waiters > 0) {
					err = t.setWaiting(ctx, false, false)
				}
				if err != nil && interrupted() == nil {
					t.host.Logger.Warn("clearing wake-up marks left by another instance failed; retrying later", "error", err)
				}
			}
			if err := sleepCtx(ctx, time.Until(deadline)); err != nil {
				return nil, err
			}
			continue
		}
		if t.mark != markWaiting && t.emptyReads < spinReads {
			// Just drained: under a steady stream the next change is a few
			// milliseconds away. Reading again shortly, rather than asking
			// writers for NOTIFYs at once, spares them the NOTIFY's
			// database-wide commit lock and the mark's two updates.
			t.emptyReads++
			if err := sleepCtx(ctx, spinWait); err != nil {
				t.scheduleUnmark()
				return nil, err
			}
			continue
		}
		if t.mark != markWaiting {
			// Ask for NOTIFYs, then read once more: a change committed
			// before the mark was visible would otherwise wait.
			t.mark = markUnknown
			if err := t.setWaiting(ctx, true, false); err != nil {
				if err := interrupted(); err != nil {
					t.scheduleUnmark()
					return nil, err
				}
				if !transient(err) {
					return nil, fmt.Errorf("marking task %d as waiting in %s.%s: %w", t.host.Task, t.s.auditSchema, t.n.wakeup, err)
				}
				t.retryLater(ctx, "marking the task as waiting", err)
				return nil, nil
			}
			t.mark = markWaiting
			t.host.Logger.Debug("audit table drained; waiting for a NOTIFY or the poll interval", "poll_interval", interval)
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

// unmarkDelay is how long after an interrupted Poll the task's waiting
// mark stays when no Poll follows; marksRecheck is how often a task
// without wake-ups makes sure no mark is set (variables for tests).
var (
	unmarkDelay  = 500 * time.Millisecond
	marksRecheck = 10 * time.Second
)

// scheduleUnmark clears the task's waiting mark if no Poll follows an
// interrupted one within unmarkDelay: the runtime interrupts a waiting Poll
// to commit and polls again at once, but a paused task is not polled for
// long, and meanwhile every capturing commit would send a NOTIFY, whose
// lock makes concurrent writers take turns (docs/decisions/0041). Best
// effort: a failure leaves the mark, which only costs NOTIFYs.
func (t *Task) scheduleUnmark() {
	if t.mark == markClear || t.stopContext().Err() != nil || t.pool == nil {
		return // Stopped clears it
	}
	done := make(chan struct{})
	t.unmarked = done
	t.unmark = time.AfterFunc(unmarkDelay, func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(t.stopContext(), 2*time.Second)
		defer cancel()
		t.mark = markUnknown
		if err := t.setWaiting(ctx, false, false); err == nil {
			t.mark = markClear
		}
	})
}

// cancelUnmark stops a scheduled unmark, or waits for it to finish.
func (t *Task) cancelUnmark() {
	if t.unmark == nil {
		return
	}
	if !t.unmark.Stop() {
		<-t.unmarked
	}
	t.unmark, t.unmarked = nil, nil
}

// markState is what a task's row in the wakeup table says, as far as the
// task knows.
type markState int8

const (
	markClear   markState = iota // not waiting, or no row
	markUnknown                  // mark or clear it again before relying on it
	markWaiting
)

// setWaiting records in the wakeup table whether this task waits for
// NOTIFYs (remove: the task is going away) and sets the waiters sequence,
// which writers read, to the number of waiting rows. The table lock orders
// the tasks' recounts, so each count sees every earlier one committed:
// while a task waits, the sequence is never 0.
func (t *Task) setWaiting(ctx context.Context, waiting, remove bool) error {
	return pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
		// The lock goes first, on its own: preparing the batch's statements
		// already takes the table's lighter locks, and two tasks holding
		// those while asking for this one deadlock.
		if _, err := tx.Exec(ctx, t.lockWakeupSQL); err != nil {
			return err
		}
		b := &pgx.Batch{}
		if remove {
			// Only its own row: a stopping instance may belong to an older
			// generation of tasks (one that returned late) with a lower
			// task count, and must not prune the rows of newer tasks.
			b.Queue(t.unmarkSQL, t.host.Task)
		} else {
			b.Queue(t.markSQL, t.host.Task, waiting)
			b.Queue(t.pruneSQL, t.taskCount)
		}
		b.Queue(t.countSQL)
		return tx.SendBatch(ctx, b).Close()
	})
}

// retryLater logs a lost connection and waits the next backoff step.
func (t *Task) retryLater(ctx context.Context, what string, err error) {
	t.backoff = min(max(2*t.backoff, 100*time.Millisecond), 5*time.Second)
	t.host.Logger.Warn(what+" failed; retrying (the database may be down or restarting)", "error", err, "retry_in", t.backoff)
	_ = sleepCtx(ctx, t.backoff)
}

// interruptGrace is how long an interrupted Poll may go on reading and
// decoding its batch (a variable for tests).
var interruptGrace = 10 * time.Second

// listenConnectTimeout bounds reopening the LISTEN connection.
const listenConnectTimeout = 10 * time.Second

// wait blocks until a notification arrives, the deadline passes or ctx is
// done. A broken LISTEN connection is reopened; notifications sent meanwhile
// are lost, so the caller polls again either way.
func (t *Task) wait(ctx context.Context, deadline time.Time) {
	if t.listener == nil || t.listener.IsClosed() {
		if t.listener != nil {
			_ = t.listener.Close(context.WithoutCancel(ctx))
			t.listener = nil
		}
		// Connecting gets its own time: the wait may be a few
		// milliseconds, less than connecting to a remote server takes,
		// and the connection would never come back.
		connectBy := deadline
		if least := time.Now().Add(listenConnectTimeout); connectBy.Before(least) {
			connectBy = least
		}
		lctx, cancel := context.WithDeadline(ctx, connectBy)
		err := t.listen(lctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				t.retryLater(ctx, "reopening the LISTEN connection", err)
			}
			return
		}
		// Mark again before the next wait: after a crash the unlogged
		// wakeup table is empty and the waiters count may be stale.
		t.mark = markUnknown
		return // poll at once: notifications were lost while disconnected
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	_, _ = t.listener.WaitForNotification(wctx)
}

func (t *Task) pollOnce(ctx context.Context) ([]connect.SourceRecord, error) {
	if err := t.flushPending(ctx); err != nil {
		return nil, err
	}
	if len(t.buffered) > 0 {
		return t.takeBuffered(), nil
	}
	open := 0
	for _, r := range t.inflight {
		open += r.changes - r.delivered
	}
	if open >= maxInflightBatches*t.s.pollMax {
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
			kind, args = readAroundGaps, append(args, multirange(ids))
		}
	}
	if !t.all {
		schemas, names := splitNames(t.tables)
		args = append(args, schemas, names)
	}
	// Reading and decoding a batch runs on when the Poll is interrupted
	// for a Commit (the worker cancels a Poll once an ack arrives): cut
	// off and redone, a batch of large rows could be cut off again. A Stop
	// cuts it short at once, an interruption after interruptGrace (a
	// server that stopped answering must not hold a pause back).
	wctx, wcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer wcancel()
	defer context.AfterFunc(t.stopContext(), wcancel)()
	defer context.AfterFunc(ctx, func() {
		grace := time.AfterFunc(interruptGrace, wcancel)
		context.AfterFunc(wctx, func() { grace.Stop() })
	})()
	raws, err := t.read(wctx, t.selectSQL[kind], args)
	if err != nil || len(raws) == 0 {
		return nil, err
	}
	recs, err := t.records(wctx, raws)
	if err != nil {
		return nil, err
	}
	for _, r := range raws {
		row := &inflightRow{changes: 1, delivered: r.delivered, written: r.delivered}
		if r.changes > 0 {
			row.changes = r.changes
			row.acked = make([]bool, r.changes)
		}
		t.inflight[r.id] = row
		t.polled = append(t.polled, r.id)
	}
	if t.s.tombstones { // the only source of changes of several records
		for _, rec := range recs {
			if _, ok := rec.SourceOffset[offsetPart]; !ok {
				continue
			}
			row := t.inflight[offsetInt(rec.SourceOffset["id"])]
			if row.unacked == nil {
				row.unacked = map[int]int{}
			}
			idx := int(offsetInt(rec.SourceOffset["idx"]))
			if row.unacked[idx] == 0 {
				row.unacked[idx] = 1 // the change's last record
			}
			row.unacked[idx]++
		}
	}
	t.buffered = recs
	return t.takeBuffered(), nil
}

// takeBuffered returns the next batch of at most poll.max.records.
func (t *Task) takeBuffered() []connect.SourceRecord {
	n := min(len(t.buffered), t.s.pollMax)
	batch := t.buffered[:n:n]
	t.buffered = t.buffered[n:]
	if len(t.buffered) == 0 {
		t.buffered = nil
	}
	return batch
}

// auditRow is one row read from the audit table.
type auditRow struct {
	id, tsMS      int64
	txid, op      string
	table         tableName
	image         tableName // whose row type the images have: table, or its partition
	changes       int       // 0: one change with record images; else N grouped changes
	delivered     int
	before, after []byte
}

func (t *Task) read(ctx context.Context, sql string, args []any) ([]auditRow, error) {
	rows, err := t.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var raws []auditRow
	for rows.Next() {
		var (
			r                   auditRow
			changes, delivered  *int32
			imgSchema, imgTable *string
		)
		if err := rows.Scan(&r.id, &r.txid, &r.tsMS, &r.table.Schema, &r.table.Name, &r.op, &changes, &delivered, &r.before, &r.after, &imgSchema, &imgTable); err != nil {
			return nil, err
		}
		r.image = r.table
		if imgSchema != nil && imgTable != nil {
			r.image = tableName{*imgSchema, *imgTable}
		}
		if changes != nil {
			r.changes = int(*changes)
		}
		if delivered != nil {
			r.delivered = int(*delivered)
		}
		raws = append(raws, r)
	}
	return raws, rows.Err()
}

// records turns audit rows into records, decoding their images table by
// table with one statement each.
func (t *Task) records(ctx context.Context, raws []auditRow) ([]connect.SourceRecord, error) {
	type change struct {
		row           *auditRow
		idx           int
		before, after int // index into the table's images; -1: none
	}
	// Images are decoded by the table whose row type they have: for a
	// partitioned table, the partition the row was in.
	images := map[tableName][][]byte{}
	imageRows := map[tableName][]int64{} // the audit row of each image, for errors
	imageOf := map[tableName]tableName{} // image table -> a configured table it belongs to
	addImage := func(r *auditRow, img []byte) int {
		if img == nil {
			return -1
		}
		images[r.image] = append(images[r.image], img)
		imageRows[r.image] = append(imageRows[r.image], r.id)
		return len(images[r.image]) - 1
	}
	var (
		changes []change
		missing []tableName
	)
	// A primary key added, dropped or changed since it was read reaches
	// the keys within metaRefresh.
	// Every table's, not only this batch's: a table whose changes are rare
	// would keep a changed key until one of them happened to be in the
	// batch a refresh fell due in.
	refresh := len(raws) > 0 && time.Since(t.metaAt) > metaRefresh
	if refresh {
		for tb := range t.meta {
			missing = append(missing, tb)
		}
	}
	for i := range raws {
		r := &raws[i]
		for _, tb := range []tableName{r.table, r.image} {
			if _, ok := t.meta[tb]; !ok && !slices.Contains(missing, tb) {
				// A table added by a reconfiguration this task was not told
				// about yet, or a partition of a captured table.
				missing = append(missing, tb)
			}
		}
		if _, ok := imageOf[r.image]; !ok {
			imageOf[r.image] = r.table
		}
		if r.changes == 0 {
			changes = append(changes, change{r, 0, addImage(r, r.before), addImage(r, r.after)})
			continue
		}
		var befores, afters [][]byte
		var err error
		if r.before != nil {
			if befores, err = arrayElements(r.before); err != nil {
				return nil, fmt.Errorf("audit row %d: before images: %w", r.id, err)
			}
		}
		if r.after != nil {
			if afters, err = arrayElements(r.after); err != nil {
				return nil, fmt.Errorf("audit row %d: after images: %w", r.id, err)
			}
		}
		if (r.before != nil && len(befores) != r.changes) || (r.after != nil && len(afters) != r.changes) {
			return nil, fmt.Errorf("audit row %d holds %d changes but %d before and %d after images", r.id, r.changes, len(befores), len(afters))
		}
		for k := r.delivered; k < r.changes; k++ {
			c := change{r, k, -1, -1}
			if befores != nil {
				c.before = addImage(r, befores[k])
			}
			if afters != nil {
				c.after = addImage(r, afters[k])
			}
			changes = append(changes, c)
		}
	}
	if len(missing) > 0 {
		if err := t.loadMeta(ctx, missing, true); err != nil {
			return nil, err
		}
	}
	if refresh {
		t.metaAt = time.Now()
	}
	decoded := make(map[tableName][][]byte, len(images))
	if len(images) > 0 {
		conn, err := t.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer conn.Release()
		for tb, imgs := range images {
			// A statement's parameters travel in one protocol message,
			// which cannot exceed 1 GB.
			jsons := make([][]byte, 0, len(imgs))
			for _, part := range byteBatches(imgs, decodeBatchBytes) {
				out, err := t.decode(ctx, conn.Conn().PgConn(), tb, imageOf[tb], part)
				if err != nil {
					// Named so that an operator can find the change that
					// cannot be read (docs: deleting it by id is the only
					// way past it, and loses it).
					ids := imageRows[tb][len(jsons) : len(jsons)+len(part)]
					if ie := (*imageError)(nil); errors.As(err, &ie) {
						ids = ids[ie.index : ie.index+1]
					}
					return nil, fmt.Errorf("a change of %s in audit %s: %w", tb, idRange(ids), err)
				}
				jsons = append(jsons, out...)
			}
			decoded[tb] = jsons
		}
	}
	recs := make([]connect.SourceRecord, 0, len(changes))
	var stale []int // records whose image lacks a key column
	for _, c := range changes {
		r := c.row
		m := t.meta[r.table]
		var before, after []byte
		if c.before >= 0 {
			before = decoded[r.image][c.before]
		}
		if c.after >= 0 {
			after = decoded[r.image][c.after]
		}
		key, complete := m.key(r.op, before, after)
		if !complete {
			stale = append(stale, len(recs))
		}
		recs = append(recs, connect.SourceRecord{
			SourcePartition: m.partition,
			SourceOffset:    map[string]any{"id": r.id, "idx": c.idx, "txid": r.txid},
			Topic:           m.topic,
			Partition:       -1,
			Key:             key,
			Value:           m.envelope(r.op, before, after, r.txid, r.id*seqPerRow+int64(c.idx), r.tsMS),
			Timestamp:       time.UnixMilli(r.tsMS),
		})
	}
	err := t.rekeyStale(ctx, recs, stale, func(i int) (tableName, string, []byte, []byte) {
		c := changes[i]
		var before, after []byte
		if c.before >= 0 {
			before = decoded[c.row.image][c.before]
		}
		if c.after >= 0 {
			after = decoded[c.row.image][c.after]
		}
		return c.row.table, c.row.op, before, after
	})
	if err != nil {
		return nil, err
	}
	if t.s.tombstones {
		recs = withTombstones(recs, func(i int) recordChange {
			c := changes[i]
			rc := recordChange{op: c.row.op, m: t.meta[c.row.table], txid: c.row.txid, seq: c.row.id*seqPerRow + int64(c.idx), tsMS: c.row.tsMS}
			if c.before >= 0 {
				rc.before = decoded[c.row.image][c.before]
			}
			if c.after >= 0 {
				rc.after = decoded[c.row.image][c.after]
			}
			return rc
		})
	}
	return recs, nil
}

// recordChange is what withTombstones needs of a record's change.
type recordChange struct {
	op            string
	before, after []byte
	m             *tableMeta
	txid          string
	seq, tsMS     int64
}

// offsetPart marks the source offset of a record that is not its change's
// last: Commit leaves the change undelivered until every one of its
// records (pollOnce counts them by this mark) is acknowledged, so that a
// restart between them sends them all again rather than leave the change
// half sent. They may be in different Poll batches, and a key change's on
// different Kafka partitions.
const offsetPart = "part"

// withTombstones applies tombstones.on.delete (Debezium's): after a delete,
// the key with a null value, so that log compaction can drop every record
// of the key. An update that changes the key becomes, as in Debezium, a
// delete under the old key, its tombstone and a create under the new one:
// one record under the new key would leave the old key's last record
// standing in a compacted topic. A change without a key (no primary key,
// or it lost its key column) has nothing to compact. change(i) describes
// the change of recs[i].
func withTombstones(recs []connect.SourceRecord, change func(i int) recordChange) []connect.SourceRecord {
	out := make([]connect.SourceRecord, 0, len(recs)+len(recs)/4)
	partOf := func(rec connect.SourceRecord) connect.SourceRecord {
		off := maps.Clone(rec.SourceOffset)
		off[offsetPart] = true
		rec.SourceOffset = off
		return rec
	}
	for i, rec := range recs {
		c := change(i)
		switch {
		case rec.Key == nil:
			out = append(out, rec)
		case c.op == "d":
			tomb := rec
			tomb.Value = nil
			out = append(out, partOf(rec), tomb)
		case c.op == "u":
			oldKey, complete := c.m.key("d", c.before, nil)
			if !complete || oldKey == nil || bytes.Equal(oldKey, rec.Key) {
				out = append(out, rec)
				continue
			}
			del := rec
			del.Key, del.Value = oldKey, c.m.envelope("d", c.before, nil, c.txid, c.seq, c.tsMS)
			tomb := del
			tomb.Value = nil
			create := rec
			create.Value = c.m.envelope("c", nil, c.after, c.txid, c.seq, c.tsMS)
			out = append(out, partOf(del), partOf(tomb), create)
		default:
			out = append(out, rec)
		}
	}
	return out
}

// idRange names the audit rows ids holds (in ascending order): "row 7",
// or "rows 7 to 9" when the change is one of a batch decoded together.
func idRange(ids []int64) string {
	if len(ids) == 0 {
		return "rows (none)"
	}
	if ids[0] == ids[len(ids)-1] {
		return "row " + strconv.FormatInt(ids[0], 10)
	}
	return fmt.Sprintf("rows %d to %d", ids[0], ids[len(ids)-1])
}

// decode turns row images of table tb into JSON. Images PostgreSQL no
// longer accepts as the table's row type were written before a column
// change: the table's columns are read again and the images decoded with
// them, column by column if still needed. Images of a partition that is
// gone since are decoded with the row type of captured, the partitioned
// table they were captured for (partitions have its columns, and usually
// in its order).
func (t *Task) decode(ctx context.Context, conn *pgconn.PgConn, tb, captured tableName, imgs [][]byte) ([][]byte, error) {
	m := t.meta[tb]
	if m.arrayType == 0 && tb != captured {
		m = t.meta[captured]
	}
	out, err := decodeRowType(ctx, conn, m, imgs)
	if err == nil || !shapeChanged(err) {
		return out, err
	}
	// What the task knew of the configured table is kept when the table
	// is gone (dropped while the task runs; a renamed one is found through
	// its trigger): its waiting changes were written with those columns.
	// Forgetting it named every column _column_<n> and nulled the keys. A
	// partition (tb other than captured) that is gone falls back to
	// captured's row type, as before.
	if tb != captured {
		if err := t.loadMeta(ctx, []tableName{tb}, false); err != nil {
			return nil, err
		}
	}
	if err := t.loadMeta(ctx, []tableName{captured}, true); err != nil {
		return nil, err
	}
	m = t.meta[tb]
	if m.arrayType == 0 && tb != captured {
		m = t.meta[captured]
	}
	if out, err = decodeRowType(ctx, conn, m, imgs); err == nil || !shapeChanged(err) {
		return out, err
	}
	t.host.Logger.Warn("decoding changes written before the table's columns changed: columns that still line up by position keep their names, others are named _column_<n>",
		"table", m.table, "changes", len(imgs), "reason", err)
	var excluded map[string]bool
	if cm := t.meta[captured]; cm != nil {
		excluded = cm.excluded // the configured table's, also for a partition's images
	}
	return decodeByColumns(ctx, conn, m, excluded, imgs)
}

// Read queries, by what is in flight (polled, not yet deleted).
const (
	readAll        = iota // nothing in flight
	readAround            // in flight: exactly the ids lo..hi ($2, $3)
	readAroundGaps        // in flight: some ids in lo..hi, listed in $4
)

// readBatchBytes bounds the images one Poll reads (a variable for tests):
// poll.max.records of large rows would otherwise all be held at once.
var readBatchBytes = 64 << 20

// readQueries builds the three read queries. Rows in flight must not be
// read again, and scanning past them costs as much as reading them, so the
// query reads below the in-flight ids (only late commits are still there:
// everything delivered below them is deleted), above them, and between
// them only when the in-flight ids have gaps a late commit could fill.
func readQueries(auditTable string, all bool) [3]string {
	const cols = `id, txid::text AS txid, (extract(epoch FROM ts) * 1000)::bigint AS ts_ms, schema_name, table_name, op::text AS op, changes, delivered, before, after, image_schema, image_table`
	filter := func(first int) string {
		if all {
			return ""
		}
		return fmt.Sprintf(` AND (schema_name, table_name) IN (SELECT * FROM unnest($%d::text[], $%d::text[]))`, first, first+1)
	}
	part := func(cond string, f int) string {
		return `(SELECT ` + cols + ` FROM ` + auditTable + ` WHERE ` + cond + filter(f) + ` ORDER BY id LIMIT $1)`
	}
	// At most $1 rows, and of those only as many as hold about $1
	// undelivered changes (a grouped row holds up to chunkChanges) and
	// about readBatchBytes of images (octet_length reads a stored value's
	// size without fetching it). The first row always.
	budget := func(q string) string {
		return `SELECT id, txid, ts_ms, schema_name, table_name, op, changes, delivered, before, after, image_schema, image_table FROM (
  SELECT q.*, sum(coalesce(q.changes, 1) - q.delivered) OVER (ORDER BY q.id) AS upto,
         sum(coalesce(octet_length(q.before), 0) + coalesce(octet_length(q.after), 0)) OVER (ORDER BY q.id) AS bytes FROM (` + q + `) q) w
WHERE w.upto - (coalesce(w.changes, 1) - w.delivered) < $1
  AND w.bytes - (coalesce(octet_length(w.before), 0) + coalesce(octet_length(w.after), 0)) < ` + strconv.Itoa(readBatchBytes) + ` ORDER BY w.id`
	}
	return [3]string{
		readAll:    budget(`SELECT ` + cols + ` FROM ` + auditTable + ` WHERE TRUE` + filter(2) + ` ORDER BY id LIMIT $1`),
		readAround: budget(part(`id < $2`, 4) + ` UNION ALL ` + part(`id > $3`, 4) + ` ORDER BY 1 LIMIT $1`),
		// The sub-select makes the multirange an InitPlan, parsed once.
		readAroundGaps: budget(part(`id < $2`, 5) + ` UNION ALL ` +
			part(`id > $2 AND id < $3 AND NOT ((SELECT $4::text::int8multirange) @> id)`, 5) + ` UNION ALL ` +
			part(`id > $3`, 5) + ` ORDER BY 1 LIMIT $1`),
	}
}

// multirange renders ids as an int8multirange literal of consecutive runs.
func multirange(ids []int64) string {
	ids = slices.Clone(ids)
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

// captureCheckInterval is how often a task checks that its tables still
// have the connector's capture triggers (a variable for tests).
var captureCheckInterval = 10 * time.Second

// checkCapture fails the task when a table it captures exists under its
// configured name without a capture trigger of this connector: dropped and
// made again, or swapped for another table (online schema-change tools
// rename the original away and a copy into its place). Its triggers went
// with the old table, so nothing written to the new one is captured, and
// only a Start installs them: silence would lose every later change. A
// name that is gone is no problem here (a rename: the trigger follows the
// table, docs/decisions/0049). A failed query is left to the next check.
func (t *Task) checkCapture(ctx context.Context) error {
	schemas, names := splitNames(t.tables)
	rows, err := t.pool.Query(ctx, `
SELECT x.s, x.n
FROM unnest($1::text[], $2::text[]) AS x(s, n)
JOIN pg_catalog.pg_namespace ns ON ns.nspname = x.s
-- a table: a view (or any other relation) under the name cannot have
-- been captured, and a Start refuses it rather than installing triggers
JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = x.n AND c.relkind IN ('r', 'p')
WHERE NOT EXISTS (
  SELECT 1 FROM pg_catalog.pg_trigger tg
  WHERE tg.tgrelid = c.oid AND tg.tgparentid = 0
    AND tg.tgfoid IN (pg_catalog.to_regprocedure($3), pg_catalog.to_regprocedure($4))
    -- a trigger made before triggers had arguments files under its table
    AND (tg.tgnargs = 0 OR tg.tgargs = pg_catalog.convert_to(x.s, pg_catalog.getdatabaseencoding()) || '\x00'::bytea
                                       || pg_catalog.convert_to(x.n, pg_catalog.getdatabaseencoding()) || '\x00'::bytea))
ORDER BY 1, 2`, schemas, names,
		pgx.Identifier{t.s.auditSchema, t.n.function}.Sanitize()+"()",
		pgx.Identifier{t.s.auditSchema, t.n.rowFunction}.Sanitize()+"()")
	uncaptured, ok := t.checkedTables(rows, err)
	if !ok || len(uncaptured) == 0 {
		return nil
	}
	return fmt.Errorf("%s none of this connector's capture triggers filing changes under that name: dropped and made again, or another table took the name (an online schema change, or a swap of captured tables), so its changes are not captured under it; restart the connector (POST /connectors/%s/restart?includeTasks=true), whose Start installs or renames the triggers",
		tablesPhrase(uncaptured, "has", "have"), t.s.name)
}

// rekeyStale keys again the records (at the indexes stale) whose key
// lacked a column: one was renamed or dropped since the tables' keys were
// read, so they are read again and the records keyed by the current key.
// A record still without one of its columns (it lost its name) gets no
// key, as for a table without one: {"id":null} would be one key shared by
// all such changes (a compacted topic keeps only the last). change gives
// a record's table, operation and images.
func (t *Task) rekeyStale(ctx context.Context, recs []connect.SourceRecord, stale []int, change func(i int) (tb tableName, op string, before, after []byte)) error {
	if len(stale) == 0 {
		return nil
	}
	var tables []tableName
	for _, i := range stale {
		if tb, _, _, _ := change(i); !slices.Contains(tables, tb) {
			tables = append(tables, tb)
		}
	}
	if err := t.loadMeta(ctx, tables, true); err != nil {
		return err
	}
	for _, i := range stale {
		tb, op, before, after := change(i)
		key, complete := t.meta[tb].key(op, before, after)
		if !complete {
			key = nil
		}
		recs[i].Key = key
	}
	return nil
}

// checkedTables reads the (schema, name) rows of a periodic check of the
// captured tables, quoted. ok is false when the check failed, which is
// left to the next one; else capturedAt moves on.
func (t *Task) checkedTables(rows pgx.Rows, err error) (quoted []string, ok bool) {
	if err != nil {
		return nil, false
	}
	defer rows.Close()
	for rows.Next() {
		var tb tableName
		if err := rows.Scan(&tb.Schema, &tb.Name); err != nil {
			return nil, false
		}
		quoted = append(quoted, tb.quoted())
	}
	if rows.Err() != nil {
		return nil, false
	}
	t.capturedAt = time.Now()
	return quoted, true
}

// tablesPhrase is "table a has" or "tables a, b have", with the verb's
// singular and plural.
func tablesPhrase(quoted []string, one, many string) string {
	if len(quoted) == 1 {
		return "table " + quoted[0] + " " + one
	}
	return "tables " + strings.Join(quoted, ", ") + " " + many
}

// commitAfterStop is how long a Commit may go on waiting for the database
// once Stop was called (a variable for tests).
var commitAfterStop = 2 * time.Second

// Commit deletes the rows whose changes are all acknowledged, in Poll
// order, and records how far the first partly acknowledged row got, so a
// restart resumes inside it. A lost connection keeps both for the next
// Poll (the rows stay excluded from reads, so nothing is sent twice
// meanwhile).
func (t *Task) Commit(ctx context.Context, acked []connect.SourceRecord) error {
	if len(acked) == 0 {
		return nil
	}
	if t.lg != nil {
		t.logicalCommit(acked)
		return nil
	}
	// The runtime's Commit context is not cancelled by Stop (records Kafka
	// holds are to be confirmed) and outlasts its graceful timeout: a DELETE
	// waiting for the database (row locks, a server that stopped answering)
	// got the task abandoned. After Stop it gets commitAfterStop; what it
	// did not finish stays pending for Stopped's last try.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(t.stopContext(), func() {
		limit := time.AfterFunc(commitAfterStop, cancel)
		context.AfterFunc(ctx, func() { limit.Stop() })
	})()
	for _, r := range acked {
		id, idx := offsetInt(r.SourceOffset["id"]), int(offsetInt(r.SourceOffset["idx"]))
		row := t.inflight[id]
		if row == nil {
			continue
		}
		if n, ok := row.unacked[idx]; ok {
			if n > 1 {
				row.unacked[idx] = n - 1
				continue // delivered with the change's other records
			}
			delete(row.unacked, idx)
		}
		if row.acked == nil {
			row.delivered = row.changes
		} else if idx >= 0 && idx < len(row.acked) {
			row.acked[idx] = true
			for row.delivered < row.changes && row.acked[row.delivered] {
				row.delivered++
			}
		}
	}
	// Rows are delivered in Poll order. The worker's final commit passes
	// records acknowledged on one Kafka partition past one refused on
	// another, and a row not delivered is sent again whole after a restart
	// (a key change's create, a group's acknowledged changes): a later
	// change of the same key delivered meanwhile would be followed by the
	// older one. The rows behind it wait, and are sent again after a
	// restart.
	var done []int64
	n := 0
	for ; n < len(t.polled); n++ {
		id := t.polled[n]
		row := t.inflight[id]
		if row.delivered < row.changes {
			if row.delivered > row.written {
				t.pendingProgress[id] = row.delivered
			}
			break
		}
		done = append(done, id)
		delete(t.inflight, id)
		delete(t.pendingProgress, id)
	}
	t.polled = t.polled[n:]
	t.pendingDelete = append(t.pendingDelete, done...)
	if err := t.flushPending(ctx); err != nil {
		if ctx.Err() != nil {
			// Stopping: the next instance reads these rows again and
			// delivers their changes again (at-least-once).
			return nil
		}
		if !transient(err) {
			return fmt.Errorf("recording delivered changes in the audit table %s.%s: %w", t.s.auditSchema, t.n.table, err)
		}
		t.host.Logger.Warn("recording delivered changes failed; retrying on the next poll (they are not sent again meanwhile)", "error", err, "rows", len(done))
	}
	return nil
}

// flushPending deletes the fully delivered rows and writes the progress of
// partly delivered ones; what fails stays pending.
func (t *Task) flushPending(ctx context.Context) error {
	if len(t.pendingDelete) > 0 {
		if _, err := t.deleteIDs(ctx, t.pendingDelete); err != nil {
			return err
		}
		t.host.Logger.Debug("deleted audit rows whose changes Kafka acknowledged", "rows", len(t.pendingDelete))
		t.pendingDelete = nil
	}
	if len(t.pendingProgress) > 0 {
		ids := make([]int64, 0, len(t.pendingProgress))
		counts := make([]int32, 0, len(t.pendingProgress))
		for id, n := range t.pendingProgress {
			ids = append(ids, id)
			counts = append(counts, int32(n))
		}
		if _, err := t.pool.Exec(ctx, t.progressSQL, ids, counts); err != nil {
			return err
		}
		for i, id := range ids {
			if row := t.inflight[id]; row != nil {
				row.written = int(counts[i])
			}
		}
		clear(t.pendingProgress)
	}
	return nil
}

// offsetInt reads an integer of a source offset, however it was decoded.
func offsetInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int:
		return int64(n)
	case float64:
		return int64(n)
	case json.Number:
		i, _ := n.Int64()
		return i
	}
	return 0
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

// Stop interrupts a blocking Poll or a running Start, and bounds a Commit
// (commitAfterStop); the connections stay open until Stopped.
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
		if t.lg != nil {
			t.logicalStopped(ctx)
			return
		}
		t.cancelUnmark()
		if t.listener != nil {
			_ = t.listener.Close(ctx)
			t.listener = nil
		}
		if t.pool != nil {
			if len(t.pendingDelete) > 0 || len(t.pendingProgress) > 0 {
				// Acknowledged changes whose DELETE failed (a connection
				// lost in Commit): one more try, or the next instance
				// sends them again. Best effort, bounded.
				fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				if err := t.flushPending(fctx); err != nil {
					t.host.Logger.Warn("recording delivered changes failed at stop; they will be delivered again", "error", err)
				}
				cancel()
			}
			if t.mark != markClear {
				// No NOTIFYs for a task that is gone; best effort (a row
				// left behind only costs writers needless NOTIFYs).
				uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_ = t.setWaiting(uctx, false, true)
				cancel()
			}
			t.pool.Close()
		}
	})
	return nil
}

// metaRefresh is how often a task reads its tables' primary keys again
// (a variable for tests).
var metaRefresh = 10 * time.Second

// key is the row's primary key as a JSON object, or nil; complete is false
// when the image lacks a key column or has it null (renamed or dropped
// since the key was read).
func (m *tableMeta) key(op string, before, after []byte) (key []byte, complete bool) {
	if len(m.pkCols) == 0 || op == "t" {
		return nil, true
	}
	img := after
	if img == nil {
		img = before
	}
	// Only the image's top level is read: encoding/json would parse every
	// value, and refuses one nested deeper than 10000 levels, which a json
	// or jsonb column can hold; the change would lose its key.
	cols := map[string][]byte{}
	if !objectMembers(img, func(name string, value []byte) {
		if slices.Contains(m.pkCols, name) {
			cols[name] = value
		}
	}) {
		return nil, true
	}
	complete = true
	out := make([]byte, 0, 32)
	out = append(out, '{')
	for i, c := range m.pkCols {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, m.pkJSON[i]...)
		out = append(out, ':')
		// A primary-key column is never null: a null under its name is
		// another column that took the name of a renamed key column.
		if v, ok := cols[c]; ok && (m.customKey || string(v) != "null") {
			out = append(out, v...)
		} else {
			out = append(out, "null"...)
			complete = false
		}
	}
	return append(out, '}'), complete
}

// objectMembers calls f with the name and raw value of each member of
// the JSON object obj (as PostgreSQL renders it), without parsing the
// values; it reports false if obj is not such an object.
func objectMembers(obj []byte, f func(name string, value []byte)) bool {
	return walkObject(obj, func(name string, member []byte, value int) { f(name, member[value:]) })
}

// withoutMembers returns obj without the members named in drop, written
// back byte for byte as they were (no re-encoding of names or values).
// An object it cannot read is returned as it is.
func withoutMembers(obj []byte, drop map[string]bool) []byte {
	out := make([]byte, 0, len(obj))
	out = append(out, '{')
	ok := walkObject(obj, func(name string, member []byte, _ int) {
		if drop[name] {
			return
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, member...)
	})
	if !ok {
		return obj
	}
	return append(out, '}')
}

// walkObject calls f with each member of the JSON object obj: its name,
// the member's bytes from its name's opening quote to its value's end,
// and where in them the value starts.
func walkObject(obj []byte, f func(name string, member []byte, value int)) bool {
	p := skipJSONSpace(obj, 0)
	if p >= len(obj) || obj[p] != '{' {
		return false
	}
	p = skipJSONSpace(obj, p+1)
	if p < len(obj) && obj[p] == '}' {
		return true
	}
	for {
		if p >= len(obj) || obj[p] != '"' {
			return false
		}
		p0 := p
		end := jsonStringEnd(obj, p)
		var name string
		if end < 0 || json.Unmarshal(obj[p:end], &name) != nil {
			return false
		}
		p = skipJSONSpace(obj, end)
		if p >= len(obj) || obj[p] != ':' {
			return false
		}
		nameStart := p0
		start := skipJSONSpace(obj, p+1)
		end = jsonValueEnd(obj, start)
		if end <= start {
			return false
		}
		f(name, obj[nameStart:end], start-nameStart)
		p = skipJSONSpace(obj, end)
		if p >= len(obj) {
			return false
		}
		switch obj[p] {
		case ',':
			p = skipJSONSpace(obj, p+1)
		case '}':
			return true
		default:
			return false
		}
	}
}

func skipJSONSpace(b []byte, p int) int {
	for p < len(b) && (b[p] == ' ' || b[p] == '\t' || b[p] == '\n' || b[p] == '\r') {
		p++
	}
	return p
}

// jsonStringEnd returns the index after the string that starts at p, or -1.
func jsonStringEnd(b []byte, p int) int {
	for i := p + 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// jsonValueEnd returns the index after the member value that starts at p
// (a scalar ends where the object goes on or ends), or -1.
func jsonValueEnd(b []byte, p int) int {
	depth := 0
	for i := p; i < len(b); i++ {
		switch b[i] {
		case '"':
			e := jsonStringEnd(b, i)
			if e < 0 || depth == 0 {
				return e
			}
			i = e - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// envelope is the record value:
// {"op","before","after","source":{connector,db,schema,table,txid,seq},"ts_ms"}.
func (m *tableMeta) envelope(op string, before, after []byte, txid string, seq, tsMS int64) []byte {
	if len(m.excluded) > 0 {
		if before != nil {
			before = withoutMembers(before, m.excluded)
		}
		if after != nil {
			after = withoutMembers(after, m.excluded)
		}
	}
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

// chunkStep copies the next chunk of an incremental snapshot. A chunk that
// gives way is tried again shortly; again says the Poll should return
// empty (after a transient failure's backoff); err is fatal for the Poll
// (or an interruption, which the caller tells apart).
func (t *Task) chunkStep(ctx context.Context, interval time.Duration) (copied, again bool, err error) {
	// A chunk runs on when the Poll is interrupted for a Commit, as a read
	// does (pollOnce): the worker interrupts a Poll 50 ms after an ack
	// while records are in flight, and under a steady stream a chunk longer
	// than that was cut off, and redone, at every Poll, and never copied. A
	// Stop cuts it short at once, an interruption after interruptGrace.
	cctx, ccancel := context.WithCancel(context.WithoutCancel(ctx))
	defer ccancel()
	defer context.AfterFunc(t.stopContext(), ccancel)()
	defer context.AfterFunc(ctx, func() {
		grace := time.AfterFunc(interruptGrace, ccancel)
		context.AfterFunc(cctx, func() { grace.Stop() })
	})()
	copied, err = t.copyChunk(cctx)
	switch {
	case err == nil:
		if copied {
			t.chunkGaveWay = 0
		}
		return copied, false, nil
	case cctx.Err() != nil:
		return false, false, err
	case copyAgain(err):
		// Not at once: a writer's transaction can hold a row of the chunk
		// for long, and each try writes row locks up to it. Meanwhile the
		// task reads changes as when idle.
		delay := min(snapshotGiveWayDelay<<min(t.chunkGaveWay, 5), max(interval, snapshotGiveWayDelay))
		t.chunkGaveWay++
		t.host.Logger.Debug("incremental snapshot: a chunk gave way (a row of it locked by a writer that has not committed or moved to another partition meanwhile, a lock on the table held too long, or the table renamed meanwhile); trying again shortly", "error", err, "retry_in", delay)
		t.chunkRetryAt = time.Now().Add(delay)
		return false, false, nil
	case transient(err):
		t.retryLater(ctx, "copying a chunk of an incremental snapshot", err)
		return false, true, nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" && strings.Contains(pgErr.Message, "row-level security") {
		return false, false, fmt.Errorf("incremental snapshot (%s=%s): %w; the copy would miss the rows the table's policies hide from the role (FORCE ROW LEVEL SECURITY): give the role BYPASSRLS, or ALTER TABLE ... NO FORCE ROW LEVEL SECURITY, or set %s=%s",
			KeySnapshotMode, snapshotIncremental, err, KeySnapshotMode, snapshotNever)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "57014" && strings.Contains(pgErr.Message, "statement timeout") {
		return false, false, fmt.Errorf("incremental snapshot (%s=%s): %w; a chunk's copy (its pages' rows, with their out-of-line values) took longer than the role's statement_timeout: raise it for the connector's role (ALTER ROLE ... SET statement_timeout), or set %s=%s",
			KeySnapshotMode, snapshotIncremental, err, KeySnapshotMode, snapshotNever)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		// A partition of another owner (validation checks those of a
		// copy the Start schedules, not one asked for by hand or a
		// privilege revoked since).
		return false, false, fmt.Errorf("incremental snapshot (%s=%s): %w; a chunk reads the table, or each of its leaf partitions, by name FOR SHARE, which needs SELECT and UPDATE on the relation named: GRANT SELECT, UPDATE ON it TO the connector's role (or delete its row from the progress table %s to give its copy up)",
			KeySnapshotMode, snapshotIncremental, err, t.snapshotTable)
	}
	return false, false, fmt.Errorf("incremental snapshot (%s=%s): %w", KeySnapshotMode, snapshotIncremental, err)
}
