package pgaudit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// snapshotChunkPages is how many heap pages one chunk of an incremental
// snapshot copies at most, in one short transaction; snapshotChunkBytes is
// about how many bytes of images a chunk aims at (fewer pages where the
// rows' out-of-line values make pages weigh more: see chunkPagesFor);
// snapshotLockTimeout is how
// long a chunk waits for a table lock (a rewrite) before it gives way;
// snapshotGiveWayDelay is how long after giving way it is tried again;
// snapshotRecheck is how often a task with nothing left to copy looks for
// copies asked for by hand (rows inserted into the progress table)
// (variables for tests).
var (
	snapshotChunkPages   int64 = 64
	snapshotChunkBytes   int64 = 8 << 20
	snapshotLockTimeout        = 2 * time.Second
	snapshotGiveWayDelay       = 200 * time.Millisecond
	snapshotRecheck            = 10 * time.Second
)

// copyChunk copies the next chunk of one of the task's pending incremental
// snapshots into the audit table, as 'r' changes that the task then reads
// like any others (docs/decisions/0073). It reports whether there was
// anything to do; once nothing is pending the task looks again only every
// snapshotRecheck (for copies asked for by hand).
//
// The chunk's rows are read FOR SHARE NOWAIT: a writer that changed one of
// them and has not committed makes the chunk give way (it is tried again
// after snapshotGiveWayDelay), and a writer that comes later waits for the
// chunk's commit, so its change is drawn after the chunk's rows. A row's
// 'r' therefore never carries an older state than a change sent before
// it. The chunk never waits while it holds row locks: a writer holding a
// later row of the chunk and waiting for an earlier one would otherwise be
// the victim of the deadlock (it waited first, so its deadlock check runs
// first).
func (t *Task) copyChunk(ctx context.Context) (copied bool, err error) {
	tx, err := t.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// A chunk waits for a rewrite in progress (not for writers of its
	// rows: NOWAIT), for up to snapshotLockTimeout; then it gives way. A
	// shorter statement_timeout of the role would fail the task instead:
	// off for the waits, the role's again for the copy.
	// Hash aggregation keeps each group's rows in the order they came (a
	// sort need not): on, whatever the role's default.
	var statementTimeout string
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.current_setting('statement_timeout'), pg_catalog.set_config('statement_timeout', '0', true), pg_catalog.set_config('lock_timeout', $1, true), pg_catalog.set_config('row_security', 'off', true), pg_catalog.set_config('enable_hashagg', 'on', true)`, fmt.Sprintf("%dms", snapshotLockTimeout.Milliseconds())).Scan(&statementTimeout, new(string), new(string), new(string), new(string)); err != nil {
		return false, err
	}
	var schemas, names []string
	for _, tn := range t.tables {
		schemas, names = append(schemas, tn.Schema), append(names, tn.Name)
	}
	var (
		relid                   uint32
		filedSchema, filedTable string
		filenode                *uint32 // NULL: not measured yet (a copy asked for by hand)
		next                    int64
		end                     *int64
		leafSchema, leafTable   *string
		relkind                 *string
	)
	// One of the task's tables, locked against another instance of the
	// task (an older one still stopping) copying the same chunk. Every
	// operator, function and type schema-qualified: the task's session may
	// have look-alikes first in its search_path.
	err = tx.QueryRow(ctx, `SELECT p.relid, p.filed_schema, p.filed_table, p.filenode, p.next_block, p.end_block,
       ns.nspname::pg_catalog.text, c.relname::pg_catalog.text, c.relkind::pg_catalog.text
FROM `+t.snapshotTable+` p
LEFT JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.relid
LEFT JOIN pg_catalog.pg_namespace ns ON ns.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE EXISTS (SELECT 1 FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) AS x(s, n)
              WHERE p.filed_schema OPERATOR(pg_catalog.=) x.s AND p.filed_table OPERATOR(pg_catalog.=) x.n)
ORDER BY pg_catalog.array_position($3::pg_catalog.oid[], p.relid) NULLS FIRST, p.filed_schema, p.filed_table, p.relid
LIMIT 1 FOR UPDATE OF p`, schemas, names, t.chunkSkip).Scan(&relid, &filedSchema, &filedTable, &filenode, &next, &end, &leafSchema, &leafTable, &relkind)
	if errors.Is(err, pgx.ErrNoRows) {
		t.snapshotPending = false
		t.snapshotCheckedAt = time.Now()
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// A relation whose chunk gave way goes last next time: a row lock held
	// for long (a session idle in its transaction) holds back only its own
	// table's copy, not those of the task's other tables. Those that gave
	// way take turns, the longest ago first (one transaction can hold rows
	// of several tables).
	defer func() {
		gaveWay := err != nil && copyAgain(err)
		if err == nil || gaveWay {
			t.chunkSkip = slices.DeleteFunc(t.chunkSkip, func(r uint32) bool { return r == relid })
		}
		if gaveWay {
			t.chunkSkip = append(t.chunkSkip, relid)
		}
	}()
	filed := tableName{filedSchema, filedTable}
	done := func(what string) (bool, error) {
		if _, err := tx.Exec(ctx, `DELETE FROM `+t.snapshotTable+` WHERE relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid`, relid); err != nil {
			return false, err
		}
		if err := tx.Commit(ctx); err != nil {
			return false, err
		}
		t.host.Logger.Info(what, "table", filed.String(), "relid", relid)
		return true, nil
	}
	switch {
	case leafTable == nil:
		return done("incremental snapshot: a relation of the table is gone; nothing left to copy of it")
	case *relkind == "p":
		// A partitioned table named by hand: its leaf partitions are
		// copied one by one, each measured when its copy starts.
		if _, err := tx.Exec(ctx, `INSERT INTO `+t.snapshotTable+` (relid, filed_schema, filed_table, next_block)
SELECT pt.relid, $2, $3, 0 FROM pg_catalog.pg_partition_tree($1::pg_catalog.oid) pt
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pt.relid
WHERE pt.isleaf AND c.relkind OPERATOR(pg_catalog.=) 'r'
ON CONFLICT (relid) DO UPDATE SET filenode = NULL, next_block = 0, end_block = NULL`, relid, filedSchema, filedTable); err != nil {
			return false, err
		}
		return done("incremental snapshot: copying the partitioned table partition by partition")
	case *relkind != "r":
		return done("incremental snapshot: a relation that is not a table (a foreign table?) cannot be copied; skipped")
	}
	leaf := tableName{*leafSchema, *leafTable}
	// ROW SHARE: writers go on; a rewrite (VACUUM FULL, CLUSTER, ALTER
	// TABLE ... TYPE) waits for the chunk, or the chunk for it.
	if _, err := tx.Exec(ctx, `LOCK TABLE ONLY `+leaf.quoted()+` IN ROW SHARE MODE`); err != nil {
		return false, fmt.Errorf("locking %s: %w", leaf.quoted(), err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('statement_timeout', $1, true)`, statementTimeout); err != nil {
		return false, err
	}
	// Still captured under the name it is filed under: the relation itself
	// (a table, perhaps renamed since) or one of its ancestors (a partitioned
	// table; pg_partition_ancestors lists none for a plain table) carries the
	// connector's capture trigger filing under it. A partition detached
	// since is not: its rows left the captured table without a change
	// sent, and no trigger sees their later changes; copying them would
	// send rows (and states) the captured table never held. Nor is a
	// relation named by mistake in a copy asked for by hand.
	// And the name locked (and read below) is still the relation's: LOCK
	// TABLE looks the name up again once it has the lock, so a swap it
	// waited for (the table renamed, another made under its name) left it
	// holding the other table, whose rows no trigger captures.
	// The sizes of the heap and its TOAST table, not pg_table_size: that
	// opens the TOAST index too, and would wait for a REINDEX of it under
	// the role's statement_timeout, outside the copy.
	var currentNode uint32
	var currentBlocks, tableBytes int64
	var captured, same bool
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.pg_relation_filenode($1::pg_catalog.oid), pg_catalog.pg_relation_size($1::pg_catalog.oid) OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8,
       pg_catalog.pg_relation_size($1::pg_catalog.oid) OPERATOR(pg_catalog.+) COALESCE((SELECT pg_catalog.pg_relation_size(tc.reltoastrelid) FROM pg_catalog.pg_class tc WHERE tc.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid AND tc.reltoastrelid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid), 0),
       COALESCE(pg_catalog.to_regclass($6::pg_catalog.text)::pg_catalog.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid, false),
       EXISTS (SELECT 1 FROM (SELECT $1::pg_catalog.oid AS relid UNION ALL SELECT pg_catalog.pg_partition_ancestors($1::pg_catalog.oid)::pg_catalog.oid) a
               JOIN pg_catalog.pg_trigger tg ON tg.tgrelid OPERATOR(pg_catalog.=) a.relid
               WHERE tg.tgparentid OPERATOR(pg_catalog.=) 0::pg_catalog.oid
                 AND tg.tgfoid OPERATOR(pg_catalog.=) ANY (ARRAY[pg_catalog.to_regprocedure($2), pg_catalog.to_regprocedure($3)]::pg_catalog.oid[])
                 AND (tg.tgnargs OPERATOR(pg_catalog.=) 0::pg_catalog.int2
                      OR tg.tgargs OPERATOR(pg_catalog.=) (pg_catalog.convert_to($4, pg_catalog.getdatabaseencoding()) OPERATOR(pg_catalog.||) '\x00'::pg_catalog.bytea
                                     OPERATOR(pg_catalog.||) pg_catalog.convert_to($5, pg_catalog.getdatabaseencoding()) OPERATOR(pg_catalog.||) '\x00'::pg_catalog.bytea)))`,
		relid, pgx.Identifier{t.s.auditSchema, t.n.function}.Sanitize()+"()", pgx.Identifier{t.s.auditSchema, t.n.rowFunction}.Sanitize()+"()",
		filed.Schema, filed.Name, leaf.quoted()).Scan(&currentNode, &currentBlocks, &tableBytes, &same, &captured); err != nil {
		return false, err
	}
	if !same {
		return false, errRenamedMeanwhile // the next try reads its name now
	}
	if !captured {
		return done("incremental snapshot: the relation is no longer captured under the table (a partition detached, or its capture triggers dropped); nothing left to copy of it")
	}
	if filenode == nil || end == nil || *filenode != currentNode {
		// Not measured yet (asked for by hand), or rewritten since the
		// copy began: rows moved between pages, some into pages already
		// copied. Start from the first page, up to the size now (rows
		// past it come later, under the triggers).
		if filenode == nil || end == nil {
			t.host.Logger.Info("incremental snapshot: starting a copy asked for by hand", "table", filed.String(), "relation", leaf.String(), "pages", currentBlocks)
		} else {
			t.host.Logger.Info("incremental snapshot: the table was rewritten since its copy began (VACUUM FULL, CLUSTER, a column type change); copying it again from the start", "table", filed.String(), "relation", leaf.String())
		}
		next = 0
		filenode, end = &currentNode, &currentBlocks
		if _, err := tx.Exec(ctx, `UPDATE `+t.snapshotTable+` SET filenode = $2, next_block = 0, end_block = $3 WHERE relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid`, relid, currentNode, currentBlocks); err != nil {
			return false, err
		}
	}
	if next >= *end {
		return done("incremental snapshot: the table's rows are copied")
	}
	pages := t.chunkPagesFor(relid, currentBlocks, tableBytes)
	upto := min(next+pages, *end)
	var imgSchema, imgTable *string
	var imgRelid *uint32
	if leaf != filed {
		// A partition, or a table renamed since: the images are of its row
		// type (as the capture functions record them).
		imgSchema, imgTable, imgRelid = &leaf.Schema, &leaf.Name, &relid
	}
	// Grouped as the blocking copy's (0007_initial_snapshot.up.sql): up to
	// chunkChanges changes per audit row, fewer where their images pass
	// groupBytes.
	group := fmt.Sprintf(`(((g.rn OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) %d) OPERATOR(pg_catalog.*) 1048576) OPERATOR(pg_catalog.+) (g.run OPERATOR(pg_catalog./) %d)`, chunkChanges, groupBytes)
	var copiedBytes int64
	if err := tx.QueryRow(ctx, `WITH ins AS (INSERT INTO `+t.auditTable+` (txid, schema_name, table_name, image_schema, image_table, image_relid, op, changes, after)
SELECT pg_catalog.pg_current_xact_id(), $1, $2, $3, $4, $5, 'r', pg_catalog.count(*), pg_catalog.array_send(pg_catalog.array_agg(g.r))
FROM (SELECT pg_catalog.row_number() OVER w AS rn, s.r, pg_catalog.sum(pg_catalog.octet_length(s.r)) OVER w AS run
      FROM (SELECT pg_catalog.record_send(c.*) AS r FROM ONLY `+leaf.quoted()+` c
            WHERE c.ctid OPERATOR(pg_catalog.>=) $6::pg_catalog.tid AND c.ctid OPERATOR(pg_catalog.<) $7::pg_catalog.tid
            FOR SHARE OF c NOWAIT OFFSET 0) s
      WINDOW w AS (ROWS UNBOUNDED PRECEDING)) g
GROUP BY `+group+` ORDER BY `+group+`
RETURNING pg_catalog.octet_length(after) AS bytes)
SELECT COALESCE(pg_catalog.sum(ins.bytes), 0)::pg_catalog.int8 FROM ins`,
		filed.Schema, filed.Name, imgSchema, imgTable, imgRelid, fmt.Sprintf("(%d,0)", next), fmt.Sprintf("(%d,0)", upto)).Scan(&copiedBytes); err != nil {
		return false, fmt.Errorf("copying pages %d to %d of %s: %w", next, upto, leaf.quoted(), err)
	}
	t.chunkCopied(relid, upto-next, copiedBytes)
	if upto >= *end {
		return done("incremental snapshot: the table's rows are copied")
	}
	if _, err := tx.Exec(ctx, `UPDATE `+t.snapshotTable+` SET next_block = $2 WHERE relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid`, relid, upto); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	t.host.Logger.Debug("incremental snapshot: copied a chunk", "table", filed.String(), "relation", leaf.String(), "pages", fmt.Sprintf("%d-%d of %d", next, upto, *end))
	return true, nil
}

// chunkPagesFor is how many pages the next chunk of relation relid copies:
// snapshotChunkPages where its pages hold a few kilobytes of rows, fewer
// where out-of-line (TOAST) values make a page weigh megabytes, so that a
// chunk stays near snapshotChunkBytes of images and holds its rows' share
// locks, which writers of those rows wait for, only briefly. The first
// chunk of a relation goes by its size on disk (heap and TOAST, per page);
// later ones by what the last chunk copied (images are decompressed, and
// can weigh more than the disk says). At least one page.
func (t *Task) chunkPagesFor(relid uint32, blocks, tableBytes int64) int64 {
	if t.chunkRelid == relid && t.chunkPages > 0 {
		return min(t.chunkPages, snapshotChunkPages)
	}
	if blocks <= 0 || tableBytes <= 0 {
		return snapshotChunkPages
	}
	return max(1, min(snapshotChunkPages, snapshotChunkBytes*blocks/tableBytes))
}

// chunkCopied adjusts the chunk size of relid to what a chunk of pages
// pages copied: smaller at once past snapshotChunkBytes, doubling back while
// under half of it.
func (t *Task) chunkCopied(relid uint32, pages, bytes int64) {
	switch {
	case pages <= 0:
		return
	case bytes > snapshotChunkBytes:
		pages = max(1, pages*snapshotChunkBytes/bytes)
	case bytes < snapshotChunkBytes/2:
		pages = min(snapshotChunkPages, pages*2)
	}
	t.chunkRelid, t.chunkPages = relid, pages
}

// errRenamedMeanwhile: the relation of a chunk was renamed between reading
// its name and locking the table by that name, and another table has the
// name now.
var errRenamedMeanwhile = errors.New("the table was renamed while the chunk waited for its lock, and another table took its name")

// copyAgain reports whether a chunk that failed with err is simply tried
// again shortly: a row locked by a writer (NOWAIT) or a table lock wait
// that ran out of time (lock_timeout), both 55P03; the relation renamed
// between reading its name and copying from it (the next try reads the
// new name); a deadlock with a Start that drops the table's trigger; or a
// row of the chunk moved to another partition by a writer that committed
// while the chunk read (40001, "tuple to be locked was already moved to
// another partition": the only serialization failure under READ
// COMMITTED), not a database in trouble.
func copyAgain(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, errRenamedMeanwhile) ||
		errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "42P01" || pgErr.Code == "40P01" || pgErr.Code == "40001")
}
