// Package pgaudit is the PostgreSQL audit-trigger source connector.
//
// Start provisions, in one transaction under an advisory lock, an audit
// table, a trigger function and statement-level capture triggers on every
// configured table; tasks read the audit table in id order, hand the changes
// to the runtime and delete exactly the rows Kafka acknowledged (the audit
// table is the durable queue). Stopped drops what the ledger lists, and only
// on deletion. See docs/pgaudit.md.
package pgaudit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/version"
)

// Class is the connector.class value selecting this plugin.
const Class = "pgaudit"

// Configuration keys (the public interface).
const (
	KeyURL             = "postgres.url"
	KeyTables          = "tables"
	KeyTopicPrefix     = "topic.prefix"
	KeyAuditSchema     = "audit.schema"
	KeyTasksMax        = "tasks.max"
	KeyPollMaxRecords  = "poll.max.records"
	KeyPollIntervalMS  = "poll.interval.ms"
	KeyCleanupOnDelete = "cleanup.on.delete"
	KeyCaptureOrder    = "capture.order"
	KeyCaptureLevel    = "capture.level"
	KeySnapshotMode    = "snapshot.mode"
	// KeyTombstonesOnDelete is Debezium's key of the same name.
	KeyTombstonesOnDelete = "tombstones.on.delete"
	// KeyMessageKeyColumns is Debezium's key of the same name.
	KeyMessageKeyColumns = "message.key.columns"
	// KeyColumnExcludeList is Debezium's key of the same name.
	KeyColumnExcludeList = "column.exclude.list"
	// KeyWakeupNotify: whether writers wake waiting tasks with a NOTIFY.
	KeyWakeupNotify = "wakeup.notify"
	// KeyCaptureMethod: triggers and an audit table, or logical decoding
	// through a publication and a replication slot (docs/decisions/0074).
	KeyCaptureMethod = "capture.method"

	// keyTaskTables is set by TaskConfigs: the tables of one task, quoted.
	keyTaskTables = "task.tables"
	// keyTaskCount is set by TaskConfigs: how many tasks the connector
	// runs, so a task can tell the wakeup rows of tasks that no longer
	// exist.
	keyTaskCount = "task.count"
	// keyTaskTableOIDs is set by TaskConfigs under capture.method=logical:
	// the relation OIDs of the tables (in their order) when the connector
	// started, so that a task started after a rename still knows which
	// table in the publication is which configured one.
	keyTaskTableOIDs = "task.table.oids"
)

// Plugin returns the pgaudit plugin.
func Plugin() connect.Plugin {
	return connect.Plugin{
		Class:        Class,
		Aliases:      []string{"io.tidyconnect.pgaudit.PgAuditSourceConnector", "PgAuditSourceConnector"},
		NewConnector: func() connect.Connector { return &Connector{} },
		NewTask:      func() connect.Task { return &Task{} },
	}
}

var topicPrefixRE = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// ConfigDef is pgaudit's configuration definition.
func ConfigDef() connect.ConfigDef {
	return connect.ConfigDef{
		{Name: KeyURL, Type: connect.TypeString, Required: true, Secret: true, Importance: connect.ImportanceHigh, Group: "Connection", Order: 1,
			DisplayName: "PostgreSQL URL", Doc: "libpq URL or key=value DSN of the database to capture; its password is masked everywhere."},
		{Name: KeyTables, Type: connect.TypeList, Required: true, Importance: connect.ImportanceHigh, Group: "Capture", Order: 2,
			DisplayName: "Tables", Doc: `Comma-separated schema.table names to capture; a bare table means public. Names are taken literally (no case folding); double-quote a part that contains '.', ',' or '"' (doubling inner quotes).`,
			Validate: func(v string) error { _, err := parseTables(v); return err }},
		{Name: KeyTopicPrefix, Type: connect.TypeString, Required: true, Importance: connect.ImportanceHigh, Group: "Capture", Order: 3,
			DisplayName: "Topic prefix", Doc: "Changes of schema.table go to topic <prefix>.<schema>.<table> (every byte Kafka does not allow becomes '_'; the name is cut at 249 bytes).",
			Validate: func(v string) error {
				if !topicPrefixRE.MatchString(v) || len(v) > 200 {
					return fmt.Errorf("use at most 200 characters of a-z, A-Z, 0-9, '.', '_' and '-'")
				}
				return nil
			}},
		{Name: KeyAuditSchema, Type: connect.TypeString, Default: "tidyconnect", Importance: connect.ImportanceMedium, Group: "Capture", Order: 4,
			DisplayName: "Audit schema", Doc: "Schema holding the connector's audit table, wake-up table (with its sequence) and trigger function; created (and then owned) if missing.",
			Validate: func(v string) error {
				switch {
				case len(v) > 63:
					return fmt.Errorf("a PostgreSQL identifier has at most 63 bytes")
				case strings.ContainsRune(v, 0):
					return fmt.Errorf("a PostgreSQL name cannot contain a NUL byte")
				case strings.TrimSpace(v) != v:
					// The value is the schema's name as it is, not SQL:
					// spaces would become part of it.
					return fmt.Errorf("has leading or trailing spaces, which would be part of the schema's name: remove them")
				case strings.HasPrefix(v, "pg_"):
					return fmt.Errorf("names starting with pg_ are reserved for PostgreSQL's system schemas: choose another schema")
				}
				return nil
			}},
		{Name: KeyTasksMax, Type: connect.TypeInt, Default: "1", Importance: connect.ImportanceMedium, Group: "Capture", Order: 5,
			DisplayName: "Max tasks", Doc: "Tables are spread over up to this many tasks.", Validate: positive},
		{Name: KeyPollMaxRecords, Type: connect.TypeInt, Default: "1000", Importance: connect.ImportanceLow, Group: "Capture", Order: 6,
			DisplayName: "Batch size", Doc: "At most this many changes per poll (one batch).", Validate: positive},
		{Name: KeyPollIntervalMS, Type: connect.TypeInt, Default: "1000", Importance: connect.ImportanceLow, Group: "Capture", Order: 7,
			DisplayName: "Poll interval (ms)", Doc: "Fallback poll interval; wake-ups come from LISTEN/NOTIFY.", Validate: positive},
		{Name: KeyCleanupOnDelete, Type: connect.TypeBoolean, Default: "true", Importance: connect.ImportanceMedium, Group: "Lifecycle", Order: 8,
			DisplayName: "Clean up on delete", Doc: "Drop the owned triggers, functions, audit and wake-up tables and (if owned and empty) schema when the connector is deleted; false keeps everything."},
		{Name: KeyCaptureOrder, Type: connect.TypeString, Default: orderCommit, Importance: connect.ImportanceMedium, Group: "Capture", Order: 9,
			DisplayName: "Capture order", Doc: "commit (the default): all changes leave in the order their transactions reached COMMIT, and transactions that depend on each other always in their order; a deferred trigger renumbers, at COMMIT, audit rows another transaction drew past (no lock: writers do not wait for each other). statement: the changes of one row leave in commit order (with exceptions), changes of different rows in the order their statements ran; nothing runs at COMMIT. See docs/pgaudit.md, Order.",
			Validate: oneOf(orderCommit, orderStatement)},
		{Name: KeyCaptureLevel, Type: connect.TypeString, Default: levelStatement, Importance: connect.ImportanceMedium, Group: "Capture", Order: 10,
			DisplayName: "Capture level", Doc: "statement: plain tables are captured by statement-level triggers, one call per statement, cheapest for statements that change many rows. row: by a row-level trigger, one call per changed row, cheapest for statements that change one row and several times dearer for bulk statements; needed for per-row order when a table's own AFTER triggers write it again. Partitioned tables and partitions are always captured row by row (see docs/pgaudit.md).",
			Validate: oneOf(levelStatement, levelRow)},
		{Name: KeySnapshotMode, Type: connect.TypeString, Default: snapshotNever, Importance: connect.ImportanceMedium, Group: "Capture", Order: 11,
			DisplayName: "Snapshot mode", Doc: "never: only changes made after a table's capture triggers were installed are sent. initial: when a Start installs a table's capture triggers (the first Start, or the one that added the table), the rows already in it are sent first, as 'r' records, consistently with the changes that follow; writers of that table wait while its rows are copied into the audit table. incremental: the same rows are sent as 'r' records too, but copied after the Start by the tasks, a few pages at a time in short transactions, between the changes: writers wait only for a chunk that holds a row they change; a row's 'r' may follow its changes, never carrying an older state than one sent before it (see docs/pgaudit.md).",
			Validate: oneOf(snapshotNever, snapshotInitial, snapshotIncremental)},
		{Name: KeyTombstonesOnDelete, Type: connect.TypeBoolean, Default: "false", Importance: connect.ImportanceMedium, Group: "Capture", Order: 12,
			DisplayName: "Tombstones on delete", Doc: "true: each delete of a row with a key (its primary key, or its message.key.columns) is followed by a tombstone, a record with the same key and a null value, so that log compaction of the topic can remove every record of the key (as Debezium's key of this name, whose default is true). false: one record per change only."},
		{Name: KeyMessageKeyColumns, Type: connect.TypeString, Importance: connect.ImportanceLow, Group: "Capture", Order: 13,
			DisplayName: "Message key columns", Doc: `The columns that make a table's record key instead of its primary key, or for a table without one (as Debezium's key of this name, with literal names instead of patterns): <table>:<column>[,<column>...], tables separated by ';', each table one of tables and named as there; double-quote a name that contains '.', ',', ';' or ':', or starts with '"' (as in tables). Their values may be null.`,
			Validate: func(v string) error { _, err := parseKeyColumns(v); return err }},
		{Name: KeyColumnExcludeList, Type: connect.TypeList, Importance: connect.ImportanceLow, Group: "Capture", Order: 14,
			DisplayName: "Excluded columns", Doc: `Columns left out of the records' before and after images (as Debezium's key of this name, with literal names instead of patterns): comma-separated schema.table.column (table.column means public), each table one of tables; double-quote a name that contains '.' or ',', or starts with '"' (as in tables). The record key still holds its columns.`,
			Validate: func(v string) error { _, err := parseExcludedColumns(v); return err }},
		{Name: KeyWakeupNotify, Type: connect.TypeBoolean, Default: "true", Importance: connect.ImportanceLow, Group: "Capture", Order: 15,
			DisplayName: "Wake-ups by NOTIFY", Doc: "true: a task that has drained the audit table asks writers for a NOTIFY, so it reads a change milliseconds after its COMMIT. false: tasks only poll, every poll.interval.ms, and no writer ever sends a NOTIFY; needed where writers of the captured tables use two-phase commit (PREPARE TRANSACTION fails in a transaction that sent a NOTIFY). Lower poll.interval.ms for latency."},
		{Name: KeyCaptureMethod, Type: connect.TypeString, Default: methodTrigger, Importance: connect.ImportanceHigh, Group: "Capture", Order: 16,
			DisplayName: "Capture method", Doc: "trigger (the default): capture triggers write each change into the connector's audit table, which its tasks read and empty; writers pay for the audit row in their transaction. logical: PostgreSQL's logical decoding (the pgoutput plugin) through a publication and a replication slot the connector creates and owns; writers pay nothing beyond the WAL, one task reads every table, and the server needs wal_level=logical and a role with REPLICATION. The slot keeps WAL from being removed while the connector is paused or stopped. Not with capture.order, capture.level, snapshot.mode other than never, wakeup.notify or audit.schema. See docs/pgaudit.md, Logical decoding.",
			Validate: oneOf(methodTrigger, methodLogical)},
	}
}

// oneOf accepts exactly one of values.
func oneOf(values ...string) func(string) error {
	return func(v string) error {
		if slices.Contains(values, v) {
			return nil
		}
		quoted := make([]string, len(values))
		for i, a := range values {
			quoted[i] = strconv.Quote(a)
		}
		return fmt.Errorf("must be %s or %s", strings.Join(quoted[:len(quoted)-1], ", "), quoted[len(quoted)-1])
	}
}

func positive(v string) error {
	var n int
	if _, err := fmt.Sscan(strings.TrimSpace(v), &n); err != nil || n < 1 {
		return fmt.Errorf("must be a positive integer")
	}
	return nil
}

// settings is a parsed, checked configuration.
type settings struct {
	name         string
	url          string
	tables       []tableName
	topicPrefix  string
	auditSchema  string
	tasksMax     int
	pollMax      int
	pollInterval int
	cleanup      bool
	// commitOrder: capture.order = commit (docs/decisions/0046).
	commitOrder bool
	// rowLevel: capture.level = row, row-level triggers on plain tables
	// too (docs/decisions/0048).
	rowLevel bool
	// snapshot: snapshot.mode = initial (docs/decisions/0070).
	snapshot bool
	// incremental: snapshot.mode = incremental, copied in chunks by the
	// tasks (docs/decisions/0073).
	incremental bool
	// tombstones: tombstones.on.delete, a null-value record after each
	// keyed delete.
	tombstones bool
	// keyColumns: message.key.columns, the record key's columns of the
	// tables listed there (in place of the primary key).
	keyColumns    map[tableName][]string
	keyColumnsRaw string
	// excluded: column.exclude.list, per table the columns left out of
	// the images.
	excluded    map[tableName]map[string]bool
	excludedRaw string
	// notify: wakeup.notify, tasks LISTEN and ask writers for NOTIFYs
	// when idle (docs/decisions/0072).
	notify bool
	// logical: capture.method = logical, a publication and a replication
	// slot instead of triggers and an audit table (docs/decisions/0074).
	logical bool
}

// capture.order and capture.level values.
const (
	orderCommit    = "commit"
	orderStatement = "statement"
	levelStatement = "statement"
	levelRow       = "row"

	methodTrigger = "trigger"
	methodLogical = "logical"

	snapshotNever       = "never"
	snapshotInitial     = "initial"
	snapshotIncremental = "incremental"
)

// parseSettings checks cfg against ConfigDef and returns every problem,
// keyed by configuration key.
func parseSettings(name string, cfg connect.Config) (settings, map[string][]string) {
	def := ConfigDef()
	errs := def.Validate(cfg)
	raw := cfg
	cfg = def.WithDefaults(cfg)
	s := settings{name: name, url: cfg[KeyURL], topicPrefix: cfg[KeyTopicPrefix], auditSchema: cfg[KeyAuditSchema]}
	if name == "" {
		errs["name"] = append(errs["name"], "the connector name is missing")
	}
	// Present but blank: the definition's checks skip blank optional
	// values, and the default fills only absent keys.
	if v, ok := cfg[KeyAuditSchema]; ok && strings.TrimSpace(v) == "" {
		errs[KeyAuditSchema] = append(errs[KeyAuditSchema], "must not be blank (leave the key out for the default, tidyconnect)")
	}
	if v, ok := cfg[KeyCaptureOrder]; ok && strings.TrimSpace(v) == "" {
		errs[KeyCaptureOrder] = append(errs[KeyCaptureOrder], fmt.Sprintf("must not be blank (leave the key out for the default, %s)", orderCommit))
	}
	if v, ok := cfg[KeyCaptureLevel]; ok && strings.TrimSpace(v) == "" {
		errs[KeyCaptureLevel] = append(errs[KeyCaptureLevel], fmt.Sprintf("must not be blank (leave the key out for the default, %s)", levelStatement))
	}
	if v, ok := cfg[KeySnapshotMode]; ok && strings.TrimSpace(v) == "" {
		errs[KeySnapshotMode] = append(errs[KeySnapshotMode], fmt.Sprintf("must not be blank (leave the key out for the default, %s)", snapshotNever))
	}
	if len(errs[KeyTables]) == 0 {
		s.tables, _ = parseTables(cfg[KeyTables])
		// Two tables on one topic would mix their changes, and keys of
		// one could compact away the other's. Kafka also refuses a topic
		// whose name differs from an existing one only in '.' against '_'.
		byTopic := map[string]tableName{}
		for _, t := range s.tables {
			topic := topicName(s.topicPrefix, t)
			clash := strings.ReplaceAll(topic, ".", "_")
			if other, ok := byTopic[clash]; ok {
				errs[KeyTables] = append(errs[KeyTables], fmt.Sprintf("tables %s and %s would go to topics that Kafka takes for the same (%q: characters Kafka does not allow become '_', '.' and '_' collide, names are cut at 249 characters): capture one of them", other.quoted(), t.quoted(), topic))
				continue
			}
			byTopic[clash] = t
		}
	}
	if v, ok := cfg[KeyCaptureMethod]; ok && strings.TrimSpace(v) == "" {
		errs[KeyCaptureMethod] = append(errs[KeyCaptureMethod], fmt.Sprintf("must not be blank (leave the key out for the default, %s)", methodTrigger))
	}
	s.logical = cfg[KeyCaptureMethod] == methodLogical
	if s.logical {
		// Keys of the trigger method: set to anything but their defaults
		// (which the runtime may have filled in), they would be silently
		// ignored.
		for _, k := range []string{KeyCaptureOrder, KeyCaptureLevel, KeyWakeupNotify, KeyAuditSchema} {
			key, _ := def.Key(k)
			if v, set := raw[k]; set && !strings.EqualFold(strings.TrimSpace(v), key.Default) {
				errs[k] = append(errs[k], fmt.Sprintf("applies to %s=%s only: remove it (logical decoding sends every table's changes in commit order, from one task, with no audit objects)", KeyCaptureMethod, methodTrigger))
			}
		}
		if v := cfg[KeySnapshotMode]; v != snapshotNever && v != "" {
			errs[KeySnapshotMode] = append(errs[KeySnapshotMode], fmt.Sprintf("%s=%s sends only the changes made after the connector's replication slot was created: remove %s or use %s=%s", KeyCaptureMethod, methodLogical, KeySnapshotMode, KeyCaptureMethod, methodTrigger))
		}
	}
	s.commitOrder = cfg[KeyCaptureOrder] == orderCommit
	s.rowLevel = cfg[KeyCaptureLevel] == levelRow
	s.snapshot = cfg[KeySnapshotMode] == snapshotInitial
	s.incremental = cfg[KeySnapshotMode] == snapshotIncremental
	s.tombstones, _ = cfg.Bool(KeyTombstonesOnDelete, false)
	s.notify = true
	if v, err := cfg.Bool(KeyWakeupNotify, true); err == nil {
		s.notify = v
	}
	if len(errs[KeyColumnExcludeList]) == 0 {
		s.excluded, _ = parseExcludedColumns(cfg[KeyColumnExcludeList])
		s.excludedRaw = cfg[KeyColumnExcludeList]
		for _, t := range sortedTables(s.excluded) {
			if len(errs[KeyTables]) == 0 && !slices.Contains(s.tables, t) {
				errs[KeyColumnExcludeList] = append(errs[KeyColumnExcludeList], fmt.Sprintf("table %s is not one of %s: list it there, or remove its columns here", t.quoted(), KeyTables))
			}
		}
	}
	if len(errs[KeyMessageKeyColumns]) == 0 {
		s.keyColumns, _ = parseKeyColumns(cfg[KeyMessageKeyColumns])
		s.keyColumnsRaw = cfg[KeyMessageKeyColumns]
		for _, t := range sortedTables(s.keyColumns) {
			if len(errs[KeyTables]) == 0 && !slices.Contains(s.tables, t) {
				errs[KeyMessageKeyColumns] = append(errs[KeyMessageKeyColumns], fmt.Sprintf("table %s is not one of %s: list it there, or remove it here", t.quoted(), KeyTables))
			}
		}
	}
	s.tasksMax, _ = cfg.Int(KeyTasksMax, 1)
	s.pollMax, _ = cfg.Int(KeyPollMaxRecords, 1000)
	s.pollInterval, _ = cfg.Int(KeyPollIntervalMS, 1000)
	// An unreadable value means the default: dropping what the connector
	// owns, never silently keeping it.
	s.cleanup = true
	if v, err := cfg.Bool(KeyCleanupOnDelete, true); err == nil {
		s.cleanup = v
	}
	for k, v := range errs {
		if len(v) == 0 {
			delete(errs, k)
		}
	}
	return s, errs
}

// configError turns per-key messages into one error naming every bad key.
func configError(errs map[string][]string) error {
	if len(errs) == 0 {
		return nil
	}
	var parts []string
	for _, k := range sortedKeys(errs) {
		parts = append(parts, k+": "+strings.Join(errs[k], "; "))
	}
	return fmt.Errorf("invalid pgaudit configuration (fix these keys): %s", strings.Join(parts, " | "))
}

// markerPrefix begins the comment on every object a pgaudit connector
// made; the connector's name follows.
const markerPrefix = "tidyconnect:"

// names are the identifiers of one connector's objects, derived from the
// connector name.
type names struct {
	base     string // sanitized prefix + hash, <= 48 bytes
	table    string // audit table
	wakeup   string // which tasks wait for a NOTIFY
	waiters  string // sequence: how many tasks wait (owned by wakeup)
	function string
	// rowFunction is called by the row-level trigger rowTrigger on
	// partitioned tables and partitions (docs/decisions/0048).
	rowFunction, rowTrigger string
	order                   string // commit-order function and its trigger on the audit table
	snapshot                string // incremental snapshots' progress table
	channel                 string // LISTEN/NOTIFY channel
	marker                  string // comment marking owned objects
}

// maxBase leaves room for the longest suffix ("_capture_row", the
// "tidyconnect_" prefix of the channel) within PostgreSQL's 63-byte
// identifiers.
const maxBase = 48

// objectNames derives collision-free names: the sanitized connector name,
// truncated, plus a hash of the full name, so names that differ only after
// the truncation point (or only in characters the sanitizing replaced) still
// differ.
func objectNames(connector string) names {
	var b strings.Builder
	for _, r := range strings.ToLower(connector) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	sum := sha256.Sum256([]byte(connector))
	h := hex.EncodeToString(sum[:])[:10]
	prefix := b.String()
	if len(prefix) > maxBase-len(h)-1 {
		prefix = prefix[:maxBase-len(h)-1]
	}
	base := prefix + "_" + h
	return names{
		base:        base,
		table:       base + "_audit",
		wakeup:      base + "_wakeup",
		waiters:     base + "_waiters",
		function:    base + "_capture",
		rowFunction: base + "_capture_row",
		// '!' sorts before letters, digits and '_': PostgreSQL fires a
		// table's row triggers in name order, and the capture trigger must
		// record a change before a user's AFTER trigger changes the row
		// again (docs/pgaudit.md, "Order").
		rowTrigger: "!" + base + "_row",
		order:      base + "_order",
		snapshot:   base + "_snapshot",
		channel:    "tidyconnect_" + base,
		marker:     markerPrefix + connector,
	}
}

// Trigger names on every captured table, per event.
var triggerEvents = []string{"INSERT", "UPDATE", "DELETE", "TRUNCATE"}

func (n names) trigger(event string) string {
	switch event {
	case "INSERT":
		return n.base + "_ins"
	case "UPDATE":
		return n.base + "_upd"
	case "DELETE":
		return n.base + "_del"
	default:
		return n.base + "_trunc"
	}
}

func versionString() string { return version.Version }
