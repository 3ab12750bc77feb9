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
}

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
		Schema:   pgx.Identifier{auditSchema}.Sanitize(),
		Table:    pgx.Identifier{auditSchema, n.table}.Sanitize(),
		Wakeup:   pgx.Identifier{auditSchema, n.wakeup}.Sanitize(),
		Function: pgx.Identifier{auditSchema, n.function}.Sanitize(),
		Channel:  quoteLiteral(n.channel),
		Marker:   quoteLiteral(n.marker),
	}
}
