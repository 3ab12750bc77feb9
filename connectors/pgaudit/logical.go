package pgaudit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Ledger kinds of capture.method=logical (docs/decisions/0074). The slot
// goes first on deletion: it holds WAL back, the publication does not.
const (
	KindReplicationSlot = "postgres.replication_slot"
	KindPublication     = "postgres.publication"
)

// logicalNames are the publication's and the slot's names. Slot names
// allow only lower-case letters, digits and '_', which the base is made
// of; the base's hash keeps them apart for names that differ only in
// what sanitizing replaced or cut.
func logicalNames(connector string) (publication, slot string) {
	n := objectNames(connector)
	return "tidyconnect_" + n.base, "tidyconnect_" + n.base
}

func publicationRes(db, name string) connect.Resource {
	return connect.Resource{Kind: KindPublication, Name: name, Location: db}
}

func slotRes(db, name string) connect.Resource {
	return connect.Resource{Kind: KindReplicationSlot, Name: name, Location: db}
}

func isLogicalKind(kind string) bool { return kind == KindPublication || kind == KindReplicationSlot }

// checkLogical reports, by key, what keeps the server or the role from
// logical decoding. The connector's own slot (named slot), once it exists,
// counts as free: a restart or a reconfiguration needs no new one.
func checkLogical(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, slot string) (map[string][]string, error) {
	var walLevel, user, db string
	var replication, createDB bool
	var freeSlots int
	err := q.QueryRow(ctx, `
SELECT pg_catalog.current_setting('wal_level'), current_user::text, current_database()::text,
       coalesce((SELECT r.rolreplication OR r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user), false),
       has_database_privilege(current_database(), 'CREATE'),
       `+freeSlotsSQL, slot).
		Scan(&walLevel, &user, &db, &replication, &createDB, &freeSlots)
	if err != nil {
		return nil, fmt.Errorf("reading wal_level and the role's attributes: %w", err)
	}
	problems := map[string][]string{}
	if walLevel != "logical" {
		problems[KeyCaptureMethod] = append(problems[KeyCaptureMethod], fmt.Sprintf("the server runs with wal_level=%s, and logical decoding needs wal_level=logical: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL, or use %s=%s", walLevel, KeyCaptureMethod, methodTrigger))
	}
	if !replication {
		problems[KeyURL] = append(problems[KeyURL], fmt.Sprintf("role %q has neither REPLICATION nor SUPERUSER, which reading a replication slot needs: ALTER ROLE %s REPLICATION, or connect as another role", user, pgx.Identifier{user}.Sanitize()))
	}
	if !createDB {
		problems[KeyURL] = append(problems[KeyURL], fmt.Sprintf("role %q lacks CREATE on the database, which CREATE PUBLICATION needs: GRANT CREATE ON DATABASE %s TO %s", user, pgx.Identifier{db}.Sanitize(), pgx.Identifier{user}.Sanitize()))
	}
	if freeSlots < 1 {
		problems[KeyCaptureMethod] = append(problems[KeyCaptureMethod], "every replication slot the server allows is taken (max_replication_slots): raise it (restart) or drop an unused slot")
	}
	return problems, nil
}

// freeSlotsSQL counts the replication slots the server has room for, the
// connector's own ($1) counted as free: a restart or a reconfiguration
// needs no new one.
const freeSlotsSQL = `pg_catalog.current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_catalog.pg_replication_slots WHERE slot_name <> $1)::int`

// methodChange refuses a configuration whose capture method is not the one
// the connector's objects were made for.
func methodChange(ctx context.Context, s settings, l connect.Ledger) error {
	rs, err := ownedResources(ctx, l)
	if err != nil {
		return err
	}
	var other []connect.Resource
	for _, r := range rs {
		if isLogicalKind(r.Kind) != s.logical {
			other = append(other, r)
		}
	}
	if len(other) == 0 {
		return nil
	}
	was := methodTrigger
	if !s.logical {
		was = methodLogical
	}
	return fmt.Errorf("%s cannot change on an existing connector: it owns %s made for %s=%s; delete the connector (which drops them) and create it again", KeyCaptureMethod, describe(other), KeyCaptureMethod, was)
}

// checkMethodObjects reports, for validation, the objects in the database
// that this connector made for the other capture method: a PUT that
// changes capture.method answers 400 rather than storing a config whose
// Start fails (methodChange). Objects a deletion with
// cleanup.on.delete=false kept count too: they carry the name's marker.
func checkMethodObjects(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, s settings) (string, error) {
	n := objectNames(s.name)
	pub, slot := logicalNames(s.name)
	var found []string
	if err := q.QueryRow(ctx, `
SELECT coalesce(array_agg(o ORDER BY o), '{}') FROM (
  SELECT pg_catalog.format('function %I.%I()', ns.nspname, p.proname) AS o
  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
  WHERE $1 AND p.proname = ANY($2::text[]) AND pg_catalog.obj_description(p.oid, 'pg_proc') = $3::text
  UNION ALL
  SELECT pg_catalog.format('publication %I', pubname) FROM pg_catalog.pg_publication
  WHERE NOT $1 AND pubname = $4 AND pg_catalog.obj_description(oid, 'pg_publication') = $3::text
  UNION ALL
  -- slots are the server's: one of another database is another's
  SELECT pg_catalog.format('replication slot %s', slot_name) FROM pg_catalog.pg_replication_slots
  WHERE NOT $1 AND slot_name = $5 AND database = current_database()) AS x`,
		s.logical, []string{n.function, n.rowFunction}, n.marker, pub, slot).Scan(&found); err != nil {
		return "", fmt.Errorf("looking for the connector's objects: %w", err)
	}
	if len(found) == 0 {
		return "", nil
	}
	was, drop := methodLogical, fmt.Sprintf("SELECT pg_drop_replication_slot('%s'); DROP PUBLICATION %s", slot, pgx.Identifier{pub}.Sanitize())
	if s.logical {
		was, drop = methodTrigger, "DROP FUNCTION ... CASCADE for each function, which drops its triggers"
	}
	return fmt.Sprintf("cannot change on an existing connector: the database holds its %s, made for %s=%s (nothing was changed): set it back to %s, or delete the connector (which drops them) and create it again; objects kept by a deletion with %s=false must be dropped first (%s)",
		strings.Join(found, ", "), KeyCaptureMethod, was, was, KeyCleanupOnDelete, drop), nil
}

// provisionLogical creates (or adjusts) the connector's publication and
// creates its replication slot. The ledger lists each before it exists,
// so that a crash in between leaves nothing unowned.
func provisionLogical(ctx context.Context, conn *pgx.Conn, s settings, h *connect.Host) error {
	_, slotName := logicalNames(s.name)
	problems, err := checkLogical(ctx, conn, slotName)
	if err != nil {
		return err
	}
	tableProblems, _, err := checkTables(ctx, conn, s)
	if err != nil {
		return err
	}
	if len(tableProblems) > 0 {
		problems[KeyTables] = append(problems[KeyTables], tableProblems...)
	}
	if len(problems) == 0 {
		kp, err := checkKeyColumns(ctx, conn, s)
		if err != nil {
			return err
		}
		xp, err := checkExcludedColumns(ctx, conn, s)
		if err != nil {
			return err
		}
		if len(kp) > 0 {
			problems[KeyMessageKeyColumns] = kp
		}
		if len(xp) > 0 {
			problems[KeyColumnExcludeList] = xp
		}
		if len(kp) == 0 {
			rp, err := checkReplicaIdentity(ctx, conn, s)
			if err != nil {
				return err
			}
			for k, v := range rp {
				problems[k] = append(problems[k], v...)
			}
		}
	}
	if err := configError(problems); err != nil {
		return err
	}
	pub, slot := logicalNames(s.name)
	marker := objectNames(s.name).marker
	if err := checkSlotInUse(ctx, conn, slot, h); err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := takeLock(ctx, tx); err != nil {
		return err
	}
	var db string
	var exists bool
	var comment *string
	if err := tx.QueryRow(ctx, `
SELECT current_database()::text, p.oid IS NOT NULL, pg_catalog.obj_description(p.oid, 'pg_publication')
FROM (SELECT 1) AS one LEFT JOIN pg_catalog.pg_publication p ON p.pubname = $1`, pub).Scan(&db, &exists, &comment); err != nil {
		return fmt.Errorf("looking up publication %s: %w", pub, err)
	}
	if exists && !isMarked(comment, marker) {
		return fmt.Errorf("publication %s exists and is not this connector's (its comment is not %q): drop or rename it, or give the connector another name", pgx.Identifier{pub}.Sanitize(), marker)
	}
	if err := h.Ledger.Own(ctx, publicationRes(db, pub)); err != nil {
		return fmt.Errorf("recording publication %s in the resource ledger: %w", pub, err)
	}
	list := make([]string, len(s.tables))
	for i, t := range s.tables {
		list[i] = t.quoted()
	}
	qpub := pgx.Identifier{pub}.Sanitize()
	// Partitions' changes are published as their root's: the configured
	// table, whichever partition a row is in.
	const with = ` WITH (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)`
	script := `CREATE PUBLICATION ` + qpub + ` FOR TABLE ` + strings.Join(list, ", ") + with + `;
COMMENT ON PUBLICATION ` + qpub + ` IS ` + quoteLiteral(marker)
	if exists {
		script = `ALTER PUBLICATION ` + qpub + ` SET TABLE ` + strings.Join(list, ", ") + `;
ALTER PUBLICATION ` + qpub + ` SET (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)`
	}
	if _, err := tx.Exec(ctx, script); err != nil {
		return fmt.Errorf("provisioning publication %s: %w", pub, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("provisioning publication %s: %w", pub, err)
	}

	var plugin, slotDB *string
	var slotExists bool
	if err := conn.QueryRow(ctx, `
SELECT s.slot_name IS NOT NULL, s.plugin::text, s.database::text
FROM (SELECT 1) AS one LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = $1`, slot).Scan(&slotExists, &plugin, &slotDB); err != nil {
		return fmt.Errorf("looking up replication slot %s: %w", slot, err)
	}
	owned, err := ownedResources(ctx, h.Ledger)
	if err != nil {
		return err
	}
	if slotExists {
		// Not in the ledger, but the name's publication was there, marked:
		// both were kept by a deletion with cleanup.on.delete=false, and
		// are taken back as the trigger method takes back its marked
		// objects (a slot carries no comment of its own).
		kept := exists && isMarked(comment, marker)
		if !kept && !slices.ContainsFunc(owned, func(r connect.Resource) bool { return r.Kind == KindReplicationSlot && r.Name == slot }) {
			return fmt.Errorf("replication slot %s exists but this connector did not create it: drop it (SELECT pg_drop_replication_slot('%s')) or give the connector another name", slot, slot)
		}
		if plugin == nil || *plugin != "pgoutput" || slotDB == nil || *slotDB != db {
			return fmt.Errorf("replication slot %s is not a pgoutput slot of database %q: drop it (SELECT pg_drop_replication_slot('%s')) and restart the connector", slot, db, slot)
		}
		if err := h.Ledger.Own(ctx, slotRes(db, slot)); err != nil {
			return fmt.Errorf("recording replication slot %s in the resource ledger: %w", slot, err)
		}
		return nil
	}
	if err := h.Ledger.Own(ctx, slotRes(db, slot)); err != nil {
		return fmt.Errorf("recording replication slot %s in the resource ledger: %w", slot, err)
	}
	// The slot's consistent point waits for the transactions running now
	// to end, prepared ones too, which may never end by themselves: the
	// wait is bounded, and its error names what to end.
	// Read first: a timed-out creation leaves the connection unusable.
	var prepared []string
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(gid::text ORDER BY prepared), '{}') FROM pg_catalog.pg_prepared_xacts`).Scan(&prepared); err != nil {
		return fmt.Errorf("looking up prepared transactions: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, slotCreateWait)
	defer cancel()
	if _, err := conn.Exec(sctx, `SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		if sctx.Err() == nil || ctx.Err() != nil {
			return fmt.Errorf("creating replication slot %s: %w", slot, err)
		}
		if len(prepared) > 0 {
			return fmt.Errorf("creating replication slot %s: it waits for the transactions running when it started to end, prepared ones too, and %s passed with prepared transactions pending since before it: COMMIT PREPARED or ROLLBACK PREPARED %s (and end other long transactions: SELECT pid, xact_start, query FROM pg_stat_activity WHERE backend_xid IS NOT NULL), then restart the connector: %w", slot, slotCreateWait, strings.Join(quoteAll(prepared), ", "), err)
		}
		return fmt.Errorf("creating replication slot %s: it waits for the transactions running when it started to end, and %s passed: end the long ones (SELECT pid, xact_start, query FROM pg_stat_activity WHERE backend_xid IS NOT NULL) and restart the connector: %w", slot, slotCreateWait, err)
	}
	h.Logger.Info("created replication slot; it keeps WAL from being removed until the connector has delivered the changes, also while the connector is paused or stopped", "slot", slot, "publication", pub)
	return nil
}

// checkSlotInUse refuses a slot the ledger does not list that somebody
// streams: a deletion with cleanup.on.delete=false kept none such, so
// another connector of the name (another deployment's, with a ledger of
// its own) reads it. Taking it back would take that one's publication
// too, and this connector's deletion would end its stream and drop both.
// Refused before the publication is touched.
func checkSlotInUse(ctx context.Context, conn *pgx.Conn, slot string, h *connect.Host) error {
	owned, err := ownedResources(ctx, h.Ledger)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(owned, func(r connect.Resource) bool { return r.Kind == KindReplicationSlot && r.Name == slot }) {
		return nil
	}
	exists, pid, who, err := slotHolder(ctx, conn, slot)
	if err != nil || !exists || pid == 0 {
		return err
	}
	return fmt.Errorf("replication slot %s is in use by backend %d (application_name %q) and this connector did not create it: another connector of this name (of another deployment) streams it; delete that one, or give this connector another name (if a connector of this name was just deleted with %s=false, restart this one once its stream has ended)", slot, pid, who, KeyCleanupOnDelete)
}

// slotHolder looks a replication slot up: whether it exists, and the
// backend reading it (0: none) with its application_name ("unknown" when
// pg_stat_activity does not show it).
func slotHolder(ctx context.Context, conn *pgx.Conn, slot string) (exists bool, pid int32, app string, err error) {
	var activePID *int32
	var name *string
	err = conn.QueryRow(ctx, `
SELECT s.active_pid, a.application_name::text
FROM pg_catalog.pg_replication_slots s LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = s.active_pid
WHERE s.slot_name = $1`, slot).Scan(&activePID, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, "", nil
	}
	if err != nil {
		return false, 0, "", fmt.Errorf("looking up replication slot %s: %w", slot, err)
	}
	app = "unknown"
	if name != nil {
		app = *name
	}
	if activePID != nil {
		pid = *activePID
	}
	return true, pid, app, nil
}

// slotCreateWait bounds how long creating the slot waits for the
// transactions running when it starts (a variable for tests).
var slotCreateWait = 60 * time.Second

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = quoteLiteral(s)
	}
	return out
}

// slotReleaseWait bounds how long a deletion waits for the slot's last
// reader to go (a task's walsender ends shortly after its connection).
var slotReleaseWait = 10 * time.Second

// dropLogical drops the listed slot and publication: the slot whatever
// holds it, if that is one of this connector's connections, and the
// publication only while it carries the connector's marker.
func dropLogical(ctx context.Context, conn *pgx.Conn, s settings, h *connect.Host, rs []connect.Resource) error {
	marker := objectNames(s.name).marker
	prefix := ApplicationNamePrefix(s.name)
	slices.SortStableFunc(rs, func(a, b connect.Resource) int {
		return slices.Index(dropOrder, a.Kind) - slices.Index(dropOrder, b.Kind)
	})
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()::text`).Scan(&db); err != nil {
		return err
	}
	for _, r := range rs {
		if r.Location != db {
			return fmt.Errorf("%v lives in database %q but %s connects to %q: point %s at %q and delete again", r, r.Location, KeyURL, db, KeyURL, r.Location)
		}
		dropped := true
		switch r.Kind {
		case KindReplicationSlot:
			if err := dropSlot(ctx, conn, r.Name, prefix); err != nil {
				return err
			}
		case KindPublication:
			var comment *string
			err := conn.QueryRow(ctx, `SELECT pg_catalog.obj_description(p.oid, 'pg_publication') FROM pg_catalog.pg_publication p WHERE p.pubname = $1`, r.Name).Scan(&comment)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return fmt.Errorf("looking up publication %s: %w", r.Name, err)
			case !isMarked(comment, marker):
				h.Logger.Warn("publication no longer carries this connector's marker; leaving it", "publication", r.Name)
				dropped = false
			default:
				if _, err := conn.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{r.Name}.Sanitize()); err != nil {
					return fmt.Errorf("dropping publication %s: %w", r.Name, err)
				}
			}
		}
		if err := h.Ledger.Release(ctx, r); err != nil {
			return fmt.Errorf("releasing %v from the ledger: %w", r, err)
		}
		if dropped {
			h.Logger.Info("dropped", "resource", r.String())
		} else {
			h.Logger.Info("released without dropping", "resource", r.String())
		}
	}
	return nil
}

// dropSlot drops a replication slot. One held by a connection of this
// connector (a task instance the worker abandoned) is freed by ending that
// connection; one held by anybody else is waited for, up to
// slotReleaseWait.
func dropSlot(ctx context.Context, conn *pgx.Conn, slot, appPrefix string) error {
	deadline := time.Now().Add(slotReleaseWait)
	for {
		exists, pid, app, err := slotHolder(ctx, conn, slot)
		if err != nil {
			return err
		}
		if !exists {
			return nil // dropped by hand: nothing left
		}
		if pid == 0 {
			_, err := conn.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot(s.slot_name) FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = $1`, slot)
			var pgErr *pgconn.PgError
			if err == nil {
				return nil
			}
			if !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use: a reader came meanwhile
				return fmt.Errorf("dropping replication slot %s: %w", slot, err)
			}
		} else if strings.HasPrefix(app, appPrefix) {
			if _, err := conn.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend($1)`, pid); err != nil {
				return fmt.Errorf("ending this connector's connection %d that holds replication slot %s: %w", pid, slot, err)
			}
		} else if time.Now().After(deadline) {
			return fmt.Errorf("replication slot %s is in use by backend %d (application_name %q): stop that client (or SELECT pg_terminate_backend(%d)) and delete again", slot, pid, app, pid)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// tableOIDs are the relation OIDs of tables (0: none of that name).
func tableOIDs(ctx context.Context, conn *pgx.Conn, tables []tableName) ([]int64, error) {
	list := make([]string, len(tables))
	for i, t := range tables {
		list[i] = t.quoted()
	}
	var oids []int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(coalesce(pg_catalog.to_regclass(x.q)::oid::int8, 0) ORDER BY x.i), '{}')
FROM unnest($1::text[]) WITH ORDINALITY AS x(q, i)`, list).Scan(&oids); err != nil {
		return nil, fmt.Errorf("looking up the captured tables: %w", err)
	}
	return oids, nil
}

// logicalTaskConfig is the one task's configuration: logical decoding
// reads one slot, so one task reads every table. oids are the tables'
// relation OIDs at the connector's Start, in their order.
func logicalTaskConfig(s settings, oids []int64) connect.Config {
	tc := commonTaskConfig(s)
	tc[KeyCaptureMethod] = methodLogical
	if len(oids) == len(s.tables) {
		list := make([]string, len(oids))
		for i, o := range oids {
			list[i] = strconv.FormatInt(o, 10)
		}
		tc[keyTaskTableOIDs] = strings.Join(list, ",")
	}
	return tc
}

// checkReplicaIdentity reports, by key, the configured tables (or leaf
// partitions) whose replica identity does not fit logical decoding. A
// table in a publication that publishes updates and deletes without a
// replica identity (no primary key under REPLICA IDENTITY DEFAULT,
// NOTHING, or USING INDEX of an index dropped since) makes every writer's
// UPDATE and DELETE on it fail. And the old row of a delete (and of an
// update that changes the key) holds the replica identity's columns only:
// a record key of other columns (message.key.columns, or a primary key
// under REPLICA IDENTITY USING INDEX of another index) would be lost.
//
// A partitioned table's changes are published as its own
// (publish_via_partition_root): a leaf's old row, logged by the leaf's
// replica identity, is sent as the partitioned table's, whole if that one
// is REPLICA IDENTITY FULL, else as its identity's columns. So the
// partitioned table needs an identity of its own (else the old rows come
// without columns), a leaf under a FULL one must be FULL too (else the
// columns it does not log would come as nulls), and a leaf under one with
// key columns must log them.
func checkReplicaIdentity(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, s settings) (map[string][]string, error) {
	list := make([]string, len(s.tables))
	for i, t := range s.tables {
		list[i] = t.quoted()
	}
	rows, err := q.Query(ctx, `
SELECT x.i, l.oid = c.oid, l.relkind::text, pg_catalog.format('%I.%I', ns.nspname, l.relname), l.relreplident::text,
       CASE l.relreplident
         WHEN 'f' THEN NULL
         -- an index's key columns: PostgreSQL logs no INCLUDE column of
         -- an old row
         ELSE (SELECT array_agg(a.attname::text) FROM pg_catalog.pg_index ix
               JOIN pg_catalog.pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = ANY ((ix.indkey::int2[])[0:ix.indnkeyatts - 1])
               WHERE ix.indrelid = l.oid AND CASE l.relreplident WHEN 'd' THEN ix.indisprimary WHEN 'i' THEN ix.indisreplident ELSE false END)
       END,
       -- the primary key's key columns, the record key (loadMeta)
       coalesce((SELECT array_agg(a.attname::text) FROM pg_catalog.pg_index ix
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = ANY ((ix.indkey::int2[])[0:ix.indnkeyatts - 1])
                 WHERE ix.indrelid = c.oid AND ix.indisprimary), '{}')
FROM unnest($1::text[]) WITH ORDINALITY AS x(q, i)
JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(x.q)
-- a plain table is not in its own partition tree
CROSS JOIN LATERAL (SELECT c.oid AS relid, 0 AS level
                    UNION SELECT t.relid, t.level FROM pg_catalog.pg_partition_tree(c.oid) AS t) AS p
JOIN pg_catalog.pg_class l ON l.oid = p.relid AND (l.relkind = 'r' OR l.oid = c.oid AND l.relkind = 'p')
JOIN pg_catalog.pg_namespace ns ON ns.oid = l.relnamespace
ORDER BY x.i, p.level, l.relname`, list)
	if err != nil {
		return nil, fmt.Errorf("reading the captured tables' replica identities: %w", err)
	}
	defer rows.Close()
	problems := map[string][]string{}
	add := func(key, format string, args ...any) {
		problems[key] = append(problems[key], fmt.Sprintf(format, args...))
	}
	// Of the configured partitioned table whose leaves come next.
	var rootFull bool
	var rootIdentity []string
	for rows.Next() {
		var (
			i                   int64
			self                bool
			kind, name, replica string
			identity            []string // nil: every column (FULL), or none
			pk                  []string
		)
		if err := rows.Scan(&i, &self, &kind, &name, &replica, &identity, &pk); err != nil {
			return nil, err
		}
		tb := s.tables[i-1]
		full := replica == "f"
		if !self {
			of := fmt.Sprintf("partition %s of %s", name, tb.quoted())
			switch {
			case !full && len(identity) == 0:
				add(KeyTables, "%s has no replica identity (no primary key, REPLICA IDENTITY NOTHING, or the identity's index is gone): in the connector's publication every UPDATE and DELETE on it would fail (\"cannot update table ... because it does not have a replica identity and publishes updates\"): ALTER TABLE %s REPLICA IDENTITY FULL, or give it a primary key", of, name)
			case rootFull && !full:
				add(KeyTables, "%s is not REPLICA IDENTITY FULL while %s is: its changes are published as that table's, whose old rows are whole, but the partition logs only its key columns of them, so the others would come as nulls: ALTER TABLE %s REPLICA IDENTITY FULL", of, tb.quoted(), name)
			case !rootFull && !full:
				if missing := notIn(rootIdentity, identity); len(missing) > 0 {
					add(KeyTables, "%s has a replica identity without column(s) %s of the replica identity of %s, whose old rows its changes are published as: they would come as nulls: ALTER TABLE %s REPLICA IDENTITY FULL", of, strings.Join(missing, ", "), tb.quoted(), name)
				}
			}
			continue
		}
		if kind == "p" {
			rootFull, rootIdentity = full, identity
			if !full && len(identity) == 0 {
				add(KeyTables, "partitioned table %s has no replica identity of its own (no primary key, or REPLICA IDENTITY NOTHING): its partitions' changes are published as its own, so the old row of every UPDATE and DELETE would come without columns: ALTER TABLE %s REPLICA IDENTITY FULL, and the same for each partition", tb.quoted(), name)
				continue
			}
		} else if !full && len(identity) == 0 {
			add(KeyTables, "%s has no replica identity (no primary key, REPLICA IDENTITY NOTHING, or the identity's index is gone): in the connector's publication every UPDATE and DELETE on it would fail (\"cannot update table ... because it does not have a replica identity and publishes updates\"): ALTER TABLE %s REPLICA IDENTITY FULL, or give it a primary key", tb.quoted(), name)
			continue
		}
		if full {
			continue
		}
		key, custom := s.keyColumns[tb]
		if !custom {
			key = pk
		}
		missing := notIn(key, identity)
		if len(missing) == 0 {
			continue
		}
		k, what := KeyTables, "its primary key's"
		if custom {
			k, what = KeyMessageKeyColumns, "the "+KeyMessageKeyColumns
		}
		add(k, "%s has a replica identity without %s column(s) %s: a DELETE's old row (and that of an UPDATE changing the key) holds only the replica identity's columns, so its record would have no key: ALTER TABLE %s REPLICA IDENTITY FULL", tb.quoted(), what, strings.Join(missing, ", "), name)
	}
	return problems, rows.Err()
}

// notIn are the columns of want not in have, quoted.
func notIn(want, have []string) []string {
	var missing []string
	for _, c := range want {
		if !slices.Contains(have, c) {
			missing = append(missing, fmt.Sprintf("%q", c))
		}
	}
	return missing
}
