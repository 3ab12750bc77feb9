package pgaudit

import (
	"testing"
)

// Chunks are sized by the bytes they copy, not by pages alone: rows with
// large out-of-line values made one 64-page chunk weigh hundreds of
// megabytes, holding its rows' share locks (and their writers) for
// seconds. Each case copies documents over some ten to seventy heap pages
// (pad keeps a row's heap tuple near 1 KB, about seven rows a page) and
// wants chunks near snapshotChunkBytes (1 MB), every row copied once.
func TestIncrementalSnapshotChunksBoundedByBytes(t *testing.T) {
	override(t, &snapshotChunkBytes, 1<<20)
	for _, tc := range []struct {
		name string
		rows int
		doc  string
		// fromChunk is the first chunk (by order) that must stay near
		// 1 MB: the size on disk sizes the first one, what was copied
		// the later ones.
		fromChunk int
	}{
		// md5s do not compress: the size on disk tells.
		{"incompressible documents", 70, `(SELECT string_agg(md5(g::text || '.' || i::text), '') FROM generate_series(1, 3200) i)`, 1},
		// Compressed on disk to almost nothing, 50 KB each as images:
		// the first chunk, 64 pages by the disk, copies some 22 MB.
		{"compressible documents", 500, `repeat('d', 50000)`, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, table, r := incrementalTable(t, "inctoast-", 0, nil)
			ctx := testCtx(t)
			mustExec(t, db, `ALTER TABLE `+table+` ADD COLUMN pad text, ADD COLUMN doc text`)
			mustExec(t, db, `INSERT INTO `+table+` SELECT g, 0, repeat('p', 1000), `+tc.doc+` FROM generate_series(1, $1) g`, tc.rows)
			// A copy asked for by hand, of the table as it is now.
			if _, err := db.Exec(ctx, `INSERT INTO `+qualified(r.cfg[KeyAuditSchema], objectNames(r.name).snapshot)+` (relid, filed_schema, filed_table) SELECT $1::regclass, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::regclass
			  ON CONFLICT (relid) DO UPDATE SET filenode = NULL, next_block = 0, end_block = NULL`, table); err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				if i > 500 {
					t.Fatal("the copy did not end after 500 chunks")
				}
				copied, err := r.tasks[0].copyChunk(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !copied {
					break
				}
			}
			audit := qualified(r.cfg[KeyAuditSchema], objectNames(r.name).table)
			var chunks, rows, largest int64
			if err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(n), 0), coalesce(max(bytes) FILTER (WHERE k >= $1), 0) FROM (
			  SELECT sum(changes) AS n, sum(octet_length(after)) AS bytes, row_number() OVER (ORDER BY min(id)) AS k FROM `+audit+` WHERE op = 'r' GROUP BY txid) c`, tc.fromChunk).Scan(&chunks, &rows, &largest); err != nil {
				t.Fatal(err)
			}
			if rows != int64(tc.rows) {
				t.Errorf("%d rows copied, want %d", rows, tc.rows)
			}
			if largest > 2<<20 {
				t.Errorf("a chunk (from the %d.) copied %d bytes of images, want about 1 MB at most (%d chunks)", tc.fromChunk, largest, chunks)
			}
			if chunks < 5 {
				t.Errorf("%d chunks, want several of about a megabyte", chunks)
			}
		})
	}
}
