package pgaudit

import (
	"context"
	"fmt"
	neturl "net/url"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestCaptureWriterClientEncoding: a writer whose client_encoding is not
// UTF8 gets its changes delivered as to_json gives them, and its writes of
// characters that encoding lacks still succeed (record_send converts text
// to the writer's client_encoding), under both capture levels.
func TestCaptureWriterClientEncoding(t *testing.T) {
	for _, level := range []string{levelStatement, levelRow} {
		t.Run(level, func(t *testing.T) {
			_, table, r := oneTable(t, "enc-", `(id int PRIMARY KEY, t text, j jsonb, v varchar(20), e name)`, connect.Config{KeyCaptureLevel: level})
			_, url := admin(t)
			ctx := testCtx(t)
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			// The statements are ASCII; the values are made by chr(). Row 2
			// holds "Ã©", whose LATIN1 bytes read as UTF-8 are "é"; row 3 a
			// character LATIN1 lacks.
			if _, err := conn.Exec(ctx, `SET client_encoding = 'LATIN1';
INSERT INTO `+table+` VALUES (1, chr(233), jsonb_build_object('k', chr(233)), chr(252), chr(246));
INSERT INTO `+table+` VALUES (2, chr(195) || chr(169), NULL, NULL, NULL);
INSERT INTO `+table+` VALUES (3, chr(20013), NULL, NULL, NULL);
UPDATE `+table+` SET t = t || chr(228) WHERE id = 1;
DELETE FROM `+table+` WHERE id = 2;
RESET client_encoding`); err != nil {
				t.Fatalf("writes of a LATIN1 writer: %v", err)
			}
			var enc string
			if err := conn.QueryRow(ctx, `SHOW client_encoding`).Scan(&enc); err != nil || enc != "UTF8" {
				t.Fatalf("the writer's client_encoding after RESET is %q (%v)", enc, err)
			}
			// The capture function sets back what it changed.
			if _, err := conn.Exec(ctx, `BEGIN; SET LOCAL client_encoding = 'LATIN1'; INSERT INTO `+table+` VALUES (4, 'x', NULL, NULL, NULL)`); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, `SELECT current_setting('client_encoding')`).Scan(&enc); err != nil || enc != "LATIN1" {
				t.Errorf("the writer's client_encoding after a captured INSERT is %q (%v), want LATIN1", enc, err)
			}
			if _, err := conn.Exec(ctx, `ROLLBACK`); err != nil {
				t.Fatal(err)
			}

			row1 := `{"id":1,"t":"é","j":{"k":"é"},"v":"ü","e":"ö"}`
			want := []struct{ op, before, after string }{
				{"c", "null", row1},
				{"c", "null", `{"id":2,"t":"Ã©","j":null,"v":null,"e":null}`},
				{"c", "null", `{"id":3,"t":"中","j":null,"v":null,"e":null}`},
				{"u", row1, `{"id":1,"t":"éä","j":{"k":"é"},"v":"ü","e":"ö"}`},
				{"d", `{"id":2,"t":"Ã©","j":null,"v":null,"e":null}`, "null"},
			}
			got := r.collect(len(want), true)
			r.quiet()
			for i, w := range want {
				c := got[i]
				if c.Op != w.op || !reflect.DeepEqual(anyMap(c.Before), jsonOf(t, w.before)) || !reflect.DeepEqual(anyMap(c.After), jsonOf(t, w.after)) {
					t.Errorf("change %d: %s\nwant op %s before %s after %s", i, c.Raw, w.op, w.before, w.after)
				}
			}
		})
	}
}

// TestCaptureNonUTF8Database: in a LATIN1 database, records are UTF-8
// JSON, column names included, whatever the writers' and the database's
// encoding (the task's session reads and renders in UTF8).
func TestCaptureNonUTF8Database(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	name := testenv.Unique("pga_latin1_")
	mustExec(t, db, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'`)
	t.Cleanup(func() {
		if _, err := db.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cc.Database = name
	// Without it, the session would take the database's encoding.
	cc.RuntimeParams["client_encoding"] = "UTF8"
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// Written by a UTF8 client and by a LATIN1 one.
	if _, err := conn.Exec(ctx, `CREATE TABLE public."té" (id int PRIMARY KEY, "é" text)`); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(testenv.Unique("latin1-"), u.String(), "tidy_latin1", "public.té")
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	if _, err := conn.Exec(ctx, `INSERT INTO public."té" VALUES (1, 'ü');
SET client_encoding = 'LATIN1';
INSERT INTO public."té" VALUES (2, chr(252));
RESET client_encoding`); err != nil {
		t.Fatal(err)
	}
	got := r.collect(2, true)
	for i, c := range got {
		if c.Topic != topicName("tc", tableName{"public", "té"}) || c.Source.Table != "té" || !utf8.Valid(c.Raw) || !reflect.DeepEqual(anyMap(c.After), jsonOf(t, fmt.Sprintf(`{"id":%d,"é":"ü"}`, i+1))) {
			t.Errorf("change %d: %q, want its after image {\"id\":%d,\"é\":\"ü\"} in UTF-8", i, c.Raw, i+1)
		}
	}
}

// TestOutputSettingsOfTheDatabase: records render values as documented
// (bytea in hex, intervals and ranges as by default, floats exactly) when
// the database's defaults for the output settings say otherwise: the
// task's session, which renders them, pins those settings as it pins
// TimeZone.
func TestOutputSettingsOfTheDatabase(t *testing.T) {
	db, url := admin(t)
	ctx := testCtx(t)
	name := testenv.Unique("pga_styles_")
	qn := pgx.Identifier{name}.Sanitize()
	mustExec(t, db, `CREATE DATABASE `+qn)
	t.Cleanup(func() {
		if _, err := db.Exec(context.Background(), `DROP DATABASE IF EXISTS `+qn+` WITH (FORCE)`); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	mustExec(t, db, `ALTER DATABASE `+qn+` SET bytea_output = 'escape'`)
	mustExec(t, db, `ALTER DATABASE `+qn+` SET DateStyle = 'SQL, DMY'`)
	mustExec(t, db, `ALTER DATABASE `+qn+` SET IntervalStyle = 'sql_standard'`)
	mustExec(t, db, `ALTER DATABASE `+qn+` SET extra_float_digits = 0`)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE public.t (id int PRIMARY KEY, b bytea, f float8, iv interval, dr daterange, tr tsrange)`); err != nil {
		t.Fatal(err)
	}
	r := startConnector(t, baseConfig(testenv.Unique("styles-"), u.String(), "tidy_styles", "public.t"), connect.NewMemoryLedger())
	t.Cleanup(func() { _ = r.stop(true) })
	if _, err := conn.Exec(ctx, `INSERT INTO public.t VALUES (1, '\xdeadbeef', 0.1::float8 + 0.2, '1 day 02:00', '[2020-01-02,2020-02-01)', '[2020-01-02 03:04,)')`); err != nil {
		t.Fatal(err)
	}
	got := r.collect(1, true)
	want := `{"id":1,"b":"\\xdeadbeef","f":0.30000000000000004,"iv":"1 day 02:00:00","dr":"[2020-01-02,2020-02-01)","tr":"[\"2020-01-02 03:04:00\",)"}`
	if !reflect.DeepEqual(anyMap(got[0].After), jsonOf(t, want)) {
		t.Errorf("after image %v, want %s", got[0].After, want)
	}
}
