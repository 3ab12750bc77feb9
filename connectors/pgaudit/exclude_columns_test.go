package pgaudit

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func TestParseExcludedColumns(t *testing.T) {
	tests := []struct {
		in      string
		want    map[tableName]map[string]bool
		wantErr string
	}{
		{"", map[tableName]map[string]bool{}, ""},
		{"users.ssn", map[tableName]map[string]bool{{"public", "users"}: {"ssn": true}}, ""},
		{` shop.users.ssn , shop.users."card.no", "a,b"."t".c `, map[tableName]map[string]bool{
			{"shop", "users"}: {"ssn": true, "card.no": true},
			{"a,b", "t"}:      {"c": true},
		}, ""},
		{"users", nil, "got 1 dot-separated parts"},
		{"a.b.c.d", nil, "got 4 dot-separated parts"},
		{"a.b.c,,a.b.d", nil, "empty item"},
		{`a.b."c`, nil, "unterminated"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseExcludedColumns(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseExcludedColumns(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseExcludedColumns(%q): %v", tt.in, err)
			}
			if !maps.EqualFunc(got, tt.want, maps.Equal) {
				t.Fatalf("parseExcludedColumns(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestWithoutMembers(t *testing.T) {
	drop := map[string]bool{"b": true, `q"x`: true}
	for _, tc := range []struct{ in, want string }{
		{`{"a":1,"b":{"b":2},"c":[3]}`, `{"a":1,"c":[3]}`},
		{`{"b":1}`, `{}`},
		{`{}`, `{}`},
		{`{"q\"x":1,"a<b":"\u00e9"}`, `{"a<b":"\u00e9"}`}, // names and values kept byte for byte
		{`not json`, `not json`},
	} {
		if got := string(withoutMembers([]byte(tc.in), drop)); got != tc.want {
			t.Errorf("withoutMembers(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestColumnExcludeList: the listed columns are left out of before and
// after (single and grouped changes), including a primary-key column,
// which the key still holds; other tables and columns are untouched.
func TestColumnExcludeList(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	users, other := qualified(s, "users"), qualified(s, "other")
	mustExec(t, db, `CREATE TABLE `+users+` (id int PRIMARY KEY, name text, ssn text, "card.no" text)`)
	mustExec(t, db, `CREATE TABLE `+other+` (id int PRIMARY KEY, ssn text)`)
	cfg := baseConfig(testenv.Unique("exclude-"), url, auditSchemaFor(t, db), s+".users", s+".other")
	cfg[KeyColumnExcludeList] = fmt.Sprintf(`%s.users.ssn, %s.users."card.no", %s.users.id`, s, s, s)
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	const bulk = singleChanges + 6 // into a grouped audit row
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, 'n' || g, 'secret', '4111' FROM generate_series(1, %d) g`, users, bulk))
	mustExec(t, db, `UPDATE `+users+` SET name = 'm' WHERE id = 1`)
	mustExec(t, db, `INSERT INTO `+other+` VALUES (1, 'kept')`)

	recs := r.collectRecords(bulk + 2)
	r.quiet()
	for i, rec := range recs {
		c := decode(t, rec)
		v := string(rec.Value)
		switch c.Source.Table {
		case "users":
			if strings.Contains(v, "secret") || strings.Contains(v, "4111") || strings.Contains(v, `"ssn"`) || strings.Contains(v, "card.no") || strings.Contains(v, `"id"`) {
				t.Fatalf("record %d still has an excluded column: %s", i, v)
			}
			if !strings.Contains(v, `"name":"`) || !strings.HasPrefix(string(rec.Key), `{"id":`) {
				t.Fatalf("record %d lost what it keeps (name, the key): key %s value %s", i, rec.Key, v)
			}
			if c.Op == "u" && (!strings.Contains(v, `"before":{"name":"n1"}`) || !strings.Contains(v, `"after":{"name":"m"}`)) {
				t.Fatalf("update record %s, want before and after with name only", v)
			}
		case "other":
			if !strings.Contains(v, `"after":{"id":1,"ssn":"kept"}`) {
				t.Fatalf("a table not listed lost a column: %s", v)
			}
		default:
			t.Fatalf("record of an unexpected table: %s", v)
		}
	}
}
