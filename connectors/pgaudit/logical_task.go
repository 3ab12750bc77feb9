package pgaudit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// logicalState is a task's state under capture.method=logical: a reader
// goroutine streams the slot (pgoutput) into events; Poll turns them into
// records, rendering the values as the trigger method does (to_json in
// the task's session), and Commit moves the slot's confirmed position
// past every transaction whose records Kafka acknowledged.
type logicalState struct {
	slot, publication string

	events       chan logicalEvent
	readerDone   chan struct{}
	readerErr    error // set before readerDone closes
	cancelReader context.CancelFunc
	// conn is the reader's replication connection; Stopped's once
	// readerDone is closed.
	conn *pgconn.PgConn
	// confirmed is how far the slot may advance: every transaction that
	// committed before it is delivered.
	confirmed atomic.Uint64

	// Poll's and Commit's (the runtime never runs them at once).
	pending []*logicalTx          // in stream order
	byLSN   map[uint64]*logicalTx // pending, by commit LSN
	held    []logicalEvent        // taken from events, not turned into records yet
	types   map[uint32]columnType // of each column type
	// nextXid is a recent pg_current_snapshot's xmax, read at nextXidAt:
	// the epoch of the changes' 32-bit ids (fullXid).
	nextXid   uint64
	nextXidAt time.Time
	byOID     map[uint32]tableName // configured tables by relation OID
	// standby is how often the reader reports its position: within a
	// third of the server's wal_sender_timeout.
	standby time.Duration
	// identityWarned is what warnReplicaIdentity last warned of.
	identityWarned string
	// dropped are the relations whose changes were left out (logged once).
	dropped map[uint32]bool
}

// logicalTx is a streamed transaction whose records are not all
// acknowledged, or a position the stream passed between transactions.
type logicalTx struct {
	commitLSN, endLSN uint64
	remaining         int  // records sent and not acknowledged
	complete          bool // its COMMIT (or the position) was read
}

type eventKind int8

const (
	evChange eventKind = iota
	evCommit           // a transaction's end
	evIdle             // the stream passed endLSN between transactions
)

type logicalEvent struct {
	kind      eventKind
	rel       *pglogrepl.RelationMessage
	op        string
	old, new  []*pglogrepl.TupleDataColumn // nil: no image
	xid       uint32
	commitLSN uint64
	endLSN    uint64
	seq       int
	at        time.Time
}

// logicalEventBuffer bounds the events the reader runs ahead of Poll.
const logicalEventBuffer = 4096

// standbyInterval is how often the reader reports its position at most
// (the server ends a connection silent for wal_sender_timeout, 60 s by
// default; a shorter one shortens it).
var standbyInterval = 10 * time.Second

func (t *Task) startLogical(ctx context.Context, s settings, oids string) error {
	pub, slot := logicalNames(s.name)
	lg := &logicalState{slot: slot, publication: pub, byLSN: map[uint64]*logicalTx{}, types: map[uint32]columnType{}, byOID: map[uint32]tableName{}}
	pool, err := newTaskPool(s, t.host.Task)
	if err != nil {
		return err
	}
	t.pool = pool
	t.lg = lg // Stopped closes the pool from here on
	if err := t.pool.QueryRow(ctx, `SELECT current_database()::text`).Scan(&t.db); err != nil {
		return fmt.Errorf("connecting to PostgreSQL at %s (check %s and that the server is up): %w", connect.MaskCredentials(s.url), KeyURL, err)
	}
	var confirmed *string
	err = t.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, slot).Scan(&confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("replication slot %s does not exist in database %q: the connector creates it when it starts, so restart the connector (changes made while there was no slot are not captured)", slot, t.db)
	}
	if err != nil {
		return fmt.Errorf("reading replication slot %s: %w", slot, err)
	}
	// The server ends a stream it has not heard from for
	// wal_sender_timeout, which a walsender reads from the same role,
	// database and server settings as this session.
	var senderTimeoutMS int64
	if err := t.pool.QueryRow(ctx, `SELECT setting::int8 FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'`).Scan(&senderTimeoutMS); err != nil {
		return fmt.Errorf("reading wal_sender_timeout: %w", err)
	}
	lg.standby = standbyInterval
	if senderTimeoutMS > 0 {
		lg.standby = max(min(standbyInterval, time.Duration(senderTimeoutMS)*time.Millisecond/3), 100*time.Millisecond)
	}
	if confirmed != nil {
		lsn, err := pglogrepl.ParseLSN(*confirmed)
		if err != nil {
			return fmt.Errorf("replication slot %s: %w", slot, err)
		}
		lg.confirmed.Store(uint64(lsn))
	}
	// The OIDs the connector read at its Start come first: a table
	// renamed since is found by its OID, not its configured name.
	if oids != "" {
		if list := strings.Split(oids, ","); len(list) == len(t.tables) {
			for i, v := range list {
				if oid, err := strconv.ParseUint(v, 10, 32); err == nil && oid != 0 {
					lg.byOID[uint32(oid)] = t.tables[i]
				}
			}
		}
	}
	if err := t.resolveOIDs(ctx, t.tables); err != nil {
		return err
	}
	t.meta = map[tableName]*tableMeta{}
	if err := t.loadMeta(ctx, t.tables, false); err != nil {
		return err
	}
	t.metaAt = time.Now()
	cc, err := replicationConfig(s, t.host.Task)
	if err != nil {
		return err
	}
	conn, err := startStream(ctx, cc, slot, pub, 0)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" {
		// Held by the walsender of an earlier instance that has not gone
		// yet: the reader waits for it as when reconnecting.
		t.host.Logger.Warn("replication slot in use; waiting for it", "slot", slot, "error", err)
		conn, err = nil, nil
	}
	if err != nil {
		return err
	}
	lg.conn = conn
	lg.events = make(chan logicalEvent, logicalEventBuffer)
	lg.readerDone = make(chan struct{})
	rctx, cancel := context.WithCancel(context.Background())
	lg.cancelReader = cancel
	context.AfterFunc(t.stopContext(), cancel)
	go t.logicalReader(rctx, lg, cc)
	t.host.Logger.Info("task started", "tables", len(t.tables), "slot", slot, "publication", pub)
	return nil
}

// resolveOIDs maps the configured tables' relation OIDs to their names:
// the stream names relations as they are called when a change is decoded.
func (t *Task) resolveOIDs(ctx context.Context, tables []tableName) error {
	list := make([]string, len(tables))
	for i, tb := range tables {
		list[i] = tb.quoted()
	}
	rows, err := t.pool.Query(ctx, `SELECT x.i, pg_catalog.to_regclass(x.q)::oid::int8 FROM unnest($1::text[]) WITH ORDINALITY AS x(q, i)`, list)
	if err != nil {
		return fmt.Errorf("looking up the captured tables: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int64
		var oid *int64
		if err := rows.Scan(&i, &oid); err != nil {
			return err
		}
		if oid != nil && !slices.Contains(slices.Collect(maps.Values(t.lg.byOID)), tables[i-1]) {
			t.lg.byOID[uint32(*oid)] = tables[i-1]
		}
	}
	return rows.Err()
}

// newTaskPool is the task's pool, its sessions set up to render values as
// JSON the same way whatever the database's or role's defaults.
func newTaskPool(s settings, task int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(s.url)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid libpq URL or DSN: fix %s", connect.MaskCredentials(s.url), KeyURL)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = ApplicationName(s.name, fmt.Sprintf("task-%d", task))
	// The task's session renders the row images as JSON: timestamptz values
	// come out in UTC, whatever the writers' TimeZone was.
	pc.ConnConfig.RuntimeParams["timezone"] = "UTC"
	// The other settings to_json's output depends on are pinned too, as a
	// database or role can default them otherwise: bytea in hex, dates in
	// ranges in ISO, intervals as by default, and floats exact
	// (extra_float_digits 0 would round them to 15 digits). Only DateStyle
	// goes in the startup packet; the rest are set once connected, because
	// poolers such as PgBouncer refuse startup parameters they do not track.
	pc.ConnConfig.RuntimeParams["datestyle"] = "ISO"
	pc.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `SELECT pg_catalog.set_config('intervalstyle', 'postgres', false),
       pg_catalog.set_config('bytea_output', 'hex', false),
       pg_catalog.set_config('extra_float_digits', '1', false)`)
		return err
	}
	// The capture functions make images in UTF8, and records are UTF-8
	// JSON: without this the session would take the database's (or the
	// role's) default encoding, decode images by it and render in it.
	pc.ConnConfig.RuntimeParams["client_encoding"] = "UTF8"
	if pc.ConnConfig.ConnectTimeout == 0 || pc.ConnConfig.ConnectTimeout > 10*time.Second {
		pc.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pc.MaxConns = 2
	pc.MinConns = 0
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("creating the connection pool for %s: %w", connect.MaskCredentials(s.url), err)
	}
	return pool, nil
}

// replicationConfig is the stream's connection: the walsender renders the
// values in text with these settings, and the task's session reads them
// back by the same (exact floats, ISO dates, hex bytea, UTF-8).
func replicationConfig(s settings, task int) (*pgconn.Config, error) {
	cc, err := pgconn.ParseConfig(s.url)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid libpq URL or DSN: fix %s", connect.MaskCredentials(s.url), KeyURL)
	}
	for k, v := range map[string]string{
		"replication":        "database",
		"application_name":   ApplicationName(s.name, fmt.Sprintf("stream-%d", task)),
		"client_encoding":    "UTF8",
		"datestyle":          "ISO",
		"intervalstyle":      "postgres",
		"extra_float_digits": "3",
		"bytea_output":       "hex",
		"timezone":           "UTC",
	} {
		cc.RuntimeParams[k] = v
	}
	if cc.ConnectTimeout == 0 || cc.ConnectTimeout > 10*time.Second {
		cc.ConnectTimeout = 10 * time.Second
	}
	if replicationDial != nil {
		cc.DialFunc = replicationDial
	}
	// An interrupted read must leave the stream usable: a deadline, not a
	// cancel request.
	cc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	return cc, nil
}

// replicationDial, when set, opens the replication connections' sockets
// (tests stall them).
var replicationDial pgconn.DialFunc

func startStream(ctx context.Context, cc *pgconn.Config, slot, pub string, from uint64) (*pgconn.PgConn, error) {
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("opening the replication connection (check %s, and that the role has REPLICATION and pg_hba.conf allows it): %w", KeyURL, err)
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, pglogrepl.LSN(from), pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"},
	})
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("streaming replication slot %s: %w", slot, err)
	}
	return conn, nil
}

// streamPosition is what the reader sent of the stream: resume is the end
// of the last transaction sent whole, partial the commit LSN and change
// count of one sent in part. A reconnection starts at resume (the server
// skips the transactions that committed before it) and skips what was
// sent of partial.
type streamPosition struct {
	resume      uint64
	partial     uint64
	partialSent int
}

// logicalReader streams until its context ends, reconnecting with backoff
// (100 ms to 5 s) while the failure is a lost connection or a slot still
// held by an earlier instance of the task.
func (t *Task) logicalReader(ctx context.Context, lg *logicalState, cc *pgconn.Config) {
	defer close(lg.readerDone)
	var pos streamPosition
	backoff := 100 * time.Millisecond
	var pgErr *pgconn.PgError
	for {
		// No connection: the last reconnection failed, and is tried again.
		if lg.conn != nil {
			progressed, err := t.stream(ctx, lg, &pos)
			if ctx.Err() != nil {
				return
			}
			retry := transient(err) || (errors.As(err, &pgErr) && pgErr.Code == "55006")
			if !retry {
				lg.readerErr = err
				return
			}
			if progressed {
				backoff = 100 * time.Millisecond
			}
			t.host.Logger.Warn("replication stream lost; reconnecting", "error", err, "retry_in", backoff)
			_ = lg.conn.Close(context.Background())
			lg.conn = nil
		}
		if sleepCtx(ctx, backoff) != nil {
			return
		}
		backoff = min(2*backoff, 5*time.Second)
		conn, err := startStream(ctx, cc, lg.slot, lg.publication, pos.resume)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if transient(err) || (errors.As(err, &pgErr) && pgErr.Code == "55006") {
				t.host.Logger.Warn("reconnecting the replication stream failed", "error", err, "retry_in", backoff)
				continue
			}
			lg.readerErr = err
			return
		}
		lg.conn = conn
	}
}

// stream reads lg.conn until it fails or ctx ends; progressed says whether
// it read anything.
func (t *Task) stream(ctx context.Context, lg *logicalState, pos *streamPosition) (progressed bool, err error) {
	if lg.conn == nil {
		return false, errors.New("no replication connection")
	}
	conn := lg.conn
	t.syncConfirmed(ctx, lg)
	relations := map[uint32]*pglogrepl.RelationMessage{}
	var received uint64
	nextStatus := time.Now().Add(lg.standby)
	status := func() error {
		c := lg.confirmed.Load()
		w := max(received, c)
		if c == 0 {
			c = 1 // 0 would make pglogrepl report the write position as flushed
		}
		nextStatus = time.Now().Add(lg.standby)
		// A server that stops reading (a full socket buffer) must not hold
		// the reader: Stop could not end it. The deadline is set before
		// ctx is looked at: Stop's AfterFunc moves it to now afterwards.
		if err := conn.Conn().SetWriteDeadline(time.Now().Add(lg.standby)); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: pglogrepl.LSN(w), WALFlushPosition: pglogrepl.LSN(c), WALApplyPosition: pglogrepl.LSN(c)})
	}
	send := func(ev logicalEvent) error {
		select {
		case lg.events <- ev:
			return nil
		default:
		}
		for {
			wait := time.NewTimer(time.Until(nextStatus))
			select {
			case lg.events <- ev:
				wait.Stop()
				return nil
			case <-ctx.Done():
				wait.Stop()
				return ctx.Err()
			case <-wait.C:
				// Poll is behind: the server must still hear from us.
				if err := status(); err != nil {
					return err
				}
			}
		}
	}
	var (
		inTx     bool
		cur      logicalEvent
		skip     int
		lastIdle uint64
	)
	// Reads wait with a deadline on the socket rather than a context: a
	// context per message cost the reader a third of its CPU. Stop moves
	// both deadlines to now.
	defer context.AfterFunc(ctx, func() { _ = conn.Conn().SetDeadline(time.Now()) })()
	var deadline time.Time
	for {
		if !time.Now().Before(nextStatus) {
			if err := status(); err != nil {
				return progressed, err
			}
		}
		if !deadline.Equal(nextStatus) {
			deadline = nextStatus
			if err := conn.Conn().SetReadDeadline(deadline); err != nil {
				return progressed, err
			}
			if ctx.Err() != nil {
				return progressed, ctx.Err()
			}
		}
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return progressed, ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return progressed, err
		}
		var data []byte
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			data = m.Data
		case *pgproto3.ErrorResponse:
			return progressed, pgconn.ErrorResponseToPgError(m)
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return progressed, fmt.Errorf("replication slot %s: %w", lg.slot, err)
			}
			if end := uint64(pkm.ServerWALEnd); !inTx && end > lastIdle {
				// Between transactions at end: nothing before it is left
				// to send, so once the records sent are acknowledged the
				// slot may pass it (else it would keep WAL of tables it
				// does not capture). Not worth waiting for.
				select {
				case lg.events <- logicalEvent{kind: evIdle, endLSN: end}:
					lastIdle = end
				default:
				}
			}
			if pkm.ReplyRequested {
				if err := status(); err != nil {
					return progressed, err
				}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return progressed, fmt.Errorf("replication slot %s: %w", lg.slot, err)
			}
			received = max(received, uint64(xld.WALStart))
			progressed = true
			// The values alias the connection's buffer, which the next
			// read reuses; the events outlive it.
			m, err := pglogrepl.Parse(slices.Clone(xld.WALData))
			if err != nil {
				return progressed, fmt.Errorf("replication slot %s: decoding pgoutput: %w", lg.slot, err)
			}
			change := func(rel uint32, op string, old, new []*pglogrepl.TupleDataColumn) error {
				r := relations[rel]
				if r == nil {
					return fmt.Errorf("replication slot %s: a change of relation %d came before its description", lg.slot, rel)
				}
				ev := cur
				ev.kind, ev.rel, ev.op, ev.old, ev.new = evChange, r, op, old, new
				cur.seq++
				if ev.seq < skip {
					return nil // sent before the reconnection
				}
				if err := send(ev); err != nil {
					return err
				}
				pos.partial, pos.partialSent = cur.commitLSN, cur.seq
				return nil
			}
			switch m := m.(type) {
			case *pglogrepl.RelationMessage:
				relations[m.RelationID] = m
			case *pglogrepl.BeginMessage:
				inTx = true
				cur = logicalEvent{xid: m.Xid, commitLSN: uint64(m.FinalLSN), at: m.CommitTime}
				skip = 0
				if pos.partial == cur.commitLSN {
					skip = pos.partialSent
				}
			case *pglogrepl.InsertMessage:
				err = change(m.RelationID, "c", nil, tupleColumns(m.Tuple))
			case *pglogrepl.UpdateMessage:
				old, new := tupleColumns(m.OldTuple), tupleColumns(m.NewTuple)
				if m.OldTupleType == pglogrepl.UpdateMessageTupleTypeKey {
					old = keyOnly(relations[m.RelationID], old)
				}
				for i, c := range new {
					// An unchanged TOASTed value is not sent; the old
					// image has it under REPLICA IDENTITY FULL.
					if c.DataType == pglogrepl.TupleDataTypeToast && i < len(old) && old[i].DataType != pglogrepl.TupleDataTypeToast {
						new[i] = old[i]
					}
				}
				err = change(m.RelationID, "u", old, new)
			case *pglogrepl.DeleteMessage:
				old := tupleColumns(m.OldTuple)
				if m.OldTupleType == pglogrepl.UpdateMessageTupleTypeKey {
					old = keyOnly(relations[m.RelationID], old)
				}
				err = change(m.RelationID, "d", old, nil)
			case *pglogrepl.TruncateMessage:
				for _, id := range m.RelationIDs {
					if err = change(id, "t", nil, nil); err != nil {
						break
					}
				}
			case *pglogrepl.CommitMessage:
				inTx = false
				ev := cur
				ev.kind, ev.endLSN = evCommit, uint64(m.TransactionEndLSN)
				if err := send(ev); err != nil {
					return progressed, err
				}
				pos.resume, pos.partial, pos.partialSent = ev.endLSN, 0, 0
			}
			if err != nil {
				return progressed, err
			}
		}
	}
}

// keyOnly leaves the replica identity's columns of a key image ('K'):
// the others are sent as nulls, which they were not.
func keyOnly(rel *pglogrepl.RelationMessage, cols []*pglogrepl.TupleDataColumn) []*pglogrepl.TupleDataColumn {
	if rel == nil {
		return cols
	}
	out := make([]*pglogrepl.TupleDataColumn, len(cols))
	for i, c := range cols {
		out[i] = c
		if i >= len(rel.Columns) || rel.Columns[i].Flags&1 == 0 {
			out[i] = &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeToast}
		}
	}
	return out
}

func tupleColumns(td *pglogrepl.TupleData) []*pglogrepl.TupleDataColumn {
	if td == nil {
		return nil
	}
	return td.Columns
}

// logicalPoll returns the changes streamed so far, up to poll.max.records,
// waiting up to poll.interval.ms for the first.
func (t *Task) logicalPoll(ctx context.Context) ([]connect.SourceRecord, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(t.stopContext(), cancel)()
	lg := t.lg
	if time.Since(t.capturedAt) >= captureCheckInterval {
		if err := t.checkPublished(ctx); err != nil {
			return nil, err
		}
		t.warnReplicaIdentity(ctx)
	}
	evs := lg.held
	lg.held = nil
	changes := 0
	for _, ev := range evs {
		if ev.kind == evChange {
			changes++
		}
	}
	if len(evs) == 0 {
		select {
		case ev := <-lg.events:
			evs = append(evs, ev)
		default:
			timer := time.NewTimer(time.Duration(t.s.pollInterval) * time.Millisecond)
			defer timer.Stop()
			select {
			case ev := <-lg.events:
				evs = append(evs, ev)
			case <-lg.readerDone:
				select {
				case ev := <-lg.events: // what it read before it ended goes first
					evs = append(evs, ev)
				default:
					if ctx.Err() != nil || lg.readerErr == nil {
						return nil, nil
					}
					return nil, fmt.Errorf("reading replication slot %s: %w", lg.slot, lg.readerErr)
				}
			case <-ctx.Done():
				return nil, nil
			case <-timer.C:
				return nil, nil
			}
		}
		if evs[0].kind == evChange {
			changes++
		}
	}
take:
	for changes < t.s.pollMax {
		select {
		case ev := <-lg.events:
			evs = append(evs, ev)
			if ev.kind == evChange {
				changes++
			}
		default:
			break take
		}
	}
	// Left out before the events may be held: leaving out moves the
	// others forward in the same array and zeroes its end.
	evs = t.leaveOutUncaptured(evs)
	recs, err := t.logicalRecords(ctx, evs)
	if err != nil {
		if ctx.Err() != nil {
			lg.held = evs // interrupted: the next Poll renders them
			return nil, nil
		}
		return nil, err
	}
	return recs, nil
}

// leaveOutUncaptured leaves out the changes of a table the configuration
// no longer names (a reconfiguration removed it while they waited in the
// slot), as the trigger method's reconfiguration deletes them: its
// column.exclude.list and message.key.columns are gone with it. Their
// transactions' commits stay, which let the slot advance past them.
func (t *Task) leaveOutUncaptured(evs []logicalEvent) []logicalEvent {
	lg := t.lg
	return slices.DeleteFunc(evs, func(ev logicalEvent) bool {
		if ev.kind != evChange || t.logicalCaptured(ev.rel) {
			return false
		}
		if !lg.dropped[ev.rel.RelationID] {
			if lg.dropped == nil {
				lg.dropped = map[uint32]bool{}
			}
			lg.dropped[ev.rel.RelationID] = true
			t.host.Logger.Info("leaving out the changes of a table the configuration does not name (removed by a reconfiguration)", "table", tableName{ev.rel.Namespace, ev.rel.RelationName}.quoted())
		}
		return true
	})
}

// logicalRecords turns events into records and counts them into their
// transactions.
func (t *Task) logicalRecords(ctx context.Context, evs []logicalEvent) ([]connect.SourceRecord, error) {
	lg := t.lg
	type image struct {
		group string
		index int
	}
	groups := map[string]*renderGroup{}
	var order []string
	add := func(rel *pglogrepl.RelationMessage, cols []*pglogrepl.TupleDataColumn) image {
		if cols == nil {
			return image{index: -1}
		}
		mask := make([]byte, len(cols))
		for i, c := range cols {
			mask[i] = '+'
			if c.DataType == pglogrepl.TupleDataTypeToast || i >= len(rel.Columns) {
				mask[i] = '-'
			}
		}
		key := fmt.Sprintf("%p/%s", rel, mask)
		g := groups[key]
		if g == nil {
			g = &renderGroup{rel: rel, mask: mask}
			groups[key] = g
			order = append(order, key)
		}
		row := make([]byte, 0, 64)
		row = append(row, '[')
		for i, c := range cols {
			if mask[i] != '+' {
				continue
			}
			if len(row) > 1 {
				row = append(row, ',')
			}
			if c.DataType == pglogrepl.TupleDataTypeNull {
				row = append(row, "null"...)
			} else {
				row = appendJSONString(row, string(c.Data))
			}
		}
		g.rows = append(g.rows, string(append(row, ']')))
		return image{key, len(g.rows) - 1}
	}
	type pendingChange struct {
		ev                    *logicalEvent
		before, after         image  // rendered by the server
		beforeJSON, afterJSON []byte // rendered here
	}
	var changes []pendingChange
	var typeOIDs []uint32
	for i := range evs {
		ev := &evs[i]
		if ev.kind != evChange {
			continue
		}
		for _, c := range ev.rel.Columns {
			if _, ok := lg.types[c.DataType]; !ok && !slices.Contains(typeOIDs, c.DataType) {
				typeOIDs = append(typeOIDs, c.DataType)
			}
		}
	}
	if err := t.typesFor(ctx, typeOIDs); err != nil {
		return nil, err
	}
	for i := range evs {
		ev := &evs[i]
		if ev.kind != evChange {
			continue
		}
		pc := pendingChange{ev: ev, before: image{index: -1}, after: image{index: -1}}
		if ev.old != nil {
			if pc.beforeJSON = renderImage(ev.rel, ev.old, lg.types); pc.beforeJSON == nil {
				pc.before = add(ev.rel, ev.old)
			}
		}
		if ev.new != nil {
			if pc.afterJSON = renderImage(ev.rel, ev.new, lg.types); pc.afterJSON == nil {
				pc.after = add(ev.rel, ev.new)
			}
		}
		changes = append(changes, pc)
	}
	if err := t.logicalMeta(ctx, changes2rels(evs)); err != nil {
		return nil, err
	}
	if len(changes) > 0 && time.Since(lg.nextXidAt) > nextXidRefresh {
		var x int64
		if err := t.pool.QueryRow(ctx, `SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::int8`).Scan(&x); err != nil {
			return nil, fmt.Errorf("reading the current transaction id: %w", err)
		}
		lg.nextXid, lg.nextXidAt = uint64(x), time.Now()
	}
	if len(order) > 0 {
		batch := &pgx.Batch{}
		for _, key := range order {
			g := groups[key]
			sql, err := g.sql(lg.types)
			if err != nil {
				return nil, err
			}
			g.out = make([][]byte, len(g.rows))
			batch.Queue(sql, g.rows).Query(func(rows pgx.Rows) error { return g.scan(rows) })
		}
		if err := t.pool.SendBatch(ctx, batch).Close(); err != nil {
			return nil, fmt.Errorf("rendering the changes of replication slot %s: %w", lg.slot, err)
		}
	}
	img := func(im image, rendered []byte) []byte {
		if im.index < 0 {
			return rendered
		}
		return groups[im.group].out[im.index]
	}
	recs := make([]connect.SourceRecord, 0, len(changes))
	// metas are what keyed each change: a reload for stale ones replaces
	// the table's meta, which no longer keys the changes made before.
	metas := make([]*tableMeta, len(changes))
	var stale []int // records whose image lacks a key column
	for i, c := range changes {
		m := t.logicalMetaOf(c.ev.rel)
		metas[i] = m
		before, after := img(c.before, c.beforeJSON), img(c.after, c.afterJSON)
		var key []byte
		if c.ev.op != "t" {
			var complete bool
			if key, complete = m.key(c.ev.op, before, after); !complete {
				stale = append(stale, i)
			}
		}
		txid := strconv.FormatUint(fullXid(c.ev.xid, lg.nextXid), 10)
		recs = append(recs, connect.SourceRecord{
			SourcePartition: map[string]any{"slot": lg.slot},
			SourceOffset:    map[string]any{"lsn": int64(c.ev.commitLSN), "seq": c.ev.seq, "txid": txid},
			Topic:           m.topic,
			Partition:       -1,
			Key:             key,
			Value:           m.envelope(c.ev.op, before, after, txid, int64(c.ev.seq), c.ev.at.UnixMilli()),
			Timestamp:       c.ev.at,
		})
	}
	err := t.rekeyStale(ctx, recs, stale, func(i int) (tableName, string, []byte, []byte) {
		c := changes[i]
		return t.logicalTableOf(c.ev.rel), c.ev.op, img(c.before, c.beforeJSON), img(c.after, c.afterJSON)
	})
	if err != nil {
		return nil, err
	}
	for _, i := range stale {
		metas[i] = t.logicalMetaOf(changes[i].ev.rel)
	}
	if t.s.tombstones {
		recs = withTombstones(recs, func(i int) recordChange {
			c := changes[i]
			return recordChange{op: c.ev.op, m: metas[i], before: img(c.before, c.beforeJSON), after: img(c.after, c.afterJSON),
				txid: recs[i].SourceOffset["txid"].(string), seq: int64(c.ev.seq), tsMS: c.ev.at.UnixMilli()}
		})
	}
	// Count the records into their transactions, in stream order.
	counts := map[uint64]int{}
	for _, r := range recs {
		counts[uint64(offsetInt(r.SourceOffset["lsn"]))]++
	}
	for _, ev := range evs {
		switch ev.kind {
		case evChange:
			tx := lg.txOf(ev.commitLSN)
			tx.remaining += counts[ev.commitLSN]
			counts[ev.commitLSN] = 0
		case evCommit:
			tx := lg.txOf(ev.commitLSN)
			tx.complete, tx.endLSN = true, ev.endLSN
		case evIdle:
			if n := len(lg.pending); n == 0 || lg.pending[n-1].complete {
				lg.pending = append(lg.pending, &logicalTx{endLSN: ev.endLSN, complete: true})
			}
		}
	}
	lg.advance()
	return recs, nil
}

// renderImage renders an image here when every value it holds is of a
// type renderable here; nil when the server is to render it.
func renderImage(rel *pglogrepl.RelationMessage, cols []*pglogrepl.TupleDataColumn, types map[uint32]columnType) []byte {
	out := make([]byte, 0, 128)
	out = append(out, '{')
	first := true
	for i, c := range cols {
		if c.DataType == pglogrepl.TupleDataTypeToast {
			continue
		}
		if i >= len(rel.Columns) {
			return nil
		}
		col := rel.Columns[i]
		ct, ok := types[col.DataType]
		if !ok || !renderable(ct.base) {
			return nil
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = appendPGString(out, col.Name)
		out = append(out, ':')
		if c.DataType == pglogrepl.TupleDataTypeNull {
			out = append(out, "null"...)
			continue
		}
		if c.DataType != pglogrepl.TupleDataTypeText {
			return nil
		}
		if out, ok = appendValue(out, ct.base, string(c.Data)); !ok {
			return nil
		}
	}
	return append(out, '}')
}

func changes2rels(evs []logicalEvent) []*pglogrepl.RelationMessage {
	var rels []*pglogrepl.RelationMessage
	for _, ev := range evs {
		if ev.kind == evChange && !slices.Contains(rels, ev.rel) {
			rels = append(rels, ev.rel)
		}
	}
	return rels
}

// nextXidRefresh is how often the task reads the next transaction id
// again. The changes' ids are within 2^31 of it (PostgreSQL's wraparound
// protection) for far longer.
var nextXidRefresh = 10 * time.Second

// fullXid widens a 32-bit transaction id to the 64-bit one
// (pg_current_xact_id's): the one nearest to next, a recent next id.
func fullXid(xid uint32, next uint64) uint64 {
	full := next&^0xffffffff | uint64(xid)
	switch {
	case full > next && full-next > 1<<31 && full >= 1<<32:
		full -= 1 << 32
	case full < next && next-full > 1<<31:
		full += 1 << 32
	}
	return full
}

// txOf returns the pending transaction of commitLSN, adding it.
func (lg *logicalState) txOf(commitLSN uint64) *logicalTx {
	tx := lg.byLSN[commitLSN]
	if tx == nil {
		tx = &logicalTx{commitLSN: commitLSN}
		lg.byLSN[commitLSN] = tx
		lg.pending = append(lg.pending, tx)
	}
	return tx
}

// advance moves the confirmed position past the leading transactions
// whose records are all acknowledged.
func (lg *logicalState) advance() {
	n := 0
	for ; n < len(lg.pending); n++ {
		tx := lg.pending[n]
		if !tx.complete || tx.remaining > 0 {
			break
		}
		lg.raiseConfirmed(tx.endLSN)
		if tx.commitLSN != 0 {
			delete(lg.byLSN, tx.commitLSN)
		}
	}
	lg.pending = lg.pending[n:]
}

// raiseConfirmed moves the confirmed position to lsn unless it is past
// it already (the reader raises it too, see syncConfirmed).
func (lg *logicalState) raiseConfirmed(lsn uint64) {
	for {
		c := lg.confirmed.Load()
		if lsn <= c || lg.confirmed.CompareAndSwap(c, lsn) {
			return
		}
	}
}

// syncConfirmed raises the confirmed position to the slot's, read once
// the stream holds the slot: an earlier instance of the task that held it
// meanwhile (one the worker gave up waiting for) may have confirmed more
// than the slot showed at this one's Start. PostgreSQL takes whatever
// position a reader reports, so reporting less would move the slot back,
// and the changes in between would be sent again after the next
// reconnection. Best effort: a failed read leaves the position as it is.
func (t *Task) syncConfirmed(ctx context.Context, lg *logicalState) {
	var confirmed *string
	err := t.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, lg.slot).Scan(&confirmed)
	if err != nil || confirmed == nil {
		return
	}
	if lsn, err := pglogrepl.ParseLSN(*confirmed); err == nil {
		lg.raiseConfirmed(uint64(lsn))
	}
}

// logicalCommit counts the acknowledged records out of their
// transactions; the reader reports the new position to the server.
func (t *Task) logicalCommit(acked []connect.SourceRecord) {
	lg := t.lg
	for _, r := range acked {
		if tx := lg.byLSN[uint64(offsetInt(r.SourceOffset["lsn"]))]; tx != nil && tx.remaining > 0 {
			tx.remaining--
		}
	}
	lg.advance()
}

// logicalMeta makes sure every relation has its table's meta: keys and
// topics of the configured tables (read again every metaRefresh).
func (t *Task) logicalMeta(ctx context.Context, rels []*pglogrepl.RelationMessage) error {
	var missing []tableName
	refresh := len(rels) > 0 && time.Since(t.metaAt) > metaRefresh
	for _, rel := range rels {
		tb, ok := t.lg.byOID[rel.RelationID]
		if !ok {
			tb = tableName{rel.Namespace, rel.RelationName}
		}
		if _, known := t.meta[tb]; !known && !slices.Contains(missing, tb) {
			missing = append(missing, tb)
		}
	}
	if refresh {
		// Every table's, not only this batch's: a table whose changes are
		// rare would keep a changed key until one of them happened to be
		// in the batch a refresh fell due in.
		for tb := range t.meta {
			if !slices.Contains(missing, tb) {
				missing = append(missing, tb)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := t.loadMeta(ctx, missing, true); err != nil {
		return err // an interrupted Poll's refresh is the next Poll's
	}
	if refresh {
		t.metaAt = time.Now()
	}
	for _, tb := range missing {
		if t.meta[tb] == nil {
			t.meta[tb] = t.newMeta(tb, nil) // gone since: no key
		}
	}
	return nil
}

func (t *Task) logicalMetaOf(rel *pglogrepl.RelationMessage) *tableMeta {
	return t.meta[t.logicalTableOf(rel)]
}

// logicalCaptured says whether rel is a configured table: by its OID, or
// by its name when decoded (a table made again under a configured name
// after changes of the one before it).
func (t *Task) logicalCaptured(rel *pglogrepl.RelationMessage) bool {
	if _, ok := t.lg.byOID[rel.RelationID]; ok {
		return true
	}
	return slices.Contains(t.tables, tableName{rel.Namespace, rel.RelationName})
}

// logicalTableOf is the configured table whose changes rel describes (its
// own name if none is).
func (t *Task) logicalTableOf(rel *pglogrepl.RelationMessage) tableName {
	if tb, ok := t.lg.byOID[rel.RelationID]; ok {
		return tb
	}
	return tableName{rel.Namespace, rel.RelationName}
}

// columnType is a column type's base type (a domain's, else its own):
// its name, the cast target of its text values (to_json renders a domain
// as its base type, and a domain's current CHECK need not accept an old
// value), and its OID.
type columnType struct {
	name string
	base uint32
}

// typesFor reads the base types of oids.
func (t *Task) typesFor(ctx context.Context, oids []uint32) error {
	if len(oids) == 0 {
		return nil
	}
	rows, err := t.pool.Query(ctx, `
WITH RECURSIVE d(oid, base) AS (
  SELECT x.oid, x.oid FROM unnest($1::oid[]) AS x(oid)
  UNION ALL
  SELECT d.oid, ty.typbasetype FROM d JOIN pg_catalog.pg_type ty ON ty.oid = d.base WHERE ty.typtype = 'd')
-- The cast target by its schema and internal name, which takes no type
-- modifier: format_type's SQL names would (character and bit are
-- character(1) and bit(1), which cut 'abc' to 'a' and B'101' to B'1').
SELECT d.oid::int8, pg_catalog.format('%I.%I', tn.nspname, ty.typname), d.base::int8
FROM d JOIN pg_catalog.pg_type ty ON ty.oid = d.base JOIN pg_catalog.pg_namespace tn ON tn.oid = ty.typnamespace
WHERE ty.typtype <> 'd'`, oids)
	if err != nil {
		return fmt.Errorf("reading column types: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var oid, base int64
		var name string
		if err := rows.Scan(&oid, &name, &base); err != nil {
			return err
		}
		t.lg.types[uint32(oid)] = columnType{name: name, base: uint32(base)}
	}
	return rows.Err()
}

// renderGroup is the images of one relation description with the same
// columns present, rendered by one statement.
type renderGroup struct {
	rel  *pglogrepl.RelationMessage
	mask []byte   // '+': the column is in the images
	rows []string // each a JSON array of the present columns' text values
	out  [][]byte
}

func (g *renderGroup) sql(types map[uint32]columnType) (string, error) {
	var cols []string
	k := 0
	for i, present := range g.mask {
		if present != '+' {
			continue
		}
		c := g.rel.Columns[i]
		ct, ok := types[c.DataType]
		typ := ct.name
		if !ok {
			// Dropped since the change (with its column): the walsender
			// rendered the value by the type of then, and its text is all
			// there is. Failing would fail every restart on this change.
			typ = "pg_catalog.text"
		}
		cols = append(cols, fmt.Sprintf("(j.v ->> %d)::%s AS %s", k, typ, pgx.Identifier{c.Name}.Sanitize()))
		k++
	}
	if len(cols) == 0 {
		return `SELECT u.n, '{}'::text FROM unnest($1::text[]) WITH ORDINALITY AS u(v, n)`, nil
	}
	return `SELECT u.n, to_json(r)::text FROM unnest($1::text[]) WITH ORDINALITY AS u(v, n)
CROSS JOIN LATERAL (SELECT u.v::json AS v) AS j
CROSS JOIN LATERAL (SELECT ` + strings.Join(cols, ", ") + `) AS r`, nil
}

func (g *renderGroup) scan(rows pgx.Rows) error {
	for rows.Next() {
		var n int64
		var js string
		if err := rows.Scan(&n, &js); err != nil {
			return err
		}
		if n >= 1 && int(n) <= len(g.out) {
			g.out[n-1] = []byte(js)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("a change of %s.%s: %w", g.rel.Namespace, g.rel.RelationName, err)
	}
	return nil
}

// logicalStopped ends the reader, reports the last confirmed position (so
// a restart does not send again what Kafka has) and closes the
// connections.
func (t *Task) logicalStopped(ctx context.Context) {
	lg := t.lg
	if lg.cancelReader != nil {
		lg.cancelReader()
		<-lg.readerDone
	}
	if lg.conn != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		c := lg.confirmed.Load()
		// The reader's stop moved the socket's deadlines to then.
		_ = lg.conn.Conn().SetWriteDeadline(time.Now().Add(2 * time.Second))
		if c > 0 {
			if err := pglogrepl.SendStandbyStatusUpdate(sctx, lg.conn, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: pglogrepl.LSN(c), WALFlushPosition: pglogrepl.LSN(c), WALApplyPosition: pglogrepl.LSN(c)}); err != nil {
				t.host.Logger.Warn("reporting the delivered position to the server failed at stop; changes since the last report will be delivered again", "error", err)
			}
		}
		_ = lg.conn.Close(sctx)
		cancel()
		lg.conn = nil
	}
	if t.pool != nil {
		t.pool.Close()
	}
}

// checkPublished fails the task when a table it captures exists under its
// configured name but is not in the connector's publication: dropped and
// made again, or swapped for another table (online schema-change tools
// rename the original away and a copy into its place). A publication
// holds tables, not names: nothing written to the new table is decoded,
// and only a Start adds it. A name that is gone is no problem (a rename:
// the table stays in the publication). A failed query is left to the
// next check.
func (t *Task) checkPublished(ctx context.Context) error {
	schemas, names := splitNames(t.tables)
	rows, err := t.pool.Query(ctx, `
SELECT x.s, x.n
FROM unnest($1::text[], $2::text[]) AS x(s, n)
JOIN pg_catalog.pg_namespace ns ON ns.nspname = x.s
JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = x.n AND c.relkind IN ('r', 'p')
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel pr JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
                  WHERE p.pubname = $3 AND pr.prrelid = c.oid)
ORDER BY 1, 2`, schemas, names, t.lg.publication)
	unpublished, ok := t.checkedTables(rows, err)
	if !ok || len(unpublished) == 0 {
		return nil
	}
	return fmt.Errorf("%s not in this connector's publication %s: dropped and made again, or another table took the name (an online schema change, or a swap of captured tables), so its changes are not captured; restart the connector (POST /connectors/%s/restart?includeTasks=true), whose Start adds it to the publication",
		tablesPhrase(unpublished, "is", "are"), t.lg.publication, t.s.name)
}

// warnReplicaIdentity warns of captured tables whose replica identity
// stopped fitting since Start checked them: mostly a partition created or
// attached since, under a partitioned table without a primary key, which
// gets no replica identity, so that the publication makes every UPDATE and
// DELETE on it fail. The connector does not change the user's tables, and
// failing the task would not help the writers: the warning names the
// table and the fix, once for each new state.
func (t *Task) warnReplicaIdentity(ctx context.Context) {
	problems, err := checkReplicaIdentity(ctx, t.pool, t.s)
	if err != nil {
		return // left to the next check
	}
	var all []string
	for _, k := range slices.Sorted(maps.Keys(problems)) {
		all = append(all, problems[k]...)
	}
	text := strings.Join(all, "; ")
	if text != "" && text != t.lg.identityWarned {
		t.host.Logger.Warn("captured tables' replica identity does not fit the publication", "problems", text)
	}
	t.lg.identityWarned = text
}
