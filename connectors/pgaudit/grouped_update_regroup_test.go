package pgaudit

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestGroupedUpdateRegroupedUnderHostileSessions: a bulk UPDATE whose images
// pass sideBytes / chunkChanges while its sides stay within sideBytes is
// grouped a second time with nothing left out (0003's LOOP). That second
// pass runs in the writer's session like the first: with look-alike
// operators, functions and types first in its search_path, with
// capture.order=commit renumbering at once (SET CONSTRAINTS ALL IMMEDIATE),
// and on a table whose columns carry the names of the aliases the grouping
// uses. Every change comes out once, in statement order, paired, from one
// grouped audit row per chunk (not paired row by row, not written twice).
func TestGroupedUpdateRegroupedUnderHostileSessions(t *testing.T) {
	db, url := admin(t)
	e := plantLookAlikes(t, db)
	override(t, &groupBytes, 300)
	override(t, &sideBytes, 60000) // 60 bytes per image: every image here is past it

	const rows = singleChanges + 90
	aliases := []string{"chunk", "g", "len", "r", "bytes", "big", "cnt", "s", "o", "n", "f", "ins", "rn", "run", "img", "over", "v_limit", "v_big", "v_over"}
	ctx := testCtx(t)
	s := newSchema(t, db)
	tbl := qualified(s, "t")
	cols := "id int PRIMARY KEY, v text"
	for _, a := range aliases {
		cols += ", " + pgx.Identifier{a}.Sanitize() + " int"
	}
	mustExec(t, db, `CREATE TABLE `+tbl+` (`+cols+`)`)
	cfg := baseConfig(testenv.Unique("regroup-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeyCaptureOrder] = orderCommit
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s (id, v) SELECT g, 'r' || g FROM generate_series(1, %d) g`, tbl, rows))
	var side int
	if err := db.QueryRow(ctx, `SELECT sum(octet_length(record_send(t.*))) FROM `+tbl+` t`).Scan(&side); err != nil {
		t.Fatal(err)
	}
	if side*11/10 > sideBytes || side/rows <= sideBytes/chunkChanges {
		t.Fatalf("the old side is %d bytes: not the shape under test", side)
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, `SET search_path = `+e+`, pg_catalog, public`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{`SET CONSTRAINTS ALL IMMEDIATE`, `UPDATE ` + tbl + ` SET v = v || 'x'`} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s with a hostile search_path: %v", sql, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	var groups, grouped int
	if err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(changes), 0) FROM `+auditTable(r)+` WHERE op = 'u' AND changes IS NOT NULL`).Scan(&groups, &grouped); err != nil {
		t.Fatal(err)
	}
	if groups != 1 || grouped != rows-singleChanges {
		t.Errorf("%d grouped UPDATE rows holding %d changes, want 1 holding %d (grouped by chunk, once)", groups, grouped, rows-singleChanges)
	}
	got := r.collect(2*rows, true) // the INSERT's, then the UPDATE's
	if len(got) != 2*rows {
		t.Fatalf("%d changes, want %d", len(got), 2*rows)
	}
	for i, c := range got[rows:] {
		id := int64(i + 1)
		if c.Op != "u" || num(t, c.After["id"]) != id || num(t, c.Before["id"]) != id {
			t.Fatalf("change %d: %s of %v / %v, want u of id %d (statement order)", i, c.Op, c.Before, c.After, id)
		}
		if c.Before["v"] != fmt.Sprintf("r%d", id) || c.After["v"] != fmt.Sprintf("r%dx", id) {
			t.Fatalf("update %d mispaired: before %v after %v", id, c.Before, c.After)
		}
	}
	r.quiet()
}
