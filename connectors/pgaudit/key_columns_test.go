package pgaudit

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func TestParseKeyColumns(t *testing.T) {
	tests := []struct {
		in      string
		want    map[tableName][]string
		wantErr string
	}{
		{"", map[tableName][]string{}, ""},
		{"orders:id", map[tableName][]string{{"public", "orders"}: {"id"}}, ""},
		{" shop.orders : tenant , id ; shop.items:sku", map[tableName][]string{{"shop", "orders"}: {"tenant", "id"}, {"shop", "items"}: {"sku"}}, ""},
		{`"a;b"."c:d":"x,y","q""r"`, map[tableName][]string{{"a;b", "c:d"}: {"x,y", `q"r`}}, ""},
		{`s.t:"a.b"`, map[tableName][]string{{"s", "t"}: {"a.b"}}, ""},
		{"s.t", nil, "expected <table>:<column>"},
		{"s.t:", nil, "column names after ':'"},
		{"s.t:a,,b", nil, "column names after ':'"},
		{"s.t:a;;s.u:b", nil, "empty entry"},
		{"s.t:a:b", nil, "expected <table>:<column>"},
		{"s.t,s.u:a", nil, "one table before ':'"},
		{"s.t:a;s.t:b", nil, "listed twice"},
		{"s.t:a,a", nil, `column "a" listed twice`},
		{"s.t:x.y", nil, "quote a name that contains '.'"},
		{`s.t:"open`, nil, "unterminated"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseKeyColumns(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseKeyColumns(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseKeyColumns(%q): %v", tt.in, err)
			}
			if !maps.EqualFunc(got, tt.want, slices.Equal) {
				t.Fatalf("parseKeyColumns(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestMessageKeyColumns: message.key.columns keys a table without a
// primary key, and replaces the primary key of another, with the listed
// columns in the listed order; a null value in such a column is part of
// the key (it is not a primary key); TRUNCATE stays keyless; a table not
// listed keeps its primary key.
func TestMessageKeyColumns(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	keyless, keyed, plain := qualified(s, "keyless"), qualified(s, "keyed"), qualified(s, "plain")
	mustExec(t, db, `CREATE TABLE `+keyless+` (a int, "b,c" text, v text)`)
	mustExec(t, db, `CREATE TABLE `+keyed+` (id int PRIMARY KEY, code text)`)
	mustExec(t, db, `CREATE TABLE `+plain+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("msgkey-"), url, auditSchemaFor(t, db), s+".keyless", s+".keyed", s+".plain")
	cfg[KeyMessageKeyColumns] = fmt.Sprintf(`%s.keyless:"b,c",a; %s.keyed:code`, s, s)
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+keyless+` VALUES (1, 'x', 'v1'), (2, NULL, 'v2')`)
	mustExec(t, db, `UPDATE `+keyless+` SET v = 'w' WHERE a = 1`)
	mustExec(t, db, `DELETE FROM `+keyless+` WHERE a = 2`)
	mustExec(t, db, `INSERT INTO `+keyed+` VALUES (1, 'k1')`)
	mustExec(t, db, `INSERT INTO `+plain+` VALUES (5)`)
	mustExec(t, db, `TRUNCATE `+keyless)

	recs := r.collectRecords(7)
	r.quiet()
	var got []string
	for _, rec := range recs {
		got = append(got, fmt.Sprintf("%s %s", decode(t, rec).Source.Table, rec.Key))
	}
	want := []string{
		`keyless {"b,c":"x","a":1}`,
		`keyless {"b,c":null,"a":2}`,
		`keyless {"b,c":"x","a":1}`,
		`keyless {"b,c":null,"a":2}`,
		`keyed {"code":"k1"}`,
		`plain {"id":5}`,
		`keyless `,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("keys:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
