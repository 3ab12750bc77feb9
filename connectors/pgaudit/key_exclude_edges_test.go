package pgaudit

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestExcludedColumnNotLeakedByPosition: changes written before a column
// ahead of an excluded one was dropped are read column by column, and the
// values after the dropped column are named by position: the excluded
// column's value must not come out as _column_<n> (single and grouped
// audit rows), while the columns that keep their names still come out.
func TestExcludedColumnNotLeakedByPosition(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	users := qualified(s, "users")
	mustExec(t, db, `CREATE TABLE `+users+` (id int PRIMARY KEY, a int, ssn text, v text)`)
	cfg := baseConfig(testenv.Unique("exclpos-"), url, auditSchemaFor(t, db), s+".users")
	cfg[KeyColumnExcludeList] = s + ".users.ssn"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	const n = singleChanges + 6 // single audit rows and a group
	mustExec(t, db, fmt.Sprintf(`INSERT INTO %s SELECT g, g, 'secret-' || g, 'v' || g FROM generate_series(1, %d) g`, users, n))
	mustExec(t, db, `ALTER TABLE `+users+` DROP COLUMN a`)

	recs := r.collectRecords(n)
	r.quiet()
	for _, rec := range recs {
		v := string(rec.Value)
		if strings.Contains(v, "secret-") {
			t.Fatalf("an excluded column's value leaked under a positional name: %s", v)
		}
		if !strings.Contains(v, `"after":{"id":`) || string(rec.Key) == "" {
			t.Fatalf("record %s (key %s) lost the column that kept its name, or its key", v, rec.Key)
		}
	}
}

// TestKeyAndExclusionOfPartitionedTable: message.key.columns and
// column.exclude.list of a partitioned table apply to the changes of its
// partitions (whose images have their own row types, one with its columns
// in another order), and to the initial snapshot's rows; a key column
// that is excluded stays in the key.
func TestKeyAndExclusionOfPartitionedTable(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	p := qualified(s, "p")
	mustExec(t, db, `CREATE TABLE `+p+` (id int, k int, v text, secret text) PARTITION BY RANGE (k)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+p+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p2")+` (secret text, v text, k int, id int)`)
	mustExec(t, db, `ALTER TABLE `+p+` ATTACH PARTITION `+qualified(s, "p2")+` FOR VALUES FROM (10) TO (20)`)
	mustExec(t, db, `INSERT INTO `+p+` VALUES (1, 1, 'a', 'S1'), (2, 12, 'b', 'S2')`)
	cfg := baseConfig(testenv.Unique("partkey-"), url, auditSchemaFor(t, db), s+".p")
	cfg[KeyMessageKeyColumns] = s + ".p:secret,id"
	cfg[KeyColumnExcludeList] = s + ".p.secret"
	cfg[KeySnapshotMode] = snapshotInitial
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+p+` VALUES (3, 3, 'c', 'S3'), (4, 14, 'd', NULL)`)
	mustExec(t, db, `DELETE FROM `+qualified(s, "p2")+` WHERE id = 2`)
	recs := r.collectRecords(5)
	r.quiet()
	want := map[string]string{
		`{"secret":"S1","id":1}`: `{"id":1,"k":1,"v":"a"}`,
		`{"secret":"S2","id":2}`: `{"id":2,"k":12,"v":"b"}`,
		`{"secret":"S3","id":3}`: `{"id":3,"k":3,"v":"c"}`,
		`{"secret":null,"id":4}`: `{"id":4,"k":14,"v":"d"}`,
	}
	for _, rec := range recs {
		v := string(rec.Value)
		img, ok := want[string(rec.Key)]
		if !ok {
			t.Fatalf("record %s has key %s, want one of %v", v, rec.Key, want)
		}
		var got struct{ After, Before map[string]any }
		if err := json.Unmarshal(rec.Value, &got); err != nil {
			t.Fatal(err)
		}
		image := got.After
		if image == nil {
			image = got.Before
		}
		var wantImg map[string]any
		_ = json.Unmarshal([]byte(img), &wantImg)
		if strings.Contains(v, `"secret"`) || !reflect.DeepEqual(image, wantImg) {
			t.Fatalf("record %s (key %s), want the image %s without secret", v, rec.Key, img)
		}
	}
}

// TestKeyColumnsTableWrittenAsInTables: a name with a quote inside, which
// tables takes literally unquoted (a"b), can be written the same way in
// message.key.columns ("each table one of tables and written as there"),
// as can a column so named; quoted names keep working.
func TestKeyColumnsTableWrittenAsInTables(t *testing.T) {
	for in, want := range map[string]map[tableName][]string{
		`s.a"b:id`:               {{"s", `a"b`}: {"id"}},
		`s.a"b:x"y;s.t:c`:        {{"s", `a"b`}: {`x"y`}, {"s", "t"}: {"c"}},
		`s."a""b":"x""y"`:        {{"s", `a"b`}: {`x"y`}},
		` "a;b" . "c:d" : "e,f"`: {{"a;b", "c:d"}: {"e,f"}},
		`s."q"";r":id`:           {{"s", `q";r`}: {"id"}},
	} {
		got, err := parseKeyColumns(in)
		if err != nil {
			t.Errorf("parseKeyColumns(%q): %v", in, err)
			continue
		}
		if !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("parseKeyColumns(%q) = %v, want %v", in, got, want)
		}
	}
	for _, in := range []string{`s.t:"open`, `s."open:id`} {
		if _, err := parseKeyColumns(in); err == nil || !strings.Contains(err.Error(), "unterminated") {
			t.Errorf("parseKeyColumns(%q) error = %v, want an unterminated quote", in, err)
		}
	}
}

// TestValidateNULInColumnNames: a column name holding a NUL byte is
// reported under its own key (the catalog query failed on it, and the
// error came under postgres.url).
func TestValidateNULInColumnNames(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int)`)
	for key, v := range map[string]string{
		KeyMessageKeyColumns: s + ".t:id\x00",
		KeyColumnExcludeList: s + ".t.id\x00",
	} {
		cfg := baseConfig(testenv.Unique("nul-"), url, auditSchemaFor(t, db), s+".t")
		cfg[key] = v
		errs := (&Connector{}).Validate(testCtx(t), cfg)
		if len(errs[KeyURL]) > 0 || !strings.Contains(strings.Join(errs[key], "; "), "NUL") {
			t.Errorf("Validate with %s=%q = %q, want the NUL byte reported under %s", key, v, errs, key)
		}
	}
}

// TestExclusionOfImageShorterThanTheTable: a change read column by column
// that has fewer columns than the table (columns added since) while an
// excluded column is not among the table's (renamed since) is delivered:
// leaving out the values named by position must stay within the image.
func TestExclusionOfImageShorterThanTheTable(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	tb := qualified(s, "t")
	mustExec(t, db, `CREATE TABLE `+tb+` (id int PRIMARY KEY, v int, ssn text)`)
	cfg := baseConfig(testenv.Unique("exclshort-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeyColumnExcludeList] = s + ".t.ssn"
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()

	mustExec(t, db, `INSERT INTO `+tb+` VALUES (1, 2, 'S')`)
	mustExec(t, db, `ALTER TABLE `+tb+` ADD COLUMN w int, ADD COLUMN x int`)
	mustExec(t, db, `ALTER TABLE `+tb+` ALTER COLUMN v TYPE bigint`)
	mustExec(t, db, `ALTER TABLE `+tb+` RENAME COLUMN ssn TO ssn2`)
	got := r.collectRecords(1)
	if v := string(got[0].Value); !strings.Contains(v, `"after":{"id":1,"v":2,"ssn2":"S"}`) {
		t.Fatalf("record %s, want every column under its current name (a renamed excluded column is not known)", v)
	}
}
