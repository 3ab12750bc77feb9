package pgaudit

import (
	"bytes"
	"fmt"
	"sync"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/tidyconnect/tidyconnect/migrations"
)

// sqlVars are the values templates see; every one is already quoted.
type sqlVars struct {
	Schema, Table, Wakeup, Function, Body, Channel, Marker string
	Captured, Trigger                                      string
	// RowFunction is the row-level capture function; its trigger passes
	// the captured table's schema and name as string literals.
	RowFunction                                string
	CapturedSchemaLiteral, CapturedNameLiteral string
	// Waiters is the wake-up sequence's quoted name; WaitersLiteral is
	// that name as a string literal, for a regclass constant.
	Waiters, WaitersLiteral string
	// Compression is the audit images' column compression clause
	// (" COMPRESSION lz4" where the server has lz4, else empty).
	Compression string
	// Single and Chunk shape the audit rows: the first Single changes of a
	// statement get a row each, the rest Chunk per row, and fewer where
	// their images pass GroupBytes. SideBytes bounds an UPDATE's old or
	// new images grouped without pairing rows (docs/decisions/0044).
	Single, Chunk         int
	GroupBytes, SideBytes int
	// Snapshot is the incremental snapshots' progress table; the captured
	// table's quoted name as a string literal is CapturedLiteral.
	Snapshot, CapturedLiteral string
	// Order is the commit-order function's quoted name (capture.order =
	// commit); OrderLiteral and TableLiteral are it and Table as string
	// literals, for the block that creates the function.
	Order, OrderLiteral, TableLiteral string
}

// The capture function writes the first singleChanges changed rows of a
// statement as one audit row each and groups the rest, chunkChanges per
// audit row. A change's seq is its audit row id * seqPerRow + its index in
// the row, so chunkChanges must not exceed seqPerRow.
const (
	singleChanges = 64
	chunkChanges  = 1000
	seqPerRow     = 1000
)

// groupBytes and sideBytes bound grouped audit rows (variables for tests):
// an array, and a row, cannot exceed 1 GB.
var (
	groupBytes = 64 << 20
	sideBytes  = 256 << 20
)

var (
	tmplOnce sync.Once
	tmpls    map[string]*template.Template
	tmplErr  error
)

func loadTemplates() (map[string]*template.Template, error) {
	tmplOnce.Do(func() {
		tmpls = map[string]*template.Template{}
		entries, err := migrations.PGAudit.ReadDir("pgaudit")
		if err != nil {
			tmplErr = err
			return
		}
		for _, e := range entries {
			b, err := migrations.PGAudit.ReadFile("pgaudit/" + e.Name())
			if err != nil {
				tmplErr = err
				return
			}
			t, err := template.New(e.Name()).Option("missingkey=error").Parse(string(b))
			if err != nil {
				tmplErr = fmt.Errorf("migrations/pgaudit/%s: %w", e.Name(), err)
				return
			}
			tmpls[e.Name()] = t
		}
	})
	return tmpls, tmplErr
}

// render executes migrations/pgaudit/<file> (or one of its named blocks).
func render(file, block string, v sqlVars) (string, error) {
	ts, err := loadTemplates()
	if err != nil {
		return "", err
	}
	t, ok := ts[file]
	if !ok {
		return "", fmt.Errorf("migration %s is not embedded", file)
	}
	var buf bytes.Buffer
	if block != "" {
		err = t.ExecuteTemplate(&buf, block, v)
	} else {
		err = t.Execute(&buf, v)
	}
	if err != nil {
		return "", fmt.Errorf("rendering migration %s: %w", file, err)
	}
	return buf.String(), nil
}

// vars returns the quoted identifiers of the connector's objects.
func (n names) vars(auditSchema string) sqlVars {
	return sqlVars{
		Schema:  pgx.Identifier{auditSchema}.Sanitize(),
		Table:   pgx.Identifier{auditSchema, n.table}.Sanitize(),
		Wakeup:  pgx.Identifier{auditSchema, n.wakeup}.Sanitize(),
		Waiters: pgx.Identifier{auditSchema, n.waiters}.Sanitize(),
		// quoteLiteral of the quoted name: regclass parses the quotes.
		WaitersLiteral: quoteLiteral(pgx.Identifier{auditSchema, n.waiters}.Sanitize()),
		Function:       pgx.Identifier{auditSchema, n.function}.Sanitize(),
		RowFunction:    pgx.Identifier{auditSchema, n.rowFunction}.Sanitize(),
		Order:          pgx.Identifier{auditSchema, n.order}.Sanitize(),
		Snapshot:       pgx.Identifier{auditSchema, n.snapshot}.Sanitize(),
		OrderLiteral:   quoteLiteral(pgx.Identifier{auditSchema, n.order}.Sanitize()),
		TableLiteral:   quoteLiteral(pgx.Identifier{auditSchema, n.table}.Sanitize()),
		Channel:        quoteLiteral(n.channel),
		Marker:         quoteLiteral(n.marker),
		Single:         singleChanges,
		Chunk:          chunkChanges,
		GroupBytes:     groupBytes,
		SideBytes:      sideBytes,
	}
}
