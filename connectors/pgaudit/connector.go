package pgaudit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Resource kinds in the ledger, dropped in this order on deletion.
const (
	KindTrigger  = "postgres.trigger"
	KindFunction = "postgres.function"
	KindTable    = "postgres.table"
	KindSequence = "postgres.sequence"
	KindSchema   = "postgres.schema"
)

var dropOrder = []string{KindReplicationSlot, KindPublication, KindTrigger, KindFunction, KindSequence, KindTable, KindSchema}

// Connector provisions and drops the shared objects and splits the tables
// over tasks. It holds no connection while running.
type Connector struct {
	mu      sync.Mutex
	host    *connect.Host
	s       settings
	deleted bool
	// oids are the configured tables' relation OIDs under
	// capture.method=logical, read when the connector started.
	oids []int64
}

var (
	_ connect.Connector = (*Connector)(nil)
	_ connect.Validator = (*Connector)(nil)
)

// Spec describes pgaudit.
func (c *Connector) Spec() connect.Spec {
	return connect.Spec{
		Type:    connect.TypeSource,
		Version: versionString(),
		Doc:     "Captures row changes of PostgreSQL tables with audit triggers and streams them to Kafka; drops what it created only when deleted.",
		Config:  ConfigDef(),
	}
}

func connectorName(h *connect.Host, cfg connect.Config) string {
	if h.Connector != "" {
		return h.Connector
	}
	return cfg["name"]
}

// Start checks the configuration and the tables, then provisions. With
// Host.CleanupOnly it only remembers the configuration for Stopped.
func (c *Connector) Start(ctx context.Context, cfg connect.Config) error {
	h := connect.HostFrom(ctx)
	s, errs := parseSettings(connectorName(h, cfg), cfg)
	c.mu.Lock()
	c.host, c.s = h, s
	c.mu.Unlock()
	if h.CleanupOnly {
		if s.url == "" {
			return fmt.Errorf("cannot finish the deletion of connector %q: %s is missing", s.name, KeyURL)
		}
		return nil
	}
	if err := configError(errs); err != nil {
		return err
	}
	if err := methodChange(ctx, s, h.Ledger); err != nil {
		return err
	}
	conn, err := connectDB(ctx, s.url, ApplicationName(s.name, "connector"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if s.logical {
		if err := checkServerVersion(ctx, conn); err != nil {
			return err
		}
		if err := provisionLogical(ctx, conn, s, h); err != nil {
			return err
		}
		oids, err := tableOIDs(ctx, conn, s.tables)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.oids = oids
		c.mu.Unlock()
		return nil
	}
	if err := provision(ctx, conn, s, h); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_timeout; provision rolled back
			relations := []string{pgx.Identifier{s.auditSchema, objectNames(s.name).table}.Sanitize()}
			for _, t := range s.tables {
				relations = append(relations, t.quoted())
			}
			return fmt.Errorf("%w%s", err, lockAdvice(ctx, conn, relations, "", "restart the connector"))
		}
		return err
	}
	warnTwoPhaseCommit(ctx, conn, s, h)
	return nil
}

// warnTwoPhaseCommit warns when the server allows prepared transactions
// while tasks wake up by NOTIFY: a writer's PREPARE TRANSACTION fails
// after a captured change sent one (docs/decisions/0072).
func warnTwoPhaseCommit(ctx context.Context, conn *pgx.Conn, s settings, h *connect.Host) {
	if !s.notify {
		return
	}
	var prepared int
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.current_setting('max_prepared_transactions')::pg_catalog.int4`).Scan(&prepared); err != nil || prepared == 0 {
		return
	}
	h.Logger.Warn("the server allows prepared transactions (max_prepared_transactions > 0): a writer that changes a captured table and then runs PREPARE TRANSACTION fails while a task waits for a NOTIFY; set "+KeyWakeupNotify+"=false if writers use two-phase commit",
		"max_prepared_transactions", prepared)
}

// TaskConfigs spreads the tables round-robin over at most maxTasks tasks.
func (c *Connector) TaskConfigs(maxTasks int) ([]connect.Config, error) {
	c.mu.Lock()
	s, oids := c.s, c.oids
	c.mu.Unlock()
	if maxTasks < 1 {
		maxTasks = 1
	}
	if s.tasksMax > 0 && s.tasksMax < maxTasks {
		maxTasks = s.tasksMax
	}
	if s.logical {
		return []connect.Config{logicalTaskConfig(s, oids)}, nil
	}
	n := min(maxTasks, len(s.tables))
	groups := make([][]tableName, n)
	for i, t := range s.tables {
		groups[i%n] = append(groups[i%n], t)
	}
	out := make([]connect.Config, n)
	for i, g := range groups {
		tc := commonTaskConfig(s)
		tc[KeyAuditSchema] = s.auditSchema
		tc[keyTaskTables] = formatTables(g)
		tc[keyTaskCount] = fmt.Sprint(n)
		if !s.notify {
			tc[KeyWakeupNotify] = "false"
		}
		if s.incremental {
			tc[KeySnapshotMode] = snapshotIncremental
		}
		out[i] = tc
	}
	return out, nil
}

// commonTaskConfig is what every task's configuration holds, whatever the
// capture method.
func commonTaskConfig(s settings) connect.Config {
	tc := connect.Config{
		"name":             s.name,
		KeyURL:             s.url,
		KeyTopicPrefix:     s.topicPrefix,
		KeyPollMaxRecords:  fmt.Sprint(s.pollMax),
		KeyPollIntervalMS:  fmt.Sprint(s.pollInterval),
		KeyTables:          formatTables(s.tables),
		KeyCleanupOnDelete: fmt.Sprint(s.cleanup),
	}
	if s.tombstones {
		tc[KeyTombstonesOnDelete] = "true"
	}
	if len(s.keyColumns) > 0 {
		tc[KeyMessageKeyColumns] = s.keyColumnsRaw
	}
	if len(s.excluded) > 0 {
		tc[KeyColumnExcludeList] = s.excludedRaw
	}
	return tc
}

// Stop records whether this is a deletion; the connector has nothing to
// interrupt.
func (c *Connector) Stop(connectorDeleted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if connectorDeleted {
		c.deleted = true
	}
}

// Stopped drops what the ledger lists when the connector was deleted with
// cleanup.on.delete (the default).
func (c *Connector) Stopped(ctx context.Context) error {
	c.mu.Lock()
	h, s, deleted := c.host, c.s, c.deleted
	c.mu.Unlock()
	if !deleted {
		return nil
	}
	if h == nil {
		h = connect.HostFrom(ctx)
	}
	rs, err := ownedResources(ctx, h.Ledger)
	if err != nil {
		return err
	}
	if len(rs) == 0 {
		return nil
	}
	if !s.cleanup {
		// The objects are handed over to the database's users: nobody owns
		// them any more, so they leave the ledger.
		for _, r := range rs {
			if r.Kind == KindReplicationSlot {
				h.Logger.Warn("cleanup.on.delete=false: keeping the replication slot, which keeps every WAL segment from now on until it is dropped: SELECT pg_drop_replication_slot('"+r.Name+"') once nobody reads it", "resource", r.String())
			} else {
				h.Logger.Info("cleanup.on.delete=false: keeping object", "resource", r.String())
			}
			if err := h.Ledger.Release(ctx, r); err != nil {
				return fmt.Errorf("releasing %v from the ledger: %w", r, err)
			}
		}
		return nil
	}
	if s.url == "" {
		return fmt.Errorf("cannot drop %s: %s is missing; set it and delete again", describe(rs), KeyURL)
	}
	conn, err := connectDB(ctx, s.url, ApplicationName(s.name, "connector"))
	if err != nil {
		return fmt.Errorf("deletion incomplete, still owned: %s: %w", describe(rs), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var logical []connect.Resource
	rs = slices.DeleteFunc(rs, func(r connect.Resource) bool {
		if isLogicalKind(r.Kind) {
			logical = append(logical, r)
			return true
		}
		return false
	})
	if len(logical) > 0 {
		if err := dropLogical(ctx, conn, s, h, logical); err != nil {
			left, _ := ownedResources(context.WithoutCancel(ctx), h.Ledger)
			return fmt.Errorf("deletion incomplete, still owned: %s: %w", describe(left), err)
		}
	}
	if len(rs) == 0 {
		return nil
	}
	if err := dropOwned(ctx, conn, s.name, h, rs); err != nil {
		left, _ := ownedResources(context.WithoutCancel(ctx), h.Ledger)
		return fmt.Errorf("deletion incomplete, still owned: %s: %w", describe(left), err)
	}
	return nil
}

func ownedResources(ctx context.Context, l connect.Ledger) ([]connect.Resource, error) {
	all, err := l.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the resource ledger: %w", err)
	}
	return slices.DeleteFunc(all, func(r connect.Resource) bool { return !slices.Contains(dropOrder, r.Kind) }), nil
}

func describe(rs []connect.Resource) string {
	if len(rs) == 0 {
		return "nothing"
	}
	const show = 8
	parts := make([]string, 0, show+1)
	for i, r := range rs {
		if i == show {
			parts = append(parts, fmt.Sprintf("and %d more", len(rs)-show))
			break
		}
		parts = append(parts, r.String())
	}
	return fmt.Sprintf("%d object(s): %s", len(rs), strings.Join(parts, ", "))
}

// Resources of one connector.
func schemaRes(db, schema string) connect.Resource {
	return connect.Resource{Kind: KindSchema, Name: schema, Location: db}
}

func tableRes(db, schema, table string) connect.Resource {
	return connect.Resource{Kind: KindTable, Name: table, Location: db + "/" + pgx.Identifier{schema}.Sanitize()}
}

func sequenceRes(db, schema, sequence string) connect.Resource {
	return connect.Resource{Kind: KindSequence, Name: sequence, Location: db + "/" + pgx.Identifier{schema}.Sanitize()}
}

func functionRes(db, schema, function string) connect.Resource {
	return connect.Resource{Kind: KindFunction, Name: function + "()", Location: db + "/" + pgx.Identifier{schema}.Sanitize()}
}

func triggerRes(db string, t tableName, trigger string) connect.Resource {
	return connect.Resource{Kind: KindTrigger, Name: trigger, Location: db + "/" + t.quoted()}
}

// checkKeyColumns reports each message.key.columns column that its table
// lacks (the tables themselves were checked).
func checkKeyColumns(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, s settings) (problems []string, err error) {
	for _, t := range sortedTables(s.keyColumns) {
		missing, err := missingColumns(ctx, q, t, s.keyColumns[t])
		if err != nil {
			return nil, fmt.Errorf("checking %s: %w", KeyMessageKeyColumns, err)
		}
		for _, c := range missing {
			problems = append(problems, fmt.Sprintf("table %s has no column %q: name one of its columns", t.quoted(), c))
		}
	}
	return problems, nil
}

// checkExcludedColumns reports each column.exclude.list column that its
// table lacks (a typo would leave the column in the records).
func checkExcludedColumns(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, s settings) (problems []string, err error) {
	for _, t := range sortedTables(s.excluded) {
		cols := slices.Sorted(maps.Keys(s.excluded[t]))
		missing, err := missingColumns(ctx, q, t, cols)
		if err != nil {
			return nil, fmt.Errorf("checking %s: %w", KeyColumnExcludeList, err)
		}
		for _, c := range missing {
			problems = append(problems, fmt.Sprintf("table %s has no column %q: name one of its columns", t.quoted(), c))
		}
	}
	return problems, nil
}

// missingColumns returns those of cols that table t lacks, in order.
func missingColumns(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, t tableName, cols []string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT c.name FROM unnest($3::text[]) WITH ORDINALITY AS c(name, ord)
WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a
                  JOIN pg_catalog.pg_class r ON r.oid = a.attrelid
                  JOIN pg_catalog.pg_namespace ns ON ns.oid = r.relnamespace
                  WHERE ns.nspname = $1 AND r.relname = $2 AND a.attname = c.name AND a.attnum > 0 AND NOT a.attisdropped)
ORDER BY c.ord`, t.Schema, t.Name, cols)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// checkTables reports, per configured table, why it cannot be captured,
// and which tables are captured row by row: partitioned tables and
// partitions (docs/decisions/0048), keyed by quoted name.
func checkTables(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, s settings) (problems []string, rowLevel map[string]bool, err error) {
	schemas, tables := splitNames(s.tables)
	rows, err := q.Query(ctx, `
SELECT t.s, t.n, c.relkind::text, coalesce(c.relispartition, false),
       coalesce(has_table_privilege(c.oid, 'SELECT'), false),
       coalesce(has_table_privilege(c.oid, 'TRIGGER'), false),
       -- dropping a trigger (reconfiguration, deletion) and commenting on
       -- one (the ownership marker) need the table owner's rights
       coalesce(pg_has_role(c.relowner, 'USAGE'), false), coalesce(pg_get_userbyid(c.relowner)::text, ''),
       current_user::text,
       -- naming the table (CREATE TRIGGER, COMMENT ON TRIGGER) needs USAGE
       -- on its schema, also for its owner
       coalesce(has_schema_privilege(ns.oid, 'USAGE'), false),
       -- a tidyconnect connector's own object (audit or wake-up table)
       coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), ''),
       -- inheritance (not partitioning) children and parent
       EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class ch ON ch.oid = i.inhrelid
               WHERE i.inhparent = c.oid AND NOT ch.relispartition),
       (SELECT i.inhparent::pg_catalog.regclass::text FROM pg_catalog.pg_inherits i
        WHERE i.inhrelid = c.oid AND NOT c.relispartition LIMIT 1),
       coalesce((SELECT array_agg(ans.nspname::text ORDER BY a.level) FROM pg_catalog.pg_partition_ancestors(c.oid) WITH ORDINALITY AS a(relid, level)
                 JOIN pg_catalog.pg_class ac ON ac.oid = a.relid JOIN pg_catalog.pg_namespace ans ON ans.oid = ac.relnamespace
                 WHERE a.relid <> c.oid), '{}'),
       coalesce((SELECT array_agg(ac.relname::text ORDER BY a.level) FROM pg_catalog.pg_partition_ancestors(c.oid) WITH ORDINALITY AS a(relid, level)
                 JOIN pg_catalog.pg_class ac ON ac.oid = a.relid
                 WHERE a.relid <> c.oid), '{}'),
       -- creating a partitioned table's row trigger clones it onto every
       -- partition, which needs TRIGGER there too (once it exists,
       -- PostgreSQL copies it onto new partitions without asking),
       coalesce((SELECT array_agg('"' || pg_catalog.replace(pns.nspname, '"', '""') || '"."' || pg_catalog.replace(pc.relname, '"', '""') || '"' ORDER BY pt.level, pc.relname)
                 FROM pg_catalog.pg_partition_tree(c.oid) AS pt
                 JOIN pg_catalog.pg_class pc ON pc.oid = pt.relid JOIN pg_catalog.pg_namespace pns ON pns.oid = pc.relnamespace
                 WHERE pt.relid <> c.oid AND NOT has_table_privilege(pt.relid, 'TRIGGER')
                   -- unless its row trigger exists, naming it: one that names
                   -- an earlier name is made again, and copied again (one
                   -- under the trigger's earlier name is renamed, on 15+)
                   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg WHERE tg.tgrelid = c.oid AND tg.tgparentid = 0
                                   AND (tg.tgname = $3 OR (tg.tgname = $4 AND pg_catalog.current_setting('server_version_num')::int >= 150000))
                                   AND tg.tgargs = pg_catalog.convert_to(t.s, pg_catalog.getdatabaseencoding()) || '\x00'::bytea
                                                   || pg_catalog.convert_to(t.n, pg_catalog.getdatabaseencoding()) || '\x00'::bytea)), '{}'),
       -- an incremental snapshot, scheduled when the row trigger is made,
       -- reads each leaf partition by name FOR SHARE (docs/decisions/0073),
       -- which needs SELECT and UPDATE on it (owning the partitioned table
       -- does not give them); the other modes read through the table
       coalesce((SELECT array_agg('"' || pg_catalog.replace(pns.nspname, '"', '""') || '"."' || pg_catalog.replace(pc.relname, '"', '""') || '"' ORDER BY pt.level, pc.relname)
                 FROM pg_catalog.pg_partition_tree(c.oid) AS pt
                 JOIN pg_catalog.pg_class pc ON pc.oid = pt.relid JOIN pg_catalog.pg_namespace pns ON pns.oid = pc.relnamespace
                 WHERE $7 AND pt.relid <> c.oid AND pt.isleaf AND pc.relkind = 'r'
                   AND NOT (has_table_privilege(pt.relid, 'SELECT') AND has_table_privilege(pt.relid, 'UPDATE'))
                   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg WHERE tg.tgrelid = c.oid AND tg.tgparentid = 0
                                   AND (tg.tgname = $3 OR (tg.tgname = $4 AND pg_catalog.current_setting('server_version_num')::int >= 150000))
                                   AND tg.tgargs = pg_catalog.convert_to(t.s, pg_catalog.getdatabaseencoding()) || '\x00'::bytea
                                                   || pg_catalog.convert_to(t.n, pg_catalog.getdatabaseencoding()) || '\x00'::bytea)), '{}'),
       -- a table gone under this name whose capture triggers still file
       -- changes under it: renamed (or moved to another schema) since
       (SELECT pg_catalog.string_agg(DISTINCT '"' || pg_catalog.replace(rns.nspname, '"', '""') || '"."' || pg_catalog.replace(rc.relname, '"', '""') || '"', ', ')
        FROM pg_catalog.pg_trigger tg
        JOIN pg_catalog.pg_class rc ON rc.oid = tg.tgrelid JOIN pg_catalog.pg_namespace rns ON rns.oid = rc.relnamespace
        WHERE c.oid IS NULL AND tg.tgparentid = 0 AND NOT tg.tgisinternal
          AND tg.tgfoid IN (pg_catalog.to_regprocedure($5), pg_catalog.to_regprocedure($6))
          AND tg.tgargs = pg_catalog.convert_to(t.s, pg_catalog.getdatabaseencoding()) || '\x00'::bytea
                          || pg_catalog.convert_to(t.n, pg_catalog.getdatabaseencoding()) || '\x00'::bytea)
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(s, n, i)
LEFT JOIN pg_catalog.pg_namespace ns ON ns.nspname = t.s
LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = t.n
ORDER BY t.i`, schemas, tables, objectNames(s.name).rowTrigger, objectNames(s.name).base+"_row",
		pgx.Identifier{s.auditSchema, objectNames(s.name).function}.Sanitize()+"()",
		pgx.Identifier{s.auditSchema, objectNames(s.name).rowFunction}.Sanitize()+"()", s.incremental)
	if err != nil {
		return nil, nil, fmt.Errorf("checking the configured tables: %w", err)
	}
	configured := map[tableName]bool{}
	for _, t := range s.tables {
		configured[t] = true
	}
	rowLevel = map[string]bool{}
	for rows.Next() {
		var (
			schema, table  string
			kind           *string
			partition      bool
			sel, trig      bool
			owns           bool
			owner, user    string
			schemaUsage    bool
			comment        string
			children       bool
			parent         *string
			ancSch, ancTab []string
			noTrigger      []string // partitions without TRIGGER privilege
			noCopy         []string // partitions an incremental snapshot cannot read
			renamedTo      *string  // a missing table's name now, from its capture triggers
		)
		if err := rows.Scan(&schema, &table, &kind, &partition, &sel, &trig, &owns, &owner, &user, &schemaUsage, &comment, &children, &parent, &ancSch, &ancTab, &noTrigger, &noCopy, &renamedTo); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("checking the configured tables: %w", err)
		}
		t := tableName{schema, table}
		var capturedAncestor *tableName
		for i := range ancSch {
			if a := (tableName{ancSch[i], ancTab[i]}); configured[a] {
				capturedAncestor = &a
				break
			}
		}
		switch {
		// Removing the old name from tables, as the message below says,
		// would delete the changes waiting under it (docs/decisions/0049):
		// a renamed table is named, so that they can be kept.
		case kind == nil && renamedTo != nil:
			problems = append(problems, fmt.Sprintf("table %s does not exist: it was renamed to %s, whose capture triggers still file its changes under %s; put the new name in %s instead of the old one, which moves its undelivered changes to it (removing the old name alone deletes them)", t.quoted(), *renamedTo, t.quoted(), KeyTables))
		case kind == nil:
			problems = append(problems, fmt.Sprintf("table %s does not exist: create it or remove it from %s", t.quoted(), KeyTables))
		case *kind != "r" && *kind != "p":
			problems = append(problems, fmt.Sprintf("%s is not a table (relkind %s): only tables can be captured", t.quoted(), *kind))
		// Its triggers would fire for the connector's own inserts, each of
		// which writes another audit row: writers would fail with "stack
		// depth limit exceeded".
		case strings.HasPrefix(comment, markerPrefix):
			problems = append(problems, fmt.Sprintf("table %s belongs to tidyconnect connector %q (its comment says so): it holds captured changes, and capturing it would capture the connectors' own writes; remove it from %s", t.quoted(), strings.TrimPrefix(comment, markerPrefix), KeyTables))
		// Row-level triggers are cloned onto partitions, not onto
		// inheritance children; statement-level ones fire only for the
		// table a statement names. Either way writes would be missed.
		case children:
			problems = append(problems, fmt.Sprintf("table %s has inheritance child tables: writes that name a child would not be captured; pgaudit captures partitioned tables but not inheritance (remove it from %s)", t.quoted(), KeyTables))
		case parent != nil:
			problems = append(problems, fmt.Sprintf("table %s is an inheritance child of %s: writes through %s would not be captured; pgaudit captures partitioned tables but not inheritance (remove it from %s)", t.quoted(), *parent, *parent, KeyTables))
		case capturedAncestor != nil:
			problems = append(problems, fmt.Sprintf("table %s is a partition of %s, which is also in %s: its changes would be captured twice; keep only one of them", t.quoted(), capturedAncestor.quoted(), KeyTables))
		default:
			if *kind == "p" || partition {
				rowLevel[t.quoted()] = true
			}
			if !schemaUsage {
				problems = append(problems, fmt.Sprintf("role %s has no USAGE privilege on schema %s of table %s: GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{user}.Sanitize(), pgx.Identifier{t.Schema}.Sanitize(), t.quoted(), pgx.Identifier{t.Schema}.Sanitize(), pgx.Identifier{user}.Sanitize()))
			}
			if !sel {
				problems = append(problems, fmt.Sprintf("role %s has no SELECT privilege on table %s: GRANT SELECT ON %s TO %s", pgx.Identifier{user}.Sanitize(), t.quoted(), t.quoted(), pgx.Identifier{user}.Sanitize()))
			}
			switch {
			case !owns:
				why := "creating, marking and dropping its capture triggers needs the owner's rights"
				if s.logical {
					why = "PostgreSQL adds to a publication only tables the role owns"
				}
				problems = append(problems, fmt.Sprintf("role %s does not own table %s (%s): connect as its owner %s, or ALTER TABLE %s OWNER TO %s, or make %s an inheriting member of %s (GRANT %s TO %s; not when %s is a superuser)",
					pgx.Identifier{user}.Sanitize(), t.quoted(), why, pgx.Identifier{owner}.Sanitize(), t.quoted(), pgx.Identifier{user}.Sanitize(),
					pgx.Identifier{user}.Sanitize(), pgx.Identifier{owner}.Sanitize(), pgx.Identifier{owner}.Sanitize(), pgx.Identifier{user}.Sanitize(), pgx.Identifier{owner}.Sanitize()))
			case !trig:
				problems = append(problems, fmt.Sprintf("role %s has no TRIGGER privilege on table %s: GRANT TRIGGER ON %s TO %s", pgx.Identifier{user}.Sanitize(), t.quoted(), t.quoted(), pgx.Identifier{user}.Sanitize()))
			}
			for _, p := range noTrigger {
				problems = append(problems, fmt.Sprintf("role %s has no TRIGGER privilege on %s, a partition of %s (its capture trigger is copied onto every partition): GRANT TRIGGER ON %s TO %s (or connect as the owner)", pgx.Identifier{user}.Sanitize(), p, t.quoted(), p, pgx.Identifier{user}.Sanitize()))
			}
			for _, p := range noCopy {
				problems = append(problems, fmt.Sprintf("role %s has no SELECT and UPDATE privileges on %s, a partition of %s (%s=%s copies each partition by name, reading its rows FOR SHARE): GRANT SELECT, UPDATE ON %s TO %s (or connect as the owner, or use %s=%s, which reads through %s)", pgx.Identifier{user}.Sanitize(), p, t.quoted(), KeySnapshotMode, snapshotIncremental, p, pgx.Identifier{user}.Sanitize(), KeySnapshotMode, snapshotInitial, t.quoted()))
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("checking the configured tables: %w", err)
	}
	if len(problems) > 0 {
		return problems, rowLevel, nil
	}
	// The capture function stores binary row images (record_send): a
	// column whose type, element type, base type, range subtype or
	// attribute type has no
	// binary send/receive function would make the captured tables' writes
	// fail, so such a table is refused up front.
	rows, err = q.Query(ctx, `
WITH RECURSIVE cols(tbl, col, typ, depth) AS (
  SELECT c.oid, a.attname::text, a.atttypid, 0
  FROM unnest($1::text[], $2::text[]) AS t(s, n)
  JOIN pg_catalog.pg_namespace ns ON ns.nspname = t.s
  JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = t.n
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT cols.tbl, cols.col, sub.typ, cols.depth + 1
  FROM cols JOIN pg_catalog.pg_type ty ON ty.oid = cols.typ
  CROSS JOIN LATERAL (
    SELECT ty.typbasetype WHERE ty.typtype = 'd'
    UNION ALL SELECT ty.typelem WHERE ty.typcategory = 'A' AND ty.typelem <> 0
    UNION ALL SELECT r.rngsubtype FROM pg_catalog.pg_range r
              WHERE (ty.typtype = 'r' AND r.rngtypid = ty.oid) OR (ty.typtype = 'm' AND r.rngmultitypid = ty.oid)
    UNION ALL SELECT a.atttypid FROM pg_catalog.pg_attribute a
              WHERE ty.typrelid <> 0 AND a.attrelid = ty.typrelid AND a.attnum > 0 AND NOT a.attisdropped) AS sub(typ)
  WHERE cols.depth < 8)
SELECT DISTINCT ns.nspname::text, c.relname::text, cols.col, pg_catalog.format_type(cols.typ, NULL)
FROM cols
JOIN pg_catalog.pg_type ty ON ty.oid = cols.typ
JOIN pg_catalog.pg_class c ON c.oid = cols.tbl
JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
WHERE ty.typsend = 0 OR ty.typreceive = 0
ORDER BY 1, 2, 3`, schemas, tables)
	if err != nil {
		return nil, nil, fmt.Errorf("checking the column types of the configured tables: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t tableName
		var col, typ string
		if err := rows.Scan(&t.Schema, &t.Name, &col, &typ); err != nil {
			return nil, nil, fmt.Errorf("checking the column types of the configured tables: %w", err)
		}
		problems = append(problems, fmt.Sprintf("column %s of table %s uses type %s, which has no binary send/receive functions: pgaudit cannot capture this table (remove it from %s)", pgx.Identifier{col}.Sanitize(), t.quoted(), typ, KeyTables))
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("checking the column types of the configured tables: %w", err)
	}
	return problems, rowLevel, nil
}

// Validate checks what ConfigDef cannot: the database is reachable, and the
// tables exist and may be read and given triggers. It provisions nothing.
func (c *Connector) Validate(ctx context.Context, cfg connect.Config) map[string][]string {
	s, errs := parseSettings(connectorName(connect.HostFrom(ctx), cfg), cfg)
	delete(errs, "name") // the REST layer names the connector
	if len(errs[KeyURL]) > 0 || s.url == "" {
		return errs
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := connectDB(ctx, s.url, ApplicationName(s.name, "validate"))
	if err != nil {
		errs[KeyURL] = append(errs[KeyURL], err.Error())
		return errs
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := checkServerVersion(ctx, conn); err != nil {
		errs[KeyURL] = append(errs[KeyURL], err.Error())
		return errs
	}
	if s.logical {
		_, slot := logicalNames(s.name)
		lp, err := checkLogical(ctx, conn, slot)
		if err != nil {
			errs[KeyURL] = append(errs[KeyURL], err.Error())
		}
		for k, v := range lp {
			errs[k] = append(errs[k], v...)
		}
	}
	if len(s.tables) > 0 {
		problems, _, err := checkTables(ctx, conn, s)
		if err != nil {
			errs[KeyURL] = append(errs[KeyURL], err.Error())
		}
		errs[KeyTables] = append(errs[KeyTables], problems...)
		if len(problems) == 0 && err == nil {
			keyProblems, err := checkKeyColumns(ctx, conn, s)
			if err != nil {
				errs[KeyURL] = append(errs[KeyURL], err.Error())
			}
			errs[KeyMessageKeyColumns] = append(errs[KeyMessageKeyColumns], keyProblems...)
			exProblems, err := checkExcludedColumns(ctx, conn, s)
			if err != nil {
				errs[KeyURL] = append(errs[KeyURL], err.Error())
			}
			errs[KeyColumnExcludeList] = append(errs[KeyColumnExcludeList], exProblems...)
			if s.logical && len(keyProblems) == 0 && err == nil {
				rp, err := checkReplicaIdentity(ctx, conn, s)
				if err != nil {
					errs[KeyURL] = append(errs[KeyURL], err.Error())
				}
				for k, v := range rp {
					errs[k] = append(errs[k], v...)
				}
			}
		}
	}
	if s.logical {
		// No audit objects.
	} else if p, err := checkAuditSchema(ctx, conn, s); err != nil {
		errs[KeyURL] = append(errs[KeyURL], err.Error())
	} else if p != "" {
		errs[KeyAuditSchema] = append(errs[KeyAuditSchema], p)
	}
	if s.name != "" {
		// An early refusal only (Start refuses from the ledger): a failed
		// lookup (a role that may not read pg_replication_slots) does not
		// block validation.
		if p, err := checkMethodObjects(ctx, conn, s); err == nil && p != "" {
			errs[KeyCaptureMethod] = append(errs[KeyCaptureMethod], p)
		}
	}
	if !s.logical && s.name != "" && len(s.tables) > 0 && len(errs[KeyAuditSchema]) == 0 {
		// A PUT of a changed config answers 400 instead of failing later.
		if p, err := checkAuditSchemaMove(ctx, conn, s, objectNames(s.name)); err != nil {
			errs[KeyURL] = append(errs[KeyURL], err.Error())
		} else if p != "" {
			errs[KeyAuditSchema] = append(errs[KeyAuditSchema], p)
		}
	}
	for k, v := range errs {
		if len(v) == 0 {
			delete(errs, k)
		}
	}
	return errs
}

// checkAuditSchema reports whether the audit objects can be created.
func checkAuditSchema(ctx context.Context, conn interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, s settings) (string, error) {
	var schemaExists, canUse, canCreateIn, canCreateSchema bool
	var user string
	err := conn.QueryRow(ctx, `
SELECT ns.oid IS NOT NULL,
       coalesce(has_schema_privilege(ns.oid, 'USAGE'), false),
       coalesce(has_schema_privilege(ns.oid, 'CREATE'), false),
       has_database_privilege(current_database(), 'CREATE'),
       current_user::text
FROM (SELECT 1) one LEFT JOIN pg_catalog.pg_namespace ns ON ns.nspname = $1`, s.auditSchema).
		Scan(&schemaExists, &canUse, &canCreateIn, &canCreateSchema, &user)
	if err != nil {
		return "", fmt.Errorf("checking the audit schema: %w", err)
	}
	// Every Start (re)creates the capture functions (CREATE OR REPLACE
	// FUNCTION needs CREATE on the schema also when the function exists)
	// and names the objects in the schema (USAGE): an existing audit table
	// does not make either privilege unnecessary.
	var missing []string
	if schemaExists && !canUse {
		missing = append(missing, "USAGE")
	}
	if schemaExists && !canCreateIn {
		missing = append(missing, "CREATE")
	}
	switch {
	case !schemaExists && !canCreateSchema:
		return fmt.Sprintf("schema %s does not exist and this role may not create schemas: create it, or GRANT CREATE ON DATABASE", pgx.Identifier{s.auditSchema}.Sanitize()), nil
	case len(missing) > 0:
		q := pgx.Identifier{s.auditSchema}.Sanitize()
		return fmt.Sprintf("role %s has no %s privilege on schema %s: GRANT %s ON SCHEMA %s TO %s",
			pgx.Identifier{user}.Sanitize(), strings.Join(missing, " and "), q, strings.Join(missing, ", "), q, pgx.Identifier{user}.Sanitize()), nil
	}
	return "", nil
}

// provision creates what is missing, in one transaction under the advisory
// lock, recording each object in the ledger before creating it. Triggers the
// ledger lists for tables no longer configured are dropped.
func provision(ctx context.Context, conn *pgx.Conn, s settings, h *connect.Host) (err error) {
	n := objectNames(s.name)
	v := n.vars(s.auditSchema)
	var (
		before    []connect.Resource // what the ledger listed, read under the lock
		newly     []connect.Resource
		committed bool
	)
	own := func(r connect.Resource) error {
		if !slices.Contains(before, r) {
			newly = append(newly, r)
		}
		if err := h.Ledger.Own(ctx, r); err != nil {
			return fmt.Errorf("recording %v in the ledger: %w", r, err)
		}
		return nil
	}
	if err := addImageColumns(ctx, conn, v.Table); err != nil {
		return err
	}
	// READ COMMITTED whatever the database's default: an initial snapshot
	// must read the table after its triggers' lock was granted, with a
	// snapshot of its own, not the transaction's first.
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fmt.Errorf("provisioning: %w", err)
	}
	defer func() {
		if err != nil && !committed {
			// What this attempt recorded was never created. Released
			// before the rollback ends the advisory lock: another
			// instance of the connector provisioning next must not find
			// the entries, skip recording them, and then lose them.
			for _, r := range newly {
				_ = h.Ledger.Release(context.WithoutCancel(ctx), r)
			}
		}
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}()
	if err := takeLock(ctx, tx); err != nil {
		return fmt.Errorf("provisioning: %w", err)
	}
	// Under the lock: another instance of the connector that provisioned
	// meanwhile has recorded (or released) its entries by now.
	if before, err = ownedResources(ctx, h.Ledger); err != nil {
		return err
	}
	if err := checkServerVersion(ctx, tx); err != nil {
		return fmt.Errorf("%s: %w", KeyURL, err)
	}
	if before, err = rehomeDatabase(ctx, tx, s, n, h, before); err != nil {
		return err
	}
	if p, err := checkAuditSchemaMove(ctx, tx, s, n); err != nil {
		return err
	} else if p != "" {
		return fmt.Errorf("%s: %s", KeyAuditSchema, p)
	}
	problems, rowLevel, err := checkTables(ctx, tx, s)
	if err != nil {
		return err
	}
	// Named by key, as the audit.schema problems below and Validate's
	// answer are: a Start that fails later (a privilege revoked since
	// validation) says which setting is at fault.
	for i, p := range problems {
		problems[i] = KeyTables + ": " + p
	}
	if len(problems) == 0 {
		keyProblems, err := checkKeyColumns(ctx, tx, s)
		if err != nil {
			return err
		}
		for _, p := range keyProblems {
			problems = append(problems, KeyMessageKeyColumns+": "+p)
		}
		exProblems, err := checkExcludedColumns(ctx, tx, s)
		if err != nil {
			return err
		}
		for _, p := range exProblems {
			problems = append(problems, KeyColumnExcludeList+": "+p)
		}
	}
	if s.rowLevel {
		for _, t := range s.tables {
			rowLevel[t.quoted()] = true
		}
	}
	if p, err := checkAuditSchema(ctx, tx, s); err != nil {
		return err
	} else if p != "" {
		problems = append(problems, KeyAuditSchema+": "+p)
	}
	if len(problems) > 0 {
		return fmt.Errorf("cannot capture (nothing was provisioned): %s", strings.Join(problems, "; "))
	}
	if err := warnOwnAfterTriggers(ctx, tx, h, s, rowLevel); err != nil {
		return err
	}

	var (
		db                                                      string
		schemaExists, tableExists, wakeupExists, functionExists bool
		waitersExists, orderExists, rowFunctionExists           bool
		functionMarker, orderMarker, rowFunctionMarker          *string
		imageColumns                                            bool
	)
	err = tx.QueryRow(ctx, `
SELECT current_database()::text,
       EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1),
       EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
               WHERE ns.nspname = $1 AND c.relname = $2),
       EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
               WHERE ns.nspname = $1 AND p.proname = $3 AND p.pronargs = 0),
       EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
               WHERE ns.nspname = $1 AND c.relname = $4),
       (SELECT obj_description(p.oid, 'pg_proc') FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
               WHERE ns.nspname = $1 AND p.proname = $3 AND p.pronargs = 0),
       EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
               WHERE ns.nspname = $1 AND c.relname = $5 AND c.relkind = 'S'),
       EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
               WHERE ns.nspname = $1 AND p.proname = $6 AND p.pronargs = 0),
       (SELECT obj_description(p.oid, 'pg_proc') FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
               WHERE ns.nspname = $1 AND p.proname = $6 AND p.pronargs = 0),
       EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
               WHERE ns.nspname = $1 AND p.proname = $7 AND p.pronargs = 0),
       (SELECT obj_description(p.oid, 'pg_proc') FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace
               WHERE ns.nspname = $1 AND p.proname = $7 AND p.pronargs = 0),
       (SELECT count(*) FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
               JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
               WHERE ns.nspname = $1 AND c.relname = $2 AND a.attname IN ('image_schema', 'image_table', 'image_relid') AND NOT a.attisdropped) = 3`,
		s.auditSchema, n.table, n.function, n.wakeup, n.waiters, n.order, n.rowFunction).Scan(&db, &schemaExists, &tableExists, &functionExists, &wakeupExists, &functionMarker, &waitersExists, &orderExists, &orderMarker, &rowFunctionExists, &rowFunctionMarker, &imageColumns)
	if err != nil {
		return fmt.Errorf("provisioning: inspecting existing objects: %w", err)
	}

	// Objects of this connector's that the ledger does not list: a
	// connector re-created under the same name after a deletion with
	// cleanup.on.delete=false (which handed them over) takes them back, as
	// it uses them again, so that its own deletion drops them.
	type markedObject struct {
		r      connect.Resource
		marker *string
	}
	var adopt []markedObject
	{
		var schemaM, tableM, wakeupM, waitersM *string
		if err := tx.QueryRow(ctx, `
SELECT (SELECT obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace WHERE nspname = $1),
       (SELECT obj_description(c.oid, 'pg_class') FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1 AND c.relname = $2),
       (SELECT obj_description(c.oid, 'pg_class') FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1 AND c.relname = $3),
       (SELECT obj_description(c.oid, 'pg_class') FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1 AND c.relname = $4)`,
			s.auditSchema, n.table, n.wakeup, n.waiters).Scan(&schemaM, &tableM, &wakeupM, &waitersM); err != nil {
			return fmt.Errorf("provisioning: inspecting existing objects: %w", err)
		}
		adopt = []markedObject{
			{schemaRes(db, s.auditSchema), schemaM},
			{tableRes(db, s.auditSchema, n.table), tableM},
			{tableRes(db, s.auditSchema, n.wakeup), wakeupM},
			{sequenceRes(db, s.auditSchema, n.waiters), waitersM},
			{functionRes(db, s.auditSchema, n.function), functionMarker},
			{functionRes(db, s.auditSchema, n.rowFunction), rowFunctionMarker},
		}
		if s.commitOrder {
			adopt = append(adopt, markedObject{functionRes(db, s.auditSchema, n.order), orderMarker})
		}
	}
	// The incremental snapshots' progress table, made only under
	// snapshot.mode=incremental and kept (with what it still holds) when
	// the mode changes: dropped with the connector.
	var snapshotTableExists bool
	var snapshotMarker *string
	if err := tx.QueryRow(ctx, `SELECT c.oid IS NOT NULL, obj_description(c.oid, 'pg_class')
FROM (SELECT 1) x LEFT JOIN pg_catalog.pg_class c
  ON c.relname = $2 AND c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = $1)`,
		s.auditSchema, n.snapshot).Scan(&snapshotTableExists, &snapshotMarker); err != nil {
		return fmt.Errorf("provisioning: inspecting existing objects: %w", err)
	}
	if snapshotTableExists {
		if !isMarked(snapshotMarker, n.marker) && s.incremental {
			return fmt.Errorf("%s: %s=%s needs the table %s.%s, which exists but is not this connector's (no marker): nothing was changed; drop or rename it, or choose another %s",
				KeySnapshotMode, KeySnapshotMode, snapshotIncremental, pgx.Identifier{s.auditSchema}.Sanitize(), pgx.Identifier{n.snapshot}.Sanitize(), KeyAuditSchema)
		}
		adopt = append(adopt, markedObject{tableRes(db, s.auditSchema, n.snapshot), snapshotMarker})
	}
	for i, a := range adopt {
		// The audit schema another pgaudit connector made is shared: each
		// connector that uses it owns it too, so that whichever is deleted
		// last drops it (DROP SCHEMA ... RESTRICT: only once it is empty).
		shared := i == 0 && a.marker != nil && strings.HasPrefix(*a.marker, markerPrefix)
		if (isMarked(a.marker, n.marker) || shared) && !slices.Contains(before, a.r) {
			if err := own(a.r); err != nil {
				return err
			}
		}
	}

	if tableExists {
		// An audit table of the layout before binary images (0044): the new
		// capture function could not write into it, and would make the
		// captured tables' writes fail. Leave everything as it is.
		var current bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = $1::regclass AND attname = 'changes' AND NOT attisdropped)`, v.Table).Scan(&current); err != nil {
			return fmt.Errorf("provisioning: inspecting the audit table %s: %w", v.Table, err)
		}
		if !current {
			return fmt.Errorf("the audit table %s was created by an earlier tidyconnect version with a different layout (JSON images); nothing was changed: deliver its remaining changes with that version, then delete and re-create the connector", v.Table)
		}
	}

	// lz4 compresses the grouped images several times faster than pglz,
	// which writers pay for inside their statements.
	var lz4 bool
	if err := tx.QueryRow(ctx, `SELECT coalesce(bool_or('lz4' = ANY (enumvals)), false) FROM pg_catalog.pg_settings WHERE name = 'default_toast_compression'`).Scan(&lz4); err != nil {
		return fmt.Errorf("provisioning: inspecting the server's compression methods: %w", err)
	}
	if lz4 {
		v.Compression = " COMPRESSION lz4"
	}

	var script strings.Builder
	add := func(file, block string, vars sqlVars) error {
		sql, err := render(file, block, vars)
		if err != nil {
			return err
		}
		script.WriteString(sql)
		script.WriteString(";\n")
		return nil
	}
	if !schemaExists {
		if err := own(schemaRes(db, s.auditSchema)); err != nil {
			return err
		}
		if err := add("0000_audit_schema.up.sql", "", v); err != nil {
			return err
		}
	}
	if !tableExists {
		if err := own(tableRes(db, s.auditSchema, n.table)); err != nil {
			return err
		}
		if err := add("0001_audit_table.up.sql", "", v); err != nil {
			return err
		}
	} else if !imageColumns {
		// addImageColumns did not see the table (it was made meanwhile).
		fmt.Fprintf(&script, "ALTER TABLE %s %s;\n", v.Table, addImageColumnsSQL)
	}
	if !wakeupExists || !waitersExists {
		// A wake-up table of an earlier version has no waiters sequence
		// yet; the capture function below needs it. The migration creates
		// only what is missing; the sequence goes with the table.
		if !wakeupExists {
			if err := own(tableRes(db, s.auditSchema, n.wakeup)); err != nil {
				return err
			}
		}
		if !waitersExists {
			if err := own(sequenceRes(db, s.auditSchema, n.waiters)); err != nil {
				return err
			}
		}
		if err := add("0002_wakeup_table.up.sql", "", v); err != nil {
			return err
		}
	}
	if s.incremental && !snapshotTableExists {
		if err := own(tableRes(db, s.auditSchema, n.snapshot)); err != nil {
			return err
		}
		if err := add("0008_snapshot_progress.up.sql", "", v); err != nil {
			return err
		}
	}
	progress := s.incremental || (snapshotTableExists && isMarked(snapshotMarker, n.marker))
	// A function is (re)created when missing or when it carries our
	// marker, so an upgrade ships a new body; someone else's is left alone.
	makeFunction := !functionExists || isMarked(functionMarker, n.marker)
	makeRowFunction := !rowFunctionExists || isMarked(rowFunctionMarker, n.marker)
	for _, f := range []struct {
		make, exists    bool
		name, migration string
	}{
		{makeFunction, functionExists, n.function, "0003_capture_function"},
		{makeRowFunction, rowFunctionExists, n.rowFunction, "0006_row_capture"},
	} {
		if !f.make {
			continue
		}
		if !f.exists {
			if err := own(functionRes(db, s.auditSchema, f.name)); err != nil {
				return err
			}
		}
		body, err := render(f.migration+".body.sql", "", v)
		if err != nil {
			return err
		}
		fv := v
		fv.Body = quoteLiteral(body)
		if err := add(f.migration+".up.sql", "", fv); err != nil {
			return err
		}
	}

	// Triggers. Statement-level capture (one trigger per event) on plain
	// tables; row-level capture (one trigger for INSERT, UPDATE and DELETE,
	// passed the table's name) on partitioned tables and partitions, and on
	// every table under capture.level = row; the statement-level TRUNCATE
	// trigger on all (docs/decisions/0048).
	captureTriggers := []string{n.trigger("INSERT"), n.trigger("UPDATE"), n.trigger("DELETE"), n.trigger("TRUNCATE"), n.rowTrigger}
	rowTriggers := []string{n.rowTrigger, n.trigger("TRUNCATE")}
	wantedTriggers := func(t tableName) []string {
		if rowLevel[t.quoted()] {
			return rowTriggers
		}
		return captureTriggers[:4]
	}
	// The row trigger's name before it began with '!' (decision 0048):
	// renamed where PostgreSQL renames a partitioned table's copies on its
	// partitions too (15 and later), made anew otherwise.
	earlierRowTrigger := n.base + "_row"
	var serverVersion int
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.current_setting('server_version_num')::int`).Scan(&serverVersion); err != nil {
		return fmt.Errorf("reading the server version: %w", err)
	}
	renameCascades := serverVersion >= 150000
	existing, err := existingTriggers(ctx, tx, append([]string{n.order, earlierRowTrigger}, captureTriggers...), n.marker)
	if err != nil {
		return err
	}
	// Only the triggers a table keeps: one about to be replaced by the
	// other kind may be disabled.
	var stmtTables, rowTables []tableName
	for _, t := range s.tables {
		if rowLevel[t.quoted()] {
			rowTables = append(rowTables, t)
		} else {
			stmtTables = append(stmtTables, t)
		}
	}
	var disabled []string
	for _, set := range []struct {
		trigs  []string
		tables []tableName
	}{{captureTriggers[:4], stmtTables}, {rowTriggers, rowTables}} {
		if len(set.tables) == 0 {
			continue
		}
		d, err := disabledTriggers(ctx, tx, set.trigs, set.tables)
		if err != nil {
			return err
		}
		disabled = append(disabled, d...)
	}
	if len(disabled) > 0 {
		return fmt.Errorf("%s: capture triggers are disabled, so changes are not captured (nothing was changed): %s; enable them, or remove the tables", KeyTables, strings.Join(disabled, "; "))
	}
	if s.commitOrder {
		if disabled, err := disabledTriggers(ctx, tx, []string{n.order}, []tableName{{s.auditSchema, n.table}}); err != nil {
			return err
		} else if len(disabled) > 0 {
			return fmt.Errorf("%s: the commit-order trigger is disabled, so changes leave in statement order (nothing was changed): %s; enable it, or set %s=%s", KeyCaptureOrder, strings.Join(disabled, "; "), KeyCaptureOrder, orderStatement)
		}
	}
	var removed []connect.Resource
	configured := map[string]bool{}
	for _, t := range s.tables {
		configured[t.quoted()] = true
	}
	ours := func(key string) bool { return isMarked(existing[key], n.marker) }
	dropTrigger := func(t tableName, trig string) error {
		tv := v
		tv.Captured, tv.Trigger = t.quoted(), pgx.Identifier{trig}.Sanitize()
		return add("0004_table_triggers.down.sql", "", tv)
	}
	// createTrigger is CREATE OR REPLACE: replacing a trigger whose
	// arguments name an earlier table name locks writers out of the table
	// (and waits for those in flight), but not readers.
	createTrigger := func(t tableName, trig string) error {
		tv := v
		tv.Captured, tv.Trigger = t.quoted(), pgx.Identifier{trig}.Sanitize()
		tv.CapturedSchemaLiteral, tv.CapturedNameLiteral = quoteLiteral(t.Schema), quoteLiteral(t.Name)
		if trig == n.rowTrigger {
			return add("0006_row_capture.up.sql", "trigger", tv)
		}
		return add("0004_table_triggers.up.sql", triggerEvents[slices.Index(captureTriggers, trig)], tv)
	}

	// Every trigger that calls the connector's functions files its changes
	// under the name its arguments give (or, made by an earlier version
	// without arguments, its table's name at the time). A table renamed
	// since files under its earlier name (docs/decisions/0049). From the
	// triggers, this Start works out where each name's waiting changes go:
	// - a configured table's trigger: under the table's current name, so
	//   the changes filed under its arguments' name move there;
	// - a trigger on a table that is not configured (renamed, and the
	//   configuration dropped it; or never listed): nowhere, its changes
	//   are purged with it.
	// The moves are one UPDATE, so swapped and chained renames come out
	// right. Script order: drops and re-creations first (they wait for the
	// writers in flight, and hold them off until commit, so nothing files
	// under an old name afterwards), then purges, then the moves, then the
	// triggers that are missing.
	var calling []callingTrigger
	for _, fn := range []struct {
		ours   bool
		quoted string
	}{
		{isMarked(functionMarker, n.marker), v.Function},
		{isMarked(rowFunctionMarker, n.marker), v.RowFunction},
	} {
		if !fn.ours {
			continue
		}
		cs, err := triggersCalling(ctx, tx, fn.quoted+"()", nil)
		if err != nil {
			return err
		}
		calling = append(calling, cs...)
	}
	moveTo := map[tableName]tableName{} // name filed under -> current name
	ambiguous := map[tableName]bool{}
	filing := map[tableName]bool{} // names configured tables' triggers file under, unchanged
	relidOf := map[tableName]uint32{}
	type stray struct {
		table, filedAs tableName
		partitioned    bool
		relid          uint32
	}
	var strays []stray
	for _, ct := range calling {
		filedAs := ct.table
		if len(ct.args) == 2 {
			filedAs = tableName{ct.args[0], ct.args[1]}
		}
		if !configured[ct.table.quoted()] {
			if !ct.owned {
				return fmt.Errorf("%s: table %s is not configured but carries the connector's capture trigger %s, which this role cannot drop (it does not own the table; nothing was changed): drop the trigger as the table's owner (DROP TRIGGER %s ON %s), or add the table to %s",
					KeyTables, ct.table.quoted(), pgx.Identifier{ct.trigger}.Sanitize(), pgx.Identifier{ct.trigger}.Sanitize(), ct.table.quoted(), KeyTables)
			}
			if filedAs == ct.table {
				// Taken out of tables on purpose: nothing unexpected.
				h.Logger.Info("table removed from tables: dropping its capture trigger and the changes still waiting for it", "table", ct.table.String(), "trigger", ct.trigger)
			} else {
				h.Logger.Warn("dropping a capture trigger on a table that is not configured under its current name (renamed?); its waiting changes go with it", "table", ct.table.String(), "trigger", ct.trigger, "filed_as", filedAs.String())
			}
			fmt.Fprintf(&script, "DROP TRIGGER IF EXISTS %s ON %s;\n", pgx.Identifier{ct.trigger}.Sanitize(), ct.table.quoted())
			delete(existing, ct.table.quoted()+" "+ct.trigger)
			if st := (stray{ct.table, filedAs, ct.partitioned, ct.relid}); !slices.Contains(strays, st) {
				strays = append(strays, st)
			}
			continue
		}
		relidOf[ct.table] = ct.relid
		if ct.trigger == earlierRowTrigger && renameCascades && slices.Contains(wantedTriggers(ct.table), n.rowTrigger) {
			if _, taken := existing[ct.table.quoted()+" "+n.rowTrigger]; !taken {
				// Renamed, it keeps its enable state: a disabled one is
				// refused like a disabled current one (made anew, it would
				// not be disabled any more).
				if d, err := disabledTriggers(ctx, tx, []string{earlierRowTrigger}, []tableName{ct.table}); err != nil {
					return err
				} else if len(d) > 0 {
					return fmt.Errorf("%s: capture triggers are disabled, so changes are not captured (nothing was changed): %s; enable them, or remove the tables", KeyTables, strings.Join(d, "; "))
				}
				fmt.Fprintf(&script, "ALTER TRIGGER %s ON %s RENAME TO %s;\n", pgx.Identifier{earlierRowTrigger}.Sanitize(), ct.table.quoted(), pgx.Identifier{n.rowTrigger}.Sanitize())
				existing[ct.table.quoted()+" "+n.rowTrigger] = existing[ct.table.quoted()+" "+earlierRowTrigger]
				delete(existing, ct.table.quoted()+" "+earlierRowTrigger)
				if r := triggerRes(db, ct.table, earlierRowTrigger); slices.Contains(before, r) {
					removed = append(removed, r)
				}
				ct.trigger = n.rowTrigger
			}
		}
		wanted := slices.Contains(wantedTriggers(ct.table), ct.trigger)
		stale := len(ct.args) != 2 || filedAs != ct.table
		switch {
		case !wanted:
			// The other kind (the table became partitioned, a partition,
			// or a plain table again, or capture.level changed).
			if err := dropTrigger(ct.table, ct.trigger); err != nil {
				return err
			}
			delete(existing, ct.table.quoted()+" "+ct.trigger)
			if r := triggerRes(db, ct.table, ct.trigger); slices.Contains(before, r) {
				removed = append(removed, r)
			}
		case stale:
			if err := createTrigger(ct.table, ct.trigger); err != nil {
				return err
			}
		}
		if filedAs == ct.table {
			filing[filedAs] = true
			continue
		}
		if to, ok := moveTo[filedAs]; ok && to != ct.table {
			ambiguous[filedAs] = true
		}
		moveTo[filedAs] = ct.table
	}
	for name := range moveTo {
		if filing[name] {
			ambiguous[name] = true
		}
	}
	for name := range ambiguous {
		// Two configured tables' triggers file under one name: whose
		// changes are whose cannot be told apart; they stay where they are.
		h.Logger.Warn("changes waiting under a name that the triggers of two configured tables file under stay there", "filed_as", name.String())
		delete(moveTo, name)
	}

	// Triggers the ledger lists on tables no longer configured (those not
	// found above: someone replaced them, or their table is gone).
	purge := map[tableName]bool{}
	for _, st := range strays {
		_, moving := moveTo[st.filedAs]
		if configured[st.filedAs.quoted()] && !st.partitioned && !moving && !filing[st.filedAs] {
			// The name is still configured, for another table (the classic
			// swap: orders renamed to orders_old, a new orders created).
			// What the renamed table wrote since the rename (under this or
			// any later name: the image names the table, and image_relid
			// says it was this one, not one an earlier Start settled; rows
			// written before image_relid existed have none) goes
			// with it; what it wrote before stays the name's, read with the
			// renamed table's columns.
			fS, fN := quoteLiteral(st.filedAs.Schema), quoteLiteral(st.filedAs.Name)
			fmt.Fprintf(&script, "DELETE FROM %s WHERE schema_name = %s AND table_name = %s AND (image_relid = %d OR (image_relid IS NULL AND image_table IS NOT NULL)) AND NOT (image_schema = %s AND image_table = %s);\n",
				v.Table, fS, fN, st.relid, fS, fN)
			fmt.Fprintf(&script, "UPDATE %s SET image_schema = %s, image_table = %s, image_relid = %d WHERE schema_name = %s AND table_name = %s AND image_table IS NULL OR (schema_name = %s AND table_name = %s AND image_schema = %s AND image_table = %s);\n",
				v.Table, quoteLiteral(st.table.Schema), quoteLiteral(st.table.Name), st.relid, fS, fN, fS, fN, fS, fN)
			continue
		}
		if configured[st.filedAs.quoted()] && st.partitioned {
			// A partitioned table's images name its partitions, before and
			// after the rename alike: its changes cannot be told apart.
			h.Logger.Warn("a renamed partitioned table's waiting changes go with it although a new table took its name: which were made before the rename cannot be told (let the connector drain before swapping partitioned tables)", "table", st.table.String(), "filed_as", st.filedAs.String())
		}
		purge[st.filedAs] = true
	}
	for _, r := range before {
		// The order trigger lives on the audit table, which is never a
		// configured table: provisionOrder decides about it.
		if r.Kind != KindTrigger || r.Name == n.order {
			continue
		}
		rdb, parts, err := parseQualified(r.Location)
		if err != nil || len(parts) != 2 || rdb != db {
			continue
		}
		t := tableName{parts[0], parts[1]}
		if configured[t.quoted()] {
			continue
		}
		key := t.quoted() + " " + r.Name
		if _, ok := existing[key]; ok {
			if ours(key) {
				if err := dropTrigger(t, r.Name); err != nil {
					return err
				}
			} else {
				h.Logger.Warn("not dropping a trigger that no longer carries this connector's marker (someone replaced it)", "resource", r.String())
			}
		}
		purge[t] = true
		removed = append(removed, r)
	}
	// A name whose changes move to a configured table is not purged: they
	// are that table's (renamed since). Nor is one that a configured
	// table's trigger files under already: they cannot be told apart.
	for _, name := range slices.SortedFunc(maps.Keys(purge), compareTables) {
		if _, moving := moveTo[name]; moving || filing[name] {
			if filing[name] {
				h.Logger.Warn("changes filed under a name that both a dropped trigger and a configured table's trigger use stay", "filed_as", name.String())
			}
			continue
		}
		fmt.Fprintf(&script, "DELETE FROM %s WHERE schema_name = %s AND table_name = %s;\n", v.Table, quoteLiteral(name.Schema), quoteLiteral(name.Name))
		if progress {
			fmt.Fprintf(&script, "DELETE FROM %s WHERE filed_schema = %s AND filed_table = %s;\n", v.Snapshot, quoteLiteral(name.Schema), quoteLiteral(name.Name))
		}
	}
	if len(moveTo) > 0 {
		var values []string
		for _, from := range slices.SortedFunc(maps.Keys(moveTo), compareTables) {
			to := moveTo[from]
			values = append(values, fmt.Sprintf("(%s, %s, %s, %s, %d::pg_catalog.oid)", quoteLiteral(from.Schema), quoteLiteral(from.Name), quoteLiteral(to.Schema), quoteLiteral(to.Name), relidOf[to]))
			h.Logger.Info("changes waiting under a table's earlier name now go under its current name", "table", to.String(), "earlier", from.String())
		}
		// Images of the moved table itself (recorded under the old name or
		// any name it had, a row-level trigger records one always) need no
		// name any more: it is the one they are now filed under. A
		// partition's stay.
		const own = `((a.image_schema = m.from_s AND a.image_table = m.from_t) OR a.image_relid = m.to_relid)`
		fmt.Fprintf(&script, `UPDATE %s AS a SET schema_name = m.to_s, table_name = m.to_t,
  image_schema = CASE WHEN %s THEN NULL ELSE a.image_schema END,
  image_table = CASE WHEN %s THEN NULL ELSE a.image_table END,
  image_relid = CASE WHEN %s THEN NULL ELSE a.image_relid END
FROM (VALUES %s) AS m(from_s, from_t, to_s, to_t, to_relid) WHERE a.schema_name = m.from_s AND a.table_name = m.from_t;
`, v.Table, own, own, own, strings.Join(values, ", "))
		if progress {
			fmt.Fprintf(&script, "UPDATE %s AS p SET filed_schema = m.to_s, filed_table = m.to_t FROM (VALUES %s) AS m(from_s, from_t, to_s, to_t, to_relid) WHERE p.filed_schema = m.from_s AND p.filed_table = m.from_t;\n",
				v.Snapshot, strings.Join(values, ", "))
		}
	}

	var snapshots, incremental []tableName
	for _, t := range s.tables {
		created := 0
		for _, trig := range wantedTriggers(t) {
			if marker, ok := existing[t.quoted()+" "+trig]; ok {
				// The connector's own trigger that the ledger does not list
				// (its table was renamed to this name): list it again, so a
				// later reconfiguration or deletion finds it.
				if r := triggerRes(db, t, trig); isMarked(marker, n.marker) && !slices.Contains(before, r) {
					if err := own(r); err != nil {
						return err
					}
				}
				continue
			}
			if err := own(triggerRes(db, t, trig)); err != nil {
				return err
			}
			if err := createTrigger(t, trig); err != nil {
				return err
			}
			created++
		}
		// A table none of whose capture triggers existed (none of the
		// connector's triggers was on it, of either kind) is captured from
		// now on: its current rows go first (docs/decisions/0070).
		if _, had := relidOf[t]; (s.snapshot || s.incremental) && !had && created == len(wantedTriggers(t)) {
			tv := v
			tv.Captured = t.quoted()
			tv.CapturedSchemaLiteral, tv.CapturedNameLiteral = quoteLiteral(t.Schema), quoteLiteral(t.Name)
			tv.CapturedLiteral = quoteLiteral(t.quoted())
			if s.incremental {
				// Measured now, under the triggers' lock; the tasks copy
				// after the commit (docs/decisions/0073).
				if err := add("0008_snapshot_progress.up.sql", "start", tv); err != nil {
					return err
				}
				incremental = append(incremental, t)
			} else {
				if err := add("0007_initial_snapshot.up.sql", "", tv); err != nil {
					return err
				}
				snapshots = append(snapshots, t)
			}
		}
	}
	if progress {
		// Progress of tables no longer captured under that name, or of a
		// relation no longer theirs (renamed away, a partition detached,
		// a new table under the old name), goes: the tasks copy only what
		// belongs to a configured table.
		var keep []string
		for _, t := range s.tables {
			keep = append(keep, fmt.Sprintf("(%s, %s)", quoteLiteral(t.Schema), quoteLiteral(t.Name)))
		}
		fmt.Fprintf(&script, `DELETE FROM %s AS p WHERE NOT EXISTS (SELECT 1 FROM (VALUES %s) AS c(s, t)
  WHERE p.filed_schema = c.s AND p.filed_table = c.t
    AND p.relid IN (SELECT pt.relid FROM pg_catalog.pg_partition_tree(pg_catalog.format('%%I.%%I', c.s, c.t)::pg_catalog.regclass) pt WHERE pt.isleaf
                    UNION SELECT pg_catalog.format('%%I.%%I', c.s, c.t)::pg_catalog.regclass::pg_catalog.oid));
`, v.Snapshot, strings.Join(keep, ", "))
	}
	// The commit-order trigger last: creating or dropping it locks the
	// audit table, and a capturing writer locks its table first and the
	// audit table second. Locking them in the other order would make the
	// writer a deadlock victim while Start waits for a captured table.
	orderRemoved, err := provisionOrder(s, n, v, db, existing, orderExists, orderMarker, before, own, add)
	if err != nil {
		return err
	}
	removed = append(removed, orderRemoved...)

	if script.Len() > 0 {
		if _, err := tx.Exec(ctx, script.String()); err != nil {
			// The initial snapshot reads with row security off
			// (0007_initial_snapshot.up.sql): a table whose policies apply
			// to its owner fails it rather than lose rows.
			var pgErr *pgconn.PgError
			if ctx.Err() != nil && len(snapshots) > 0 {
				return fmt.Errorf("provisioning the audit objects of connector %q: the Start was cancelled (a stop, restart, config change or deletion of the connector, or the worker shutting down) while the initial snapshot (%s=%s) copied %d table(s); everything was rolled back, and the next Start copies again: %w",
					s.name, KeySnapshotMode, snapshotInitial, len(snapshots), err)
			}
			if errors.As(err, &pgErr) && pgErr.Code == "57014" && len(snapshots) > 0 && strings.Contains(pgErr.Message, "statement timeout") {
				return fmt.Errorf("provisioning the audit objects of connector %q: %w; the initial snapshot (%s=%s) of %d table(s) copies their rows in this transaction and took longer than the role's statement_timeout: raise it for the connector's role (ALTER ROLE ... SET statement_timeout), or set %s=%s",
					s.name, err, KeySnapshotMode, snapshotInitial, len(snapshots), KeySnapshotMode, snapshotNever)
			}
			if errors.As(err, &pgErr) && pgErr.Code == "42501" && strings.Contains(pgErr.Message, "row-level security") {
				return fmt.Errorf("provisioning the audit objects of connector %q: %w; the initial snapshot (%s=%s) would miss the rows the table's policies hide from the role (FORCE ROW LEVEL SECURITY): give the role BYPASSRLS, or ALTER TABLE ... NO FORCE ROW LEVEL SECURITY, or set %s=%s",
					s.name, err, KeySnapshotMode, snapshotInitial, KeySnapshotMode, snapshotNever)
			}
			return fmt.Errorf("provisioning the audit objects of connector %q: %w", s.name, err)
		}
	}
	// EXECUTE on the connector's functions, now that they exist (a grant by
	// ALTER DEFAULT PRIVILEGES came with their creation): nobody but their
	// owner, and for the row-level one the owners of captured partitioned
	// tables, who need it to add partitions.
	for _, fn := range []struct {
		quoted string
		ours   bool
		owners bool
	}{
		{v.Function + "()", makeFunction, false},
		{v.RowFunction + "()", makeRowFunction, true},
		{v.Order + "()", s.commitOrder, false},
	} {
		if !fn.ours {
			continue
		}
		var owners []tableName
		if fn.owners {
			owners = s.tables
		}
		grants, err := functionGrants(ctx, tx, fn.quoted, owners, rowLevel)
		if err != nil {
			return err
		}
		if grants != "" {
			if _, err := tx.Exec(ctx, grants); err != nil {
				return fmt.Errorf("provisioning: setting who may execute %s: %w", fn.quoted, err)
			}
		}
	}
	// From here on a failure may have committed (an ambiguous COMMIT):
	// keep the entries; one whose object does not exist is harmless.
	committed = true
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("provisioning: commit: %w", err)
	}
	for _, r := range removed {
		if err := h.Ledger.Release(ctx, r); err != nil {
			return fmt.Errorf("releasing %v from the ledger: %w", r, err)
		}
		h.Logger.Info("released an object the configuration no longer needs (dropped unless someone had replaced it)", "resource", r.String())
	}
	for _, t := range snapshots {
		h.Logger.Info("initial snapshot: the table's current rows were copied into the audit table and go out first, as 'r' records", "table", t.String())
	}
	for _, t := range incremental {
		h.Logger.Info("incremental snapshot: the tasks copy the table's current rows, a few pages at a time, and send them as 'r' records", "table", t.String())
	}
	h.Logger.Info("provisioned", "audit_table", v.Table, "tables", len(s.tables), "created", len(newly))
	return nil
}

// addImageColumnsSQL is the ALTER TABLE action that brings an audit table
// made before decisions 0048 and 0049 up to date.
const addImageColumnsSQL = `ADD COLUMN IF NOT EXISTS image_schema text, ADD COLUMN IF NOT EXISTS image_table text, ADD COLUMN IF NOT EXISTS image_relid oid`

// addImageColumns adds image_schema, image_table and image_relid to an audit table made
// before row-level capture (0048), in a transaction of its own: the ALTER
// takes an ACCESS EXCLUSIVE lock on the audit table, which every capturing
// writer inserts into, so it must not be held through provisioning. A
// short lock_timeout keeps writers from queueing behind it for long when a
// long transaction holds the table; Start then fails and is retried.
func addImageColumns(ctx context.Context, conn *pgx.Conn, auditTable string) error {
	var missing bool
	if err := conn.QueryRow(ctx, `
SELECT pg_catalog.to_regclass($1) IS NOT NULL AND (
  SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass($1)
  AND attname IN ('image_schema', 'image_table', 'image_relid') AND NOT attisdropped) < 3
  -- a table of the layout before binary images is refused later, unchanged
  AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass($1) AND attname = 'changes' AND NOT attisdropped)`, auditTable).Scan(&missing); err != nil {
		return fmt.Errorf("provisioning: inspecting the audit table %s: %w", auditTable, err)
	}
	if !missing {
		return nil
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("provisioning: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'; ALTER TABLE `+auditTable+` `+addImageColumnsSQL); err != nil {
		return fmt.Errorf("adding columns to the audit table %s (an upgrade; it needs a moment's exclusive lock, which transactions writing the captured tables held; nothing was changed and Start is retried): %w", auditTable, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("adding columns to the audit table %s: commit: %w", auditTable, err)
	}
	return nil
}

// warnOwnAfterTriggers logs the captured tables that statement-level
// triggers capture and that have AFTER INSERT, UPDATE or DELETE triggers of
// their own. Such a trigger that writes its table again runs a statement
// whose capture fires before the outer statement's, so the row's changes
// would leave out of order; row-level capture fires first among a table's
// row triggers and keeps them in order (docs/pgaudit.md, "Order").
func warnOwnAfterTriggers(ctx context.Context, tx pgx.Tx, h *connect.Host, s settings, rowLevel map[string]bool) error {
	var stmt []tableName
	for _, t := range s.tables {
		if !rowLevel[t.quoted()] {
			stmt = append(stmt, t)
		}
	}
	if len(stmt) == 0 {
		return nil
	}
	schemas, tables := splitNames(stmt)
	rows, err := tx.Query(ctx, `
SELECT t.s, t.n, array_agg(tg.tgname::text ORDER BY tg.tgname)
FROM unnest($1::text[], $2::text[]) AS t(s, n)
JOIN pg_catalog.pg_namespace ns ON ns.nspname = t.s
JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = t.n
JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = c.oid
WHERE NOT tg.tgisinternal
  AND tg.tgtype::int & 66 = 0   -- neither BEFORE (2) nor INSTEAD OF (64)
  AND tg.tgtype::int & 28 <> 0  -- INSERT (4), DELETE (8) or UPDATE (16)
  AND NOT starts_with(coalesce(pg_catalog.obj_description(tg.tgfoid, 'pg_proc'), ''), $3)
GROUP BY 1, 2 ORDER BY 1, 2`, schemas, tables, markerPrefix)
	if err != nil {
		return fmt.Errorf("inspecting the captured tables' own triggers: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t tableName
		var names []string
		if err := rows.Scan(&t.Schema, &t.Name, &names); err != nil {
			return fmt.Errorf("inspecting the captured tables' own triggers: %w", err)
		}
		h.Logger.Warn("a captured table has AFTER triggers of its own: if they write to the table again, its changes can leave out of order under capture.level=statement; capture.level=row keeps them in order",
			"table", t.String(), "triggers", names)
	}
	return rows.Err()
}

// isMarked reports whether an object's comment m (nil: none) is marker.
func isMarked(m *string, marker string) bool { return m != nil && *m == marker }

// resourceDB is the database a ledger entry names.
func resourceDB(r connect.Resource) string {
	if r.Kind == KindSchema {
		return r.Location
	}
	// parseQualified, not a cut at the first `/"`: a database name may
	// contain that too.
	if db, _, err := parseQualified(r.Location); err == nil {
		return db
	}
	db, _, _ := strings.Cut(r.Location, `/"`)
	return db
}

// rehomeDatabase deals with ledger entries that name another database than
// the one postgres.url reaches. When that database holds the connector's
// audit table in audit.schema, it is the same database under a new name
// (renamed, or restored under another): the entries are recorded again
// under the new name, so deletion and reconfiguration find them. Otherwise
// postgres.url points elsewhere, and the objects in the other database
// would go on capturing into an audit table no task reads: refuse. It
// returns before with the entries renamed.
func rehomeDatabase(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, s settings, n names, h *connect.Host, before []connect.Resource) ([]connect.Resource, error) {
	var db string
	if err := q.QueryRow(ctx, `SELECT current_database()::text`).Scan(&db); err != nil {
		return nil, fmt.Errorf("provisioning: inspecting the database: %w", err)
	}
	dbs := map[string]bool{}
	for _, r := range before {
		dbs[resourceDB(r)] = true
	}
	var others []string
	for d := range dbs {
		if d != db {
			others = append(others, d)
		}
	}
	if len(others) == 0 {
		return before, nil
	}
	slices.Sort(others)
	other := others[0]
	// Entries under both names are a rename recorded in part (Start
	// stopped halfway through the loop below): finish it.
	renamed := false
	if len(others) == 1 {
		var err error
		if renamed, err = databaseRenamed(ctx, q, other, s.auditSchema, n); err != nil {
			return nil, err
		}
	}
	if !renamed {
		return nil, fmt.Errorf("%s: the connector's objects live in database %q, not %q (nothing was changed): point %s back at %q (delete the connector from there to move it)", KeyURL, other, db, KeyURL, other)
	}
	out := make([]connect.Resource, 0, len(before))
	for _, r := range before {
		rdb := resourceDB(r)
		if rdb == db {
			out = append(out, r)
			continue
		}
		moved := r
		moved.Location = db + strings.TrimPrefix(r.Location, rdb)
		if err := h.Ledger.Own(ctx, moved); err != nil {
			return nil, fmt.Errorf("recording %v in the ledger: %w", moved, err)
		}
		if err := h.Ledger.Release(ctx, r); err != nil {
			return nil, fmt.Errorf("releasing %v from the ledger: %w", r, err)
		}
		out = append(out, moved)
	}
	h.Logger.Info("the database was renamed or restored under another name: the ledger now names it", "from", other, "to", db)
	return out, nil
}

// minServerVersion is the oldest PostgreSQL pgaudit runs on: tasks read
// around the ids in flight with int8multirange (14).
const minServerVersion = 140000

// checkServerVersion refuses a server older than minServerVersion.
func checkServerVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var num int
	var version string
	if err := q.QueryRow(ctx, `SELECT pg_catalog.current_setting('server_version_num')::int, pg_catalog.current_setting('server_version')`).Scan(&num, &version); err != nil {
		return fmt.Errorf("reading the server version: %w", err)
	}
	return serverVersionProblem(num, version)
}

func serverVersionProblem(num int, version string) error {
	if num < minServerVersion {
		return fmt.Errorf("the server runs PostgreSQL %s; pgaudit needs %d or later", version, minServerVersion/10000)
	}
	return nil
}

// databaseRenamed reports whether the objects a ledger records under
// database old are those of the current database, renamed (or restored
// under another name) since: old no longer exists on this server, and the
// connector's marked audit table is here. A copy whose original still
// exists is not taken for it.
func databaseRenamed(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, old, auditSchema string, n names) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1)
   AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
               WHERE ns.nspname = $2 AND c.relname = $3 AND obj_description(c.oid, 'pg_class') = $4::text)`,
		old, auditSchema, n.table, n.marker).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("checking whether database %q was renamed: %w", old, err)
	}
	return ok, nil
}

// checkAuditSchemaMove reports, as a problem of audit.schema, a
// configuration whose audit.schema differs from the one the capture
// triggers on its tables write to. Provisioning
// keeps existing triggers, which go on calling the function they were
// created with: after such a move they would fill the old audit table,
// which no task reads. The catalog, not the ledger, is asked: the triggers
// are what matters, also when a deletion with cleanup.on.delete=false left
// them behind, and a renamed or restored database does not disturb it.
func checkAuditSchemaMove(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, s settings, n names) (string, error) {
	trigNames := []string{n.rowTrigger}
	for _, e := range triggerEvents {
		trigNames = append(trigNames, n.trigger(e))
	}
	schemas, tables := splitNames(s.tables)
	rows, err := q.Query(ctx, `
SELECT DISTINCT fns.nspname::text
FROM unnest($1::text[], $2::text[]) AS x(s, t)
JOIN pg_catalog.pg_namespace ns ON ns.nspname = x.s
JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = x.t
JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = c.oid AND tg.tgname = ANY($3::text[])
JOIN pg_catalog.pg_proc p ON p.oid = tg.tgfoid
JOIN pg_catalog.pg_namespace fns ON fns.oid = p.pronamespace
WHERE p.proname = ANY($4::text[]) AND fns.nspname <> $5 AND obj_description(p.oid, 'pg_proc') = $6::text
ORDER BY 1`, schemas, tables, trigNames, []string{n.function, n.rowFunction}, s.auditSchema, n.marker)
	if err != nil {
		return "", fmt.Errorf("inspecting the capture triggers: %w", err)
	}
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("inspecting the capture triggers: %w", err)
	}
	if len(others) == 0 {
		return "", nil
	}
	old := pgx.Identifier{others[0], n.function}.Sanitize() + "()"
	oldRow := pgx.Identifier{others[0], n.rowFunction}.Sanitize() + "()"
	return fmt.Sprintf("the connector's capture triggers write to the audit table in schema %q, not %q (nothing was changed): set %s back to %q. To move: delete the connector with %s=true (its undelivered changes are dropped with the old audit table) and create it again; objects left by a deletion with %s=false are no longer the connector's: drop them first (DROP FUNCTION IF EXISTS %s CASCADE; DROP FUNCTION IF EXISTS %s CASCADE drops the capture triggers with them)",
		others[0], s.auditSchema, KeyAuditSchema, others[0], KeyCleanupOnDelete, KeyCleanupOnDelete, old, oldRow), nil
}

// provisionOrder installs the commit-order function and its trigger on the
// audit table under capture.order = commit, and drops them (if still ours)
// under statement, returning the ledger entries to release once that has
// committed. Under commit an object of either name that is not the
// connector's is an error: the trigger would run someone else's code in
// every capturing commit.
func provisionOrder(s settings, n names, v sqlVars, db string, existing map[string]*string,
	fnExists bool, fnMarker *string, before []connect.Resource,
	own func(connect.Resource) error, add func(file, block string, v sqlVars) error) (removed []connect.Resource, err error) {
	audit := tableName{s.auditSchema, n.table}
	fnRes, trigRes := functionRes(db, s.auditSchema, n.order), triggerRes(db, audit, n.order)
	fnOurs := isMarked(fnMarker, n.marker)
	trigMarker, trigExists := existing[audit.quoted()+" "+n.order]
	trigOurs := trigExists && isMarked(trigMarker, n.marker)
	tv := v
	tv.Trigger = pgx.Identifier{n.order}.Sanitize()
	if s.commitOrder {
		var foreign []string
		if fnExists && !fnOurs {
			foreign = append(foreign, "function "+v.Order+"()")
		}
		if trigExists && !trigOurs {
			foreign = append(foreign, "trigger "+tv.Trigger+" on "+v.Table)
		}
		if len(foreign) > 0 {
			return nil, fmt.Errorf("%s: cannot install commit order: %s exist(s) without this connector's marker (%s); drop or rename them, or use %s=%s",
				KeyCaptureOrder, strings.Join(foreign, " and "), n.marker, KeyCaptureOrder, orderStatement)
		}
		if !fnExists {
			if err := own(fnRes); err != nil {
				return nil, err
			}
		}
		body, err := render("0005_commit_order.body.sql", "", v)
		if err != nil {
			return nil, err
		}
		fv := v
		fv.Body = quoteLiteral(body)
		if err := add("0005_commit_order.up.sql", "", fv); err != nil {
			return nil, err
		}
		// A marked trigger the ledger no longer lists (a deletion with
		// cleanup.on.delete=false released it) is taken back, as the other
		// objects are (adopt in provision).
		if !trigExists || (trigOurs && !slices.Contains(before, trigRes)) {
			if err := own(trigRes); err != nil {
				return nil, err
			}
		}
		if !trigExists {
			if err := add("0005_commit_order.up.sql", "trigger", tv); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	// The trigger first: it depends on the function. Objects someone
	// replaced stay, and are released all the same: they are theirs now.
	if trigOurs {
		if err := add("0005_commit_order.down.sql", "trigger", tv); err != nil {
			return nil, err
		}
	}
	if fnOurs {
		if err := add("0005_commit_order.down.sql", "function", v); err != nil {
			return nil, err
		}
	}
	for _, r := range []connect.Resource{trigRes, fnRes} {
		if slices.Contains(before, r) {
			removed = append(removed, r)
		}
	}
	return removed, nil
}

// disabledTriggers lists, as ALTER TABLE statements that enable them, the
// triggers with one of the given names on the given tables that do not
// fire in ordinary sessions (ALTER TABLE ... DISABLE TRIGGER, pg_restore
// --disable-triggers, ENABLE REPLICA TRIGGER): existing triggers are kept
// as they are, and such a one captures nothing.
func disabledTriggers(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, trigNames []string, tables []tableName) ([]string, error) {
	schemas, names := splitNames(tables)
	rows, err := q.Query(ctx, `
SELECT DISTINCT pns.nspname::text, pc.relname::text, tg.tgname::text
FROM unnest($1::text[], $2::text[]) AS x(s, t)
JOIN pg_catalog.pg_namespace ns ON ns.nspname = x.s
JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = x.t
-- the table and, when partitioned, its partitions: a clone of its row
-- trigger can be disabled on one partition
CROSS JOIN LATERAL (SELECT c.oid UNION SELECT pt.relid FROM pg_catalog.pg_partition_tree(c.oid) AS pt) AS m(relid)
JOIN pg_catalog.pg_class pc ON pc.oid = m.relid
JOIN pg_catalog.pg_namespace pns ON pns.oid = pc.relnamespace
JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = m.relid AND tg.tgname = ANY($3::text[])
WHERE tg.tgenabled IN ('D', 'R') -- 'R': fires only in replica sessions
ORDER BY 1, 2, 3`, schemas, names, trigNames)
	if err != nil {
		return nil, fmt.Errorf("checking whether the capture triggers are enabled: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t tableName
		var trig string
		if err := rows.Scan(&t.Schema, &t.Name, &trig); err != nil {
			return nil, fmt.Errorf("checking whether the capture triggers are enabled: %w", err)
		}
		out = append(out, fmt.Sprintf("ALTER TABLE %s ENABLE TRIGGER %s", t.quoted(), pgx.Identifier{trig}.Sanitize()))
	}
	return out, rows.Err()
}

// callingTrigger is a trigger, the table it is on and its arguments.
type callingTrigger struct {
	table       tableName
	trigger     string
	args        []string
	owned       bool // the current role may drop it (owns the table)
	partitioned bool // the table is partitioned
	relid       uint32
}

// triggersCalling lists the triggers that call function fn (quoted, with
// its "()"), except those on the tables in skip (quoted names) and the
// clones PostgreSQL keeps of a partitioned table's row trigger on its
// partitions (they cannot be dropped on their own, and go with it).
func triggersCalling(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, fn string, skip map[string]bool) ([]callingTrigger, error) {
	rows, err := q.Query(ctx, `
SELECT ns.nspname::text, c.relname::text, tg.tgname::text, tg.tgargs, pg_catalog.pg_has_role(c.relowner, 'USAGE'), c.relkind = 'p', c.oid
FROM pg_catalog.pg_trigger tg
JOIN pg_catalog.pg_class c ON c.oid = tg.tgrelid
JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
WHERE NOT tg.tgisinternal AND tg.tgfoid = pg_catalog.to_regprocedure($1)
  AND tg.tgparentid = 0 -- clones on partitions go with their parent trigger
ORDER BY 1, 2, 3`, fn)
	if err != nil {
		return nil, fmt.Errorf("listing the triggers that call %s: %w", fn, err)
	}
	defer rows.Close()
	var out []callingTrigger
	for rows.Next() {
		var ct callingTrigger
		var args []byte
		if err := rows.Scan(&ct.table.Schema, &ct.table.Name, &ct.trigger, &args, &ct.owned, &ct.partitioned, &ct.relid); err != nil {
			return nil, fmt.Errorf("listing the triggers that call %s: %w", fn, err)
		}
		ct.args = triggerArgs(args)
		if !skip[ct.table.quoted()] {
			out = append(out, ct)
		}
	}
	return out, rows.Err()
}

// functionGrants returns the GRANT and REVOKE statements that leave
// EXECUTE on function fn (quoted, with "()"; it must exist) with its owner
// and exactly the roles that own a partitioned table in the partition
// trees of the row-level captured tables among tables: whoever creates or
// attaches a partition there needs it, because PostgreSQL copies the row
// trigger onto the partition, and only a partitioned table's owner may.
// Anyone else with EXECUTE (and USAGE on the audit schema) could hang the
// function on a table of their own and feed the connector changes. Grants
// made WITH GRANT OPTION are revoked with what was granted from them.
func functionGrants(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, fn string, tables []tableName, rowLevel map[string]bool) (string, error) {
	var rl []tableName
	for _, t := range tables {
		if rowLevel[t.quoted()] {
			rl = append(rl, t)
		}
	}
	schemas, names := splitNames(rl)
	rows, err := q.Query(ctx, `
SELECT DISTINCT pg_catalog.pg_get_userbyid(pc.relowner)::text
FROM unnest($1::text[], $2::text[]) AS x(s, t)
JOIN pg_catalog.pg_namespace ns ON ns.nspname = x.s
JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = x.t
CROSS JOIN LATERAL pg_catalog.pg_partition_tree(c.oid) AS pt
JOIN pg_catalog.pg_class pc ON pc.oid = pt.relid
-- the function's owner may execute it anyway; it is this role when the
-- function is still to be made
WHERE pc.relkind = 'p' AND pc.relowner <> coalesce((SELECT p.proowner FROM pg_catalog.pg_proc p WHERE p.oid = pg_catalog.to_regprocedure($3)),
                                                   (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user))
ORDER BY 1`, schemas, names, fn)
	if err != nil {
		return "", fmt.Errorf("listing the owners of the captured partitioned tables: %w", err)
	}
	want, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("listing the owners of the captured partitioned tables: %w", err)
	}
	rows, err = q.Query(ctx, `
SELECT CASE WHEN a.grantee = 0 THEN '' ELSE pg_catalog.pg_get_userbyid(a.grantee)::text END, pg_catalog.bool_or(a.is_grantable)
FROM pg_catalog.pg_proc p CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) AS a
WHERE p.oid = pg_catalog.to_regprocedure($1) AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE'
GROUP BY 1 ORDER BY 1`, fn)
	if err != nil {
		return "", fmt.Errorf("listing who may execute %s: %w", fn, err)
	}
	type grant struct {
		grantee   string // "" for PUBLIC
		grantable bool
	}
	have, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (grant, error) {
		var g grant
		err := r.Scan(&g.grantee, &g.grantable)
		return g, err
	})
	if err != nil {
		return "", fmt.Errorf("listing who may execute %s: %w", fn, err)
	}
	// Grant options first (what their holders granted goes with them),
	// then whoever should not have EXECUTE (CASCADE may take a wanted
	// role's EXECUTE along, when it came through them), then EXECUTE for
	// every wanted role, whether it had it or not.
	var b strings.Builder
	for _, g := range have {
		if g.grantable && slices.Contains(want, g.grantee) {
			fmt.Fprintf(&b, "REVOKE GRANT OPTION FOR EXECUTE ON FUNCTION %s FROM %s CASCADE;\n", fn, pgx.Identifier{g.grantee}.Sanitize())
		}
	}
	for _, g := range have {
		if !slices.Contains(want, g.grantee) {
			grantee := "PUBLIC"
			if g.grantee != "" {
				grantee = pgx.Identifier{g.grantee}.Sanitize()
			}
			fmt.Fprintf(&b, "REVOKE EXECUTE ON FUNCTION %s FROM %s CASCADE;\n", fn, grantee)
		}
	}
	for _, r := range want {
		fmt.Fprintf(&b, "GRANT EXECUTE ON FUNCTION %s TO %s;\n", fn, pgx.Identifier{r}.Sanitize())
	}
	return b.String(), nil
}

// triggerArgs splits pg_trigger.tgargs, which holds each argument followed
// by a NUL byte.
func triggerArgs(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// triggerMarkerSQL is a trigger's ownership marker: marker itself when the
// trigger calls a function carrying it (whatever the trigger's own comment
// says, it cannot outlive that function, which deletion drops), else the
// trigger's comment. tg is the pg_trigger row, $1 the marker.
const triggerMarkerSQL = `CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.oid = tg.tgfoid AND obj_description(p.oid, 'pg_proc') = $1::text)
            THEN $1::text ELSE obj_description(tg.oid, 'pg_trigger') END`

// existingTriggers maps "<quoted table> <trigger>" of every trigger with
// one of the given names to its ownership marker (triggerMarkerSQL; nil
// without one). Clones of a partitioned table's trigger on its partitions
// are not listed: they are not the partition's own.
func existingTriggers(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, trigNames []string, marker string) (map[string]*string, error) {
	rows, err := q.Query(ctx, `
SELECT ns.nspname::text, c.relname::text, tg.tgname::text, `+triggerMarkerSQL+`
FROM pg_catalog.pg_trigger tg
JOIN pg_catalog.pg_class c ON c.oid = tg.tgrelid
JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
WHERE NOT tg.tgisinternal AND tg.tgname = ANY($2::text[]) AND tg.tgparentid = 0`, marker, trigNames)
	if err != nil {
		return nil, fmt.Errorf("listing existing triggers: %w", err)
	}
	out := map[string]*string{}
	for rows.Next() {
		var s, t, g string
		var comment *string
		if err := rows.Scan(&s, &t, &g, &comment); err != nil {
			rows.Close()
			return nil, err
		}
		out[tableName{s, t}.quoted()+" "+g] = comment
	}
	rows.Close()
	return out, rows.Err()
}

// dropAdvice says what to do about a drop PostgreSQL refused for a reason
// only the user can remove; nothing was dropped (one transaction), and
// the deletion is retried.
func dropAdvice(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "2BP01": // dependent_objects_still_exist
		return fmt.Sprintf(" (nothing was dropped: objects the connector did not create depend on its objects: %s; drop them or remove the dependency, then retry the deletion)", strings.ReplaceAll(pgErr.Detail, "\n", "; "))
	case "42501": // insufficient_privilege
		return fmt.Sprintf(" (nothing was dropped: the role of %s may not drop them, for example because a captured table has another owner now; point %s at a role that may, or give ownership back, then retry the deletion)", KeyURL, KeyURL)
	}
	return ""
}

// lockAdvice names what holds locks on relations (quoted names) when
// provisioning or a drop waited for them past lock_timeout: prepared
// transactions, which keep their locks until COMMIT PREPARED or ROLLBACK
// PREPARED however often the Start or deletion is retried (and which
// pg_stat_activity does not show), and sessions whose transaction is older
// than the wait (a forgotten "idle in transaction" one never ends). conn
// must be out of the failed transaction. Best effort: "" when none is
// found (or the lookup fails); else " (<prefix>...; then <retry>)".
func lockAdvice(ctx context.Context, conn *pgx.Conn, relations []string, prefix, retry string) string {
	rows, err := conn.Query(ctx, `
SELECT DISTINCT 'prepared transaction ' || pg_catalog.quote_literal(p.gid)
FROM pg_catalog.pg_prepared_xacts p
JOIN pg_catalog.pg_locks x ON x.locktype = 'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL
JOIN pg_catalog.pg_locks l ON l.virtualtransaction = x.virtualtransaction AND l.locktype = 'relation' AND l.pid IS NULL
WHERE p.database = pg_catalog.current_database()
  AND l.relation IN (SELECT pg_catalog.to_regclass(r) FROM pg_catalog.unnest($1::text[]) AS r)
UNION
SELECT DISTINCT 'session ' || a.pid || ' (' || coalesce(a.state, 'unknown state')
       || coalesce(', ' || pg_catalog.quote_literal(NULLIF(a.application_name, '')), '') || ')'
FROM pg_catalog.pg_locks l
JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()
  AND a.datname = pg_catalog.current_database() -- relation OIDs are per database
  AND l.relation IN (SELECT pg_catalog.to_regclass(r) FROM pg_catalog.unnest($1::text[]) AS r)
  -- older than takeLock's lock_timeout: not a writer that came since
  AND a.xact_start < pg_catalog.clock_timestamp() - interval '10 s'
ORDER BY 1`, relations)
	if err != nil {
		return ""
	}
	holders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(holders) == 0 {
		return ""
	}
	var do []string // ORDER BY lists prepared transactions before sessions
	if strings.HasPrefix(holders[0], "prepared") {
		do = append(do, "commit or roll back a prepared transaction with COMMIT PREPARED or ROLLBACK PREPARED (pg_prepared_xacts lists them)")
	}
	if strings.HasPrefix(holders[len(holders)-1], "session") {
		do = append(do, "let a session's transaction finish or end it (pg_terminate_backend)")
	}
	return fmt.Sprintf(" (%slocks on the connector's tables are held by %s: %s; then %s)",
		prefix, strings.Join(holders, ", "), strings.Join(do, ", "), retry)
}

// dropOwned drops, in one transaction, every ledger-listed object that still
// carries this connector's marker, then releases the entries. An object
// that is gone counts as dropped; one whose marker is not ours (someone
// replaced it) and a schema that still holds others' objects are kept and
// released, with a log line.
func dropOwned(ctx context.Context, conn *pgx.Conn, connector string, h *connect.Host, rs []connect.Resource) error {
	n := objectNames(connector)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := takeLock(ctx, tx); err != nil {
		return err
	}
	var db string
	if err := tx.QueryRow(ctx, `SELECT current_database()::text`).Scan(&db); err != nil {
		return err
	}
	slices.SortStableFunc(rs, func(a, b connect.Resource) int {
		return slices.Index(dropOrder, a.Kind) - slices.Index(dropOrder, b.Kind)
	})
	// Entries under another database name are this database's when it was
	// renamed since (a cleanup-only instance never provisioned, so nothing
	// recorded them under the new name).
	// The audit schema comes from the audit table's entry, under whichever
	// name: a rename recorded in part may have moved it already.
	var auditSchema string
	for _, r := range rs {
		if _, parts, err := parseQualified(r.Location); err == nil && r.Kind == KindTable && r.Name == n.table && len(parts) == 1 {
			auditSchema = parts[0]
		}
	}
	renamed := map[string]bool{}
	for _, r := range rs {
		rdb := resourceDB(r)
		if _, seen := renamed[rdb]; seen || rdb == db || auditSchema == "" {
			continue
		}
		ok, err := databaseRenamed(ctx, tx, rdb, auditSchema, n)
		if err != nil {
			return err
		}
		renamed[rdb] = ok
	}

	// Markers of everything listed, in one round trip per kind.
	type target struct {
		r      connect.Resource
		parts  []string
		exists bool
		ours   bool
	}
	var targets []*target
	var trigS, trigT, trigN []string
	for _, r := range rs {
		rdb, parts, err := parseQualified(r.Location)
		if r.Kind == KindSchema {
			rdb, parts, err = r.Location, []string{r.Name}, nil
		}
		if err != nil {
			return err
		}
		if rdb != db && !renamed[rdb] {
			return fmt.Errorf("%v lives in database %q but %s connects to %q: point %s at %q and delete again", r, rdb, KeyURL, db, KeyURL, rdb)
		}
		tg := &target{r: r, parts: parts}
		targets = append(targets, tg)
		if r.Kind == KindTrigger && len(parts) == 2 {
			trigS, trigT, trigN = append(trigS, parts[0]), append(trigT, parts[1]), append(trigN, r.Name)
		}
	}
	trigMarkers := map[string]*string{}
	if len(trigN) > 0 {
		rows, err := tx.Query(ctx, `
SELECT x.s, x.t, x.n, `+triggerMarkerSQL+`
FROM unnest($2::text[], $3::text[], $4::text[]) AS x(s, t, n)
JOIN pg_catalog.pg_namespace ns ON ns.nspname = x.s
JOIN pg_catalog.pg_class c ON c.relnamespace = ns.oid AND c.relname = x.t
JOIN pg_catalog.pg_trigger tg ON tg.tgrelid = c.oid AND tg.tgname = x.n
-- a clone of a partitioned table's trigger is not the ledger's entry: it
-- goes with its parent, and cannot be dropped alone
WHERE tg.tgparentid = 0`, n.marker, trigS, trigT, trigN)
		if err != nil {
			return fmt.Errorf("inspecting triggers: %w", err)
		}
		for rows.Next() {
			var s, t, nm string
			var m *string
			if err := rows.Scan(&s, &t, &nm, &m); err != nil {
				rows.Close()
				return err
			}
			trigMarkers[tableName{s, t}.quoted()+" "+nm] = m
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}

	// Triggers on the captured tables first, then the commit-order trigger
	// on the audit table, then the rest: a capturing writer locks its
	// table before the audit table, and so must the deletion, or the
	// writer can become a deadlock victim.
	var tableTriggers, auditTriggers, script strings.Builder
	var locked []string // the relations the drops lock, for lockAdvice
	dropTriggerOn := func(trigger string, table []string) {
		locked = append(locked, pgx.Identifier(table).Sanitize())
		b := &tableTriggers
		if len(table) == 2 && table[1] == n.table {
			b = &auditTriggers
		}
		fmt.Fprintf(b, "DROP TRIGGER IF EXISTS %s ON %s;\n", pgx.Identifier{trigger}.Sanitize(), pgx.Identifier(table).Sanitize())
	}
	var schemas []*target
	for _, tg := range targets {
		var marker *string
		switch tg.r.Kind {
		case KindTrigger:
			if len(tg.parts) != 2 {
				continue
			}
			m, ok := trigMarkers[pgx.Identifier(tg.parts).Sanitize()+" "+tg.r.Name]
			tg.exists, marker = ok, m
		case KindFunction:
			err = tx.QueryRow(ctx, `SELECT obj_description(p.oid, 'pg_proc') FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace ns ON ns.oid = p.pronamespace WHERE ns.nspname = $1 AND p.proname = $2 AND p.pronargs = 0`,
				tg.parts[0], strings.TrimSuffix(tg.r.Name, "()")).Scan(&marker)
		case KindTable, KindSequence:
			err = tx.QueryRow(ctx, `SELECT obj_description(c.oid, 'pg_class') FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1 AND c.relname = $2`,
				tg.parts[0], tg.r.Name).Scan(&marker)
		case KindSchema:
			err = tx.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace WHERE nspname = $1`,
				tg.r.Name).Scan(&marker)
		}
		if tg.r.Kind != KindTrigger {
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				err = nil
			case err != nil:
				return fmt.Errorf("inspecting %v: %w", tg.r, err)
			default:
				tg.exists = true
			}
		}
		tg.ours = isMarked(marker, n.marker) ||
			tg.r.Kind == KindSchema && marker != nil && strings.HasPrefix(*marker, markerPrefix) // shared, see provision
		if !tg.exists {
			continue
		}
		if !tg.ours {
			h.Logger.Warn("not dropping an object that no longer carries this connector's marker (someone replaced it)", "resource", tg.r.String())
			continue
		}
		switch tg.r.Kind {
		case KindTrigger:
			dropTriggerOn(tg.r.Name, tg.parts)
		case KindFunction:
			fn := pgx.Identifier{tg.parts[0], strings.TrimSuffix(tg.r.Name, "()")}.Sanitize() + "()"
			// Triggers that call it are the connector's, also those the
			// ledger names under an earlier table name (ALTER TABLE ...
			// RENAME): without them, dropping the function fails for good.
			stray, err := triggersCalling(ctx, tx, fn, nil)
			if err != nil {
				return err
			}
			for _, st := range stray {
				dropTriggerOn(st.trigger, []string{st.table.Schema, st.table.Name})
			}
			fmt.Fprintf(&script, "DROP FUNCTION IF EXISTS %s;\n", fn)
		case KindSequence:
			locked = append(locked, pgx.Identifier{tg.parts[0], tg.r.Name}.Sanitize())
			fmt.Fprintf(&script, "DROP SEQUENCE IF EXISTS %s;\n", pgx.Identifier{tg.parts[0], tg.r.Name}.Sanitize())
		case KindTable:
			locked = append(locked, pgx.Identifier{tg.parts[0], tg.r.Name}.Sanitize())
			fmt.Fprintf(&script, "DROP TABLE IF EXISTS %s;\n", pgx.Identifier{tg.parts[0], tg.r.Name}.Sanitize())
		case KindSchema:
			schemas = append(schemas, tg)
		}
	}
	if drops := tableTriggers.String() + auditTriggers.String() + script.String(); drops != "" {
		if _, err := tx.Exec(ctx, drops); err != nil {
			advice := dropAdvice(err)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_timeout
				// Out of the failed transaction to look at the locks.
				_ = tx.Rollback(context.WithoutCancel(ctx))
				advice = lockAdvice(ctx, conn, locked, "nothing was dropped: ", "retry the deletion")
			}
			return fmt.Errorf("dropping the owned objects%s: %w", advice, err)
		}
	}
	for _, tg := range schemas {
		// RESTRICT fails when the schema holds objects others own: keep it.
		if _, err := tx.Exec(ctx, "SAVEPOINT tidyconnect_schema"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fmt.Sprintf("DROP SCHEMA IF EXISTS %s RESTRICT", pgx.Identifier{tg.r.Name}.Sanitize()))
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "2BP01":
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT tidyconnect_schema"); err != nil {
				return err
			}
			h.Logger.Info("keeping the audit schema: it holds objects this connector does not own", "resource", tg.r.String())
		case errors.As(err, &pgErr) && pgErr.Code == "42501":
			// Not this role's to drop: an audit schema another pgaudit
			// connector's role made (shared, see provision), or one handed
			// to another owner since. Failing here would roll back the
			// drops above and leave the deletion incomplete for good.
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT tidyconnect_schema"); err != nil {
				return err
			}
			h.Logger.Warn("keeping the audit schema: this role does not own it, so it may not drop it", "resource", tg.r.String())
		case err != nil:
			return fmt.Errorf("dropping %v: %w", tg.r, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("dropping the owned objects: commit: %w", err)
	}
	for _, tg := range targets {
		if err := h.Ledger.Release(ctx, tg.r); err != nil {
			return fmt.Errorf("releasing %v from the ledger: %w", tg.r, err)
		}
	}
	h.Logger.Info("dropped the owned objects", "count", len(targets))
	return nil
}
