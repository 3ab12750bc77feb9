package pgaudit

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestBadConfig: every bad configuration is reported by Validate on the
// key at fault, Start fails naming it, and nothing is provisioned.
func TestBadConfig(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "ok")+` (id int)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "secret")+` (id int)`)
	mustExec(t, db, `CREATE VIEW `+qualified(s, "v")+` AS SELECT 1 AS x`)
	// aclitem has no binary send function; nor, through its element type,
	// has aclitem[].
	mustExec(t, db, `CREATE TABLE `+qualified(s, "acl")+` (id int, grants aclitem[])`)
	// Nor has a range or multirange over a type without one.
	nosend := noBinaryIOType(t, db, s)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "rng")+` (id int, r `+nosend+`range)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "mrng")+` (id int, r `+nosend+`multirange)`)
	// A partitioned table and one of its partitions are both capturable,
	// but not together; inheritance is not capturable at all.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "parted")+` (id int) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "part1")+` PARTITION OF `+qualified(s, "parted")+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "rparted")+` (id int) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "rpart1")+` PARTITION OF `+qualified(s, "rparted")+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "base")+` (id int)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "kid")+` () INHERITS (`+qualified(s, "base")+`)`)
	// A login role (trust auth, no password) that may not read "secret".
	role, _ := newRole(t, db, "pga_role_")
	mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+pgx.Identifier{role}.Sanitize())
	mustExec(t, db, `ALTER TABLE `+qualified(s, "ok")+` OWNER TO `+pgx.Identifier{role}.Sanitize())
	// Privileges are not enough: dropping and commenting on triggers needs
	// the owner's rights.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "notmine")+` (id int)`)
	mustExec(t, db, `GRANT SELECT, TRIGGER ON `+qualified(s, "notmine")+` TO `+pgx.Identifier{role}.Sanitize())
	mustExec(t, db, `GRANT TRIGGER ON `+qualified(s, "secret")+` TO `+pgx.Identifier{role}.Sanitize())
	// The partitioned table is the role's, its partition not.
	mustExec(t, db, `ALTER TABLE `+qualified(s, "rparted")+` OWNER TO `+pgx.Identifier{role}.Sanitize())
	roleURL := urlAs(t, url, role)
	// Another connector's audit and wake-up tables: capturing them would
	// capture the connectors' own writes.
	mustExec(t, db, `CREATE TABLE `+qualified(s, "other")+` (id int)`)
	otherAudit := auditSchemaFor(t, db)
	other := startConnector(t, baseConfig(testenv.Unique("other-"), url, otherAudit, s+".other"), connect.NewMemoryLedger())
	t.Cleanup(func() { _ = other.stop(true) })
	otherNames := objectNames(other.name)

	tests := []struct {
		name    string
		url     string
		tables  string
		key     string
		mention string
		// audit replaces the test's fresh audit schema name when set.
		audit string
	}{
		{"missing table", url, s + ".ok," + s + ".nope", KeyTables, `"nope" does not exist`, ""},
		{"not a table", url, s + ".v", KeyTables, "is not a table", ""},
		{"column type without binary I/O", url, s + ".ok," + s + ".acl", KeyTables, `column "grants" of table "` + s + `"."acl" uses type aclitem, which has no binary send/receive`, ""},
		{"range over a type without binary I/O", url, s + ".rng", KeyTables, `column "r" of table "` + s + `"."rng" uses type ` + s + `.nosend, which has no binary send/receive`, ""},
		{"multirange over a type without binary I/O", url, s + ".mrng", KeyTables, `column "r" of table "` + s + `"."mrng" uses type ` + s + `.nosend, which has no binary send/receive`, ""},
		{"no SELECT permission", roleURL, s + ".secret", KeyTables, "no SELECT privilege", ""},
		{"not the owner", roleURL, s + ".notmine", KeyTables, `role "` + role + `" does not own table "` + s + `"."notmine"`, ""},
		{"no TRIGGER permission on a partition", roleURL, s + ".rparted", KeyTables, `no TRIGGER privilege on "` + s + `"."rpart1", a partition of "` + s + `"."rparted"`, ""},
		{"unreachable URL", "postgres://postgres:hunter2@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", s + ".ok", KeyURL, "127.0.0.1:1", ""},
		{"malformed tables", url, s + ".ok,,a.b.c", KeyTables, "malformed", ""},
		{"unterminated quote", url, `"` + s + `.ok`, KeyTables, "unterminated", ""},
		{"bad topic prefix", url, s + ".ok", KeyTopicPrefix, "a-z", ""},
		{"partition and its partitioned table", url, s + ".parted," + s + ".part1", KeyTables, `table "` + s + `"."part1" is a partition of "` + s + `"."parted", which is also in tables`, ""},
		{"partitioned table and its partition", url, s + ".part1," + s + ".parted", KeyTables, `table "` + s + `"."part1" is a partition of "` + s + `"."parted", which is also in tables`, ""},
		{"inheritance parent", url, s + ".base", KeyTables, `table "` + s + `"."base" has inheritance child tables`, ""},
		{"inheritance child", url, s + ".kid", KeyTables, `table "` + s + `"."kid" is an inheritance child of`, ""},
		{"another connector's audit table", url, s + ".ok," + otherAudit + "." + otherNames.table, KeyTables, `belongs to tidyconnect connector "` + other.name + `"`, ""},
		{"another connector's wake-up table", url, otherAudit + "." + otherNames.wakeup, KeyTables, `belongs to tidyconnect connector "` + other.name + `"`, ""},
		{"system catalog", url, "pg_catalog.pg_am", KeyTables, "pg_catalog is a PostgreSQL system schema", ""},
		{"NUL byte in a table name", url, s + ".o\x00k", KeyTables, "NUL byte", ""},
		{"reserved audit schema", url, s + ".ok", KeyAuditSchema, "reserved for PostgreSQL's system schemas", "pg_" + testenv.Unique("a")},
		{"audit schema with spaces", url, s + ".ok", KeyAuditSchema, "leading or trailing spaces", " " + testenv.Unique("a") + " "},
		{"NUL byte in the audit schema", url, s + ".ok", KeyAuditSchema, "NUL byte", "a\x00b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			audit := auditSchemaFor(t, db)
			if tt.audit != "" {
				audit = tt.audit
			}
			cfg := baseConfig(testenv.Unique("bad-"), tt.url, audit, tt.tables)
			if tt.key == KeyTopicPrefix {
				cfg[KeyTopicPrefix] = "no spaces/allowed"
			}
			ctx := testCtx(t)
			errs := (&Connector{}).Validate(ctx, cfg)
			msgs := strings.Join(errs[tt.key], " | ")
			if !strings.Contains(msgs, tt.mention) {
				t.Errorf("Validate()[%s] = %q, want a message containing %q (all: %v)", tt.key, msgs, tt.mention, errs)
			}
			if strings.Contains(msgs, "hunter2") {
				t.Errorf("Validate leaks the password: %s", msgs)
			}
			l := connect.NewMemoryLedger()
			_, err := tryStart(t, cfg, l)
			if err == nil {
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tt.mention) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Start error %q does not name %q (or leaks the password)", err, tt.mention)
			}
			if rs, _ := l.List(ctx); len(rs) != 0 {
				t.Errorf("ledger lists %v after a rejected config", rs)
			}
			var exists bool
			if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, strings.ReplaceAll(audit, "\x00", "")).Scan(&exists); err != nil {
				t.Fatal(err)
			}
			if exists {
				t.Error("the audit schema was provisioned for a rejected config")
			}
			if n := triggerCount(t, db, s, "ok"); n != 0 {
				t.Errorf("%d triggers installed for a rejected config", n)
			}
		})
	}

	// A connector reconfigured to capture its own audit table as well.
	t.Run("own audit table", func(t *testing.T) {
		cfg := other.cfg.Clone()
		cfg[KeyTables] += "," + otherAudit + "." + otherNames.table
		errs := (&Connector{}).Validate(testCtx(t), cfg)
		if msgs := strings.Join(errs[KeyTables], " | "); !strings.Contains(msgs, `belongs to tidyconnect connector "`+other.name+`"`) {
			t.Errorf("Validate()[%s] = %q (all: %v)", KeyTables, msgs, errs)
		}
	})

	// The role may create in s (not a new schema) and owns "ok": that is
	// enough to capture it, and to delete the connector.
	t.Run("valid", func(t *testing.T) {
		cfg := baseConfig(testenv.Unique("good-"), roleURL, s, s+".ok")
		if errs := (&Connector{}).Validate(testCtx(t), cfg); len(errs) != 0 {
			t.Fatalf("Validate of a good config: %v", errs)
		}
		r := startConnector(t, cfg, connect.NewMemoryLedger())
		mustExec(t, db, `INSERT INTO `+qualified(s, "ok")+` VALUES (1)`)
		if got := r.collect(1, true); got[0].Op != "c" {
			t.Errorf("captured %+v", got[0])
		}
		if err := r.stop(true); err != nil {
			t.Fatal(err)
		}
		if n := triggerCount(t, db, s, "ok"); n != 0 {
			t.Errorf("%d triggers left after the deletion", n)
		}
	})
}

// TestPartitionTriggerPrivilegeOnlyWhenMade: TRIGGER on a partition is
// needed only while the partitioned table's row trigger is still to be
// made (PostgreSQL copies it onto the partitions then): not for a restart,
// but again after a rename, when the trigger is made anew.
func TestPartitionTriggerPrivilegeOnlyWhenMade(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	role, rid := newRole(t, db, "pga_owner_")
	mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+rid)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p")+` (id int PRIMARY KEY) PARTITION BY RANGE (id)`)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "p1")+` PARTITION OF `+qualified(s, "p")+` FOR VALUES FROM (0) TO (10)`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p")+` OWNER TO `+rid)
	mustExec(t, db, `GRANT TRIGGER ON `+qualified(s, "p1")+` TO `+rid)
	roleURL := urlAs(t, url, role)
	name := testenv.Unique("privs-")
	l := connect.NewMemoryLedger()
	if err := startConnector(t, baseConfig(name, roleURL, s, s+".p"), l).stop(false); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `REVOKE TRIGGER ON `+qualified(s, "p1")+` FROM `+rid)
	if errs := (&Connector{}).Validate(testCtx(t), baseConfig(name, roleURL, s, s+".p")); len(errs) != 0 {
		t.Errorf("Validate of a restart that makes nothing: %v", errs)
	}
	if err := startConnector(t, baseConfig(name, roleURL, s, s+".p"), l).stop(false); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `ALTER TABLE `+qualified(s, "p")+` RENAME TO q`)
	errs := (&Connector{}).Validate(testCtx(t), baseConfig(name, roleURL, s, s+".q"))
	if want := `no TRIGGER privilege on "` + s + `"."p1", a partition of "` + s + `"."q"`; !strings.Contains(strings.Join(errs[KeyTables], " | "), want) {
		t.Errorf("Validate after the rename: %v, want %q", errs, want)
	}
	mustExec(t, db, `GRANT TRIGGER ON `+qualified(s, "p1")+` TO `+rid)
	if err := startConnector(t, baseConfig(name, roleURL, s, s+".q"), l).stop(true); err != nil {
		t.Fatal(err)
	}
}

// TestStrayTriggerTheRoleCannotDrop: a table that is no longer configured
// but carries the connector's capture trigger, handed to another owner:
// Start says which trigger to drop and how, instead of failing on
// PostgreSQL's ownership error at every attempt.
func TestStrayTriggerTheRoleCannotDrop(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	connRole, conn := newRole(t, db, "pga_conn_")
	_, otherRole := newRole(t, db, "pga_other_")
	mustExec(t, db, `GRANT USAGE, CREATE ON SCHEMA `+pgx.Identifier{s}.Sanitize()+` TO `+conn)
	for _, tb := range []string{"a", "b"} {
		mustExec(t, db, `CREATE TABLE `+qualified(s, tb)+` (id int PRIMARY KEY)`)
		mustExec(t, db, `ALTER TABLE `+qualified(s, tb)+` OWNER TO `+conn)
	}
	roleURL := urlAs(t, url, connRole)
	name := testenv.Unique("stray-")
	l := connect.NewMemoryLedger()
	if err := startConnector(t, baseConfig(name, roleURL, s, s+".a", s+".b"), l).stop(false); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `ALTER TABLE `+qualified(s, "b")+` RENAME TO b2`)
	mustExec(t, db, `ALTER TABLE `+qualified(s, "b2")+` OWNER TO `+otherRole)
	_, err := tryStart(t, baseConfig(name, roleURL, s, s+".a"), l)
	if err == nil || !strings.Contains(err.Error(), `table "`+s+`"."b2" is not configured but carries the connector's capture trigger`) || !strings.Contains(err.Error(), "DROP TRIGGER") {
		t.Fatalf("Start with a stray trigger the role cannot drop: %v", err)
	}
	mustExec(t, db, `DROP TRIGGER `+pgx.Identifier{objectNames(name).trigger("INSERT")}.Sanitize()+` ON `+qualified(s, "b2"))
	mustExec(t, db, `DROP TRIGGER `+pgx.Identifier{objectNames(name).trigger("UPDATE")}.Sanitize()+` ON `+qualified(s, "b2"))
	mustExec(t, db, `DROP TRIGGER `+pgx.Identifier{objectNames(name).trigger("DELETE")}.Sanitize()+` ON `+qualified(s, "b2"))
	mustExec(t, db, `DROP TRIGGER `+pgx.Identifier{objectNames(name).trigger("TRUNCATE")}.Sanitize()+` ON `+qualified(s, "b2"))
	if err := startConnector(t, baseConfig(name, roleURL, s, s+".a"), l).stop(true); err != nil {
		t.Fatal(err)
	}
}

// noBinaryIOType creates, in schema s, a base type without binary send and
// receive functions that ranges can be made of (int4's text I/O and btree
// support under other names: no core type is both), and returns its
// qualified name; <name>range and <name>multirange are its range types.
func noBinaryIOType(t *testing.T, db *pgxpool.Pool, s string) string {
	t.Helper()
	q := pgx.Identifier{s}.Sanitize()
	ty := q + ".nosend"
	mustExec(t, db, `CREATE TYPE `+ty)
	mustExec(t, db, `CREATE FUNCTION `+q+`.nosend_in(cstring) RETURNS `+ty+` LANGUAGE internal IMMUTABLE STRICT AS 'int4in'`)
	mustExec(t, db, `CREATE FUNCTION `+q+`.nosend_out(`+ty+`) RETURNS cstring LANGUAGE internal IMMUTABLE STRICT AS 'int4out'`)
	mustExec(t, db, `CREATE TYPE `+ty+` (INPUT = `+q+`.nosend_in, OUTPUT = `+q+`.nosend_out, LIKE = int4)`)
	ops := []struct{ op, fn string }{{"<", "int4lt"}, {"<=", "int4le"}, {"=", "int4eq"}, {">=", "int4ge"}, {">", "int4gt"}}
	for i, o := range ops {
		fn := fmt.Sprintf("%s.nosend_op%d", q, i)
		mustExec(t, db, `CREATE FUNCTION `+fn+`(`+ty+`, `+ty+`) RETURNS bool LANGUAGE internal IMMUTABLE STRICT AS '`+o.fn+`'`)
		mustExec(t, db, `CREATE OPERATOR `+q+`.`+o.op+` (LEFTARG = `+ty+`, RIGHTARG = `+ty+`, FUNCTION = `+fn+`)`)
	}
	mustExec(t, db, `CREATE FUNCTION `+q+`.nosend_cmp(`+ty+`, `+ty+`) RETURNS int LANGUAGE internal IMMUTABLE STRICT AS 'btint4cmp'`)
	mustExec(t, db, `CREATE OPERATOR CLASS `+q+`.nosend_ops DEFAULT FOR TYPE `+ty+` USING btree AS
  OPERATOR 1 `+q+`.<, OPERATOR 2 `+q+`.<=, OPERATOR 3 `+q+`.=, OPERATOR 4 `+q+`.>=, OPERATOR 5 `+q+`.>,
  FUNCTION 1 `+q+`.nosend_cmp(`+ty+`, `+ty+`)`)
	mustExec(t, db, `CREATE TYPE `+ty+`range AS RANGE (SUBTYPE = `+ty+`)`)
	return ty
}
