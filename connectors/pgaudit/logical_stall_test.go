package pgaudit

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// stallableConn is a socket whose writes can be made to block, as a
// server that stopped reading (its receive window full) makes them: until
// the write deadline, or forever without one.
type stallableConn struct {
	net.Conn
	stalled       atomic.Bool
	blocked       atomic.Int32 // writes held by the stall
	writeDeadline atomic.Int64 // unix nanoseconds; 0: none
}

func (c *stallableConn) SetDeadline(t time.Time) error {
	c.storeWriteDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *stallableConn) SetWriteDeadline(t time.Time) error {
	c.storeWriteDeadline(t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *stallableConn) storeWriteDeadline(t time.Time) {
	if t.IsZero() {
		c.writeDeadline.Store(0)
	} else {
		c.writeDeadline.Store(t.UnixNano())
	}
}

func (c *stallableConn) Write(b []byte) (int, error) {
	if c.stalled.Load() {
		c.blocked.Add(1)
		defer c.blocked.Add(-1)
	}
	for c.stalled.Load() {
		if d := c.writeDeadline.Load(); d != 0 && time.Now().UnixNano() >= d {
			return 0, &net.OpError{Op: "write", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return c.Conn.Write(b)
}

// TestLogicalStalledStatusWrite: a replication connection whose status
// report cannot be written (the server stopped reading) neither holds the
// reader, which reconnects and goes on capturing, nor Stopped.
func TestLogicalStalledStatusWrite(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "w")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-stall-")
	dropSlotAfter(t, db, name)

	var mu sync.Mutex
	var conns []*stallableConn
	replicationDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc := &stallableConn{Conn: c}
		mu.Lock()
		conns = append(conns, sc)
		mu.Unlock()
		return sc, nil
	}
	savedInterval := standbyInterval
	standbyInterval = 300 * time.Millisecond
	t.Cleanup(func() { replicationDial, standbyInterval = nil, savedInterval })
	stallAll := func(on bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.stalled.Store(on)
		}
	}
	t.Cleanup(func() { stallAll(false) })
	// awaitBlocked waits for a status report to block on the newest
	// connection.
	awaitBlocked := func() {
		t.Helper()
		mu.Lock()
		last := conns[len(conns)-1]
		mu.Unlock()
		for deadline := time.Now().Add(10 * time.Second); last.blocked.Load() == 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no status report was attempted on the stalled connection within 10 s")
			}
		}
	}

	r := startConnector(t, logicalConfig(name, url, s+".w"), connect.NewMemoryLedger())
	stopped := false
	defer func() {
		if !stopped {
			stallAll(false)
			_ = r.stop(true)
		}
	}()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	if got := r.collect(1, true); len(got) != 1 || got[0].After["id"] != json.Number("1") {
		t.Fatalf("before the stall: %+v", got)
	}

	// The stream's socket takes no more writes: the next status report
	// blocks until its deadline, and the reader reconnects.
	stallAll(true)
	awaitBlocked()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	if got := r.collect(1, true); len(got) != 1 || got[0].After["id"] != json.Number("2") {
		t.Fatalf("after the stall: %+v", got)
	}
	mu.Lock()
	n := len(conns)
	mu.Unlock()
	if n < 2 {
		t.Errorf("%d replication connections; the reader should have reconnected", n)
	}

	// Stop while a status report is blocked on the new connection too.
	stallAll(true)
	awaitBlocked()
	done := make(chan error, 1)
	go func() { done <- r.stop(true) }()
	select {
	case err := <-done:
		stopped = true
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		stallAll(false)
		<-done
		stopped = true
		t.Fatal("Stopped did not return within 30 s while a status report was blocked")
	}
	if slot, pub := slotAndPublication(t, db, name); slot || pub {
		t.Errorf("after deletion: slot %v, publication %v", slot, pub)
	}
}

// TestLogicalPartitionWithoutIdentityWarned: a partition created after
// Start under a partitioned table without a primary key has no replica
// identity, and the publication makes its UPDATEs fail; the task warns,
// naming it and the fix, once, and capture goes on once it is fixed.
func TestLogicalPartitionWithoutIdentityWarned(t *testing.T) {
	db, url := logicalAdmin(t)
	logs := captureLogs(t)
	s := newSchema(t, db)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int, v text) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+p+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `ALTER TABLE `+p+` REPLICA IDENTITY FULL`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p1")+` REPLICA IDENTITY FULL`)
	name := testenv.Unique("logical-newpart-")
	dropSlotAfter(t, db, name)
	r := startConnector(t, logicalConfig(name, url, s+".p"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+p+` VALUES (1, 'a')`)
	r.collect(1, true)
	if strings.Contains(logs.String(), "replica identity does not fit") {
		t.Fatalf("warned before anything was wrong:\n%s", logs.String())
	}

	mustExec(t, db, `CREATE TABLE `+qualified(s, "p2")+` PARTITION OF `+p+` FOR VALUES FROM (10) TO (20)`)
	mustExec(t, db, `INSERT INTO `+p+` VALUES (11, 'b')`)
	if _, err := db.Exec(testCtx(t), `UPDATE `+p+` SET v = 'c' WHERE id = 11`); err == nil || !strings.Contains(err.Error(), "replica identity") {
		t.Fatalf("UPDATE of the new partition: %v; want PostgreSQL's replica identity error (the hazard warned of)", err)
	}
	r.collect(1, true)
	r.pollAll(true)
	out := logs.String()
	if n := strings.Count(out, "replica identity does not fit"); n != 1 {
		t.Fatalf("%d warnings, want one:\n%s", n, out)
	}
	if !strings.Contains(out, "partition "+s+".p2") || !strings.Contains(out, "REPLICA IDENTITY FULL") {
		t.Errorf("the warning does not name the partition and the fix:\n%s", out)
	}

	mustExec(t, db, `ALTER TABLE `+qualified(s, "p2")+` REPLICA IDENTITY FULL`)
	mustExec(t, db, `UPDATE `+p+` SET v = 'c' WHERE id = 11`)
	got := r.collect(1, true)
	if got[0].Op != "u" || got[0].Before["v"] != "b" || got[0].After["v"] != "c" {
		t.Errorf("the update after the fix: %+v", got[0])
	}
	if n := strings.Count(logs.String(), "replica identity does not fit"); n != 1 {
		t.Errorf("%d warnings after the fix, want still one", n)
	}
}

// TestLogicalConfirmedNeverMovesBack: a task instance that started while
// an earlier one still held the slot (as after the worker gave up waiting
// for it) does not report the older position it read at its Start once it
// gets the slot: a server that takes reported positions as they come
// would move the slot back, and send again what the earlier instance had
// delivered.
func TestLogicalConfirmedNeverMovesBack(t *testing.T) {
	db, url := logicalAdmin(t)
	savedInterval := standbyInterval
	standbyInterval = 200 * time.Millisecond
	t.Cleanup(func() { standbyInterval = savedInterval })
	s := newSchema(t, db)
	tbl := qualified(s, "c")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-back-")
	dropSlotAfter(t, db, name)
	_, slot := logicalNames(name)
	r := startConnector(t, logicalConfig(name, url, s+".c"), connect.NewMemoryLedger())
	defer func() {
		if err := r.stop(true); err != nil {
			t.Error(err)
		}
	}()
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	r.collect(1, true)

	// A second instance starts while the first holds the slot: it waits.
	tcs, err := r.conn.TaskConfigs(1)
	if err != nil {
		t.Fatal(err)
	}
	second := &Task{}
	hctx := connect.WithHost(testCtx(t), testHost(r.name, 0, r.ledger))
	if err := second.Start(hctx, tcs[0]); err != nil {
		t.Fatal(err)
	}
	startedAt := second.lg.confirmed.Load()

	// The first delivers more, and goes.
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (2)`)
	r.collect(1, true)
	first := r.tasks[0]
	// Until its pending list is empty too: a position past startedAt may
	// be one the first confirmed in memory before the second's Start read
	// the slot, while the transaction of id 2 waits for its COMMIT to be
	// polled (the second would rightly send it again).
	for deadline := time.Now().Add(10 * time.Second); first.lg.confirmed.Load() <= startedAt || len(first.lg.pending) > 0; r.pollAll(true) {
		if time.Now().After(deadline) {
			t.Fatal("the first instance did not confirm its delivery within 10 s")
		}
	}
	// The first's walsender, which may still show in pg_stat_replication
	// (and hold the slot) for a moment after Stopped.
	var firstPid int32
	if err := db.QueryRow(testCtx(t), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&firstPid); err != nil {
		t.Fatal(err)
	}
	first.Stop(false)
	if err := first.Stopped(hctx); err != nil {
		t.Fatal(err)
	}
	r.tasks[0] = second
	lsnOf := func(q string, args ...any) uint64 {
		var v *string
		if err := db.QueryRow(testCtx(t), q, append([]any{slot}, args...)...).Scan(&v); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if v == nil {
			return 0
		}
		lsn, err := pglogrepl.ParseLSN(*v)
		if err != nil {
			t.Fatal(err)
		}
		return uint64(lsn)
	}
	const slotConfirmed = `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`
	// The walsender takes the first instance's last report after Stopped
	// returned (it reads it before the connection's end).
	delivered := lsnOf(slotConfirmed)
	for deadline := time.Now().Add(10 * time.Second); delivered <= startedAt; delivered = lsnOf(slotConfirmed) {
		if time.Now().After(deadline) {
			t.Fatalf("the first instance's delivery did not move the slot (%d, %d at the second's Start)", delivered, startedAt)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The second takes the slot and reports its position.
	const reported = `SELECT r.flush_lsn::text FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1 AND r.pid <> $2`
	var got uint64
	for deadline := time.Now().Add(20 * time.Second); got == 0; got = lsnOf(reported, firstPid) {
		if time.Now().After(deadline) {
			t.Fatal("the second instance did not take the slot and report within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// PostgreSQL 15.20 here keeps the slot where it is when a reader
	// reports less; earlier releases took the position as reported.
	if got < delivered {
		t.Errorf("the second instance reported %s, behind the slot's %s (its position at its Start: %s)",
			pglogrepl.LSN(got), pglogrepl.LSN(delivered), pglogrepl.LSN(startedAt))
	}
	if got := lsnOf(slotConfirmed); got < delivered {
		t.Errorf("the slot moved back from %s to %s (the second instance's position at its Start: %s)",
			pglogrepl.LSN(delivered), pglogrepl.LSN(got), pglogrepl.LSN(startedAt))
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (3)`)
	if got := r.collect(1, true); got[0].After["id"] != json.Number("3") {
		t.Errorf("the second instance sent %v first, want only id 3", got[0].After)
	}
	r.quiet()
}
