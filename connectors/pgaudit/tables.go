package pgaudit

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// tableName is a captured table. Names are literal (case preserved).
type tableName struct {
	Schema, Name string
}

func (t tableName) String() string { return t.Schema + "." + t.Name }

// splitNames returns the tables' schemas and names as two parallel lists,
// the form the catalog queries unnest.
func splitNames(tables []tableName) (schemas, names []string) {
	schemas, names = make([]string, len(tables)), make([]string, len(tables))
	for i, t := range tables {
		schemas[i], names[i] = t.Schema, t.Name
	}
	return schemas, names
}

// quoted is the SQL form, safe to splice into a statement.
func (t tableName) quoted() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// parseTables parses the tables list: items separated by commas, each
// [schema.]table; a part may be double-quoted (with "" for a quote) to hold
// '.', ',' or a leading '"'. Unquoted parts are taken literally.
func parseTables(s string) ([]tableName, error) {
	var (
		out  []tableName
		bad  []string
		seen = map[tableName]bool{}
	)
	items, err := splitTopLevel(s)
	if err != nil {
		return nil, err
	}
	for _, item := range items {
		parts, err := splitParts(item)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%q: %v", item, err))
			continue
		}
		var t tableName
		switch len(parts) {
		case 1:
			t = tableName{"public", parts[0]}
		case 2:
			t = tableName{parts[0], parts[1]}
		default:
			bad = append(bad, fmt.Sprintf("%q: expected schema.table or table, got %d dot-separated parts (quote a name that contains '.')", item, len(parts)))
			continue
		}
		if len(t.Schema) > 63 || len(t.Name) > 63 {
			bad = append(bad, fmt.Sprintf("%q: a PostgreSQL identifier has at most 63 bytes", item))
			continue
		}
		if strings.ContainsRune(t.Schema+t.Name, 0) {
			bad = append(bad, fmt.Sprintf("%q: a PostgreSQL name cannot contain a NUL byte", item))
			continue
		}
		if strings.HasPrefix(t.Schema, "pg_") {
			bad = append(bad, fmt.Sprintf("%q: %s is a PostgreSQL system schema (the pg_ prefix is reserved); its tables cannot be captured", item, t.Schema))
			continue
		}
		if seen[t] {
			bad = append(bad, fmt.Sprintf("%q: listed twice", item))
			continue
		}
		seen[t] = true
		out = append(out, t)
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("malformed table list: %s", strings.Join(bad, "; "))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no table given: list schema.table names separated by commas")
	}
	return out, nil
}

// splitTopLevel splits on commas outside double quotes, trimming spaces.
// Empty items are errors (a stray comma is a typo worth reporting).
func splitTopLevel(s string) ([]string, error) {
	var (
		items []string
		cur   strings.Builder
		inQ   bool
	)
	flush := func() error {
		item := strings.TrimSpace(cur.String())
		cur.Reset()
		if item == "" {
			return fmt.Errorf("malformed table list %q: empty item between commas", s)
		}
		items = append(items, item)
		return nil
	}
	for _, r := range s {
		switch {
		case r == '"' && (inQ || partStart(cur.String())):
			inQ = !inQ // a doubled quote toggles twice: still inside
			cur.WriteRune(r)
		case r == ',' && !inQ:
			if err := flush(); err != nil {
				return nil, err
			}
		default:
			cur.WriteRune(r)
		}
	}
	if inQ {
		return nil, fmt.Errorf("malformed table list %q: unterminated double quote", s)
	}
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return items, nil
}

// partStart reports whether a quote after sofar would open a quoted part:
// only at the start of a name; elsewhere a quote is a literal character.
func partStart(sofar string) bool {
	t := strings.TrimRight(sofar, " \t")
	if t == "" || strings.HasSuffix(t, ".") {
		return true
	}
	// After a closed quoted part a further quote is part of a doubled pair,
	// which the toggling handles.
	return strings.HasSuffix(t, `"`) && strings.Count(t, `"`)%2 == 0 && quotedAtEnd(t)
}

// quotedAtEnd reports whether t ends with a complete quoted part.
func quotedAtEnd(t string) bool {
	i := strings.LastIndexByte(t, '.')
	return strings.HasPrefix(strings.TrimSpace(t[i+1:]), `"`)
}

// splitParts splits one item on dots outside double quotes and unquotes.
func splitParts(item string) ([]string, error) {
	var parts []string
	rest := item
	for {
		rest = strings.TrimSpace(rest)
		var part string
		if strings.HasPrefix(rest, `"`) {
			var ok bool
			if part, rest, ok = cutQuoted(rest); !ok {
				return nil, fmt.Errorf("unterminated double quote")
			}
			rest = strings.TrimSpace(rest)
			if rest != "" && rest[0] != '.' {
				return nil, fmt.Errorf("unexpected %q after a quoted name", rest)
			}
		} else {
			i := strings.IndexByte(rest, '.')
			if i < 0 {
				part, rest = strings.TrimSpace(rest), ""
			} else {
				part, rest = strings.TrimSpace(rest[:i]), rest[i:]
			}
		}
		if part == "" {
			return nil, fmt.Errorf("empty schema or table name")
		}
		parts = append(parts, part)
		if rest == "" {
			return parts, nil
		}
		rest = rest[1:] // the dot
		if strings.TrimSpace(rest) == "" {
			return nil, fmt.Errorf("empty name after '.'")
		}
	}
}

// formatTables is the inverse of parseTables, quoting every part.
func formatTables(ts []tableName) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.quoted()
	}
	return strings.Join(parts, ",")
}

// topicName is <prefix>.<schema>.<table> with characters Kafka rejects
// replaced by '_' and the length capped at Kafka's 249.
func topicName(prefix string, t tableName) string {
	b := []byte(prefix + "." + t.Schema + "." + t.Name)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			b[i] = '_'
		}
	}
	if len(b) > 249 {
		b = b[:249]
	}
	return string(b)
}

// quoteLiteral quotes s as an SQL string literal, safe whatever
// standard_conforming_strings says (as lib/pq's QuoteLiteral).
func quoteLiteral(s string) string {
	s = strings.ReplaceAll(s, `'`, `''`)
	if strings.Contains(s, `\`) {
		return ` E'` + strings.ReplaceAll(s, `\`, `\\`) + `'`
	}
	return `'` + s + `'`
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// parseQualified parses a location written by tableRes and its kin:
// db/"schema" or db/"schema"."table". The database name is not quoted and
// may itself hold `/"` (CREATE DATABASE "a/""b"): the separator is the
// first `/"` after which the rest is one or two complete quoted names.
func parseQualified(loc string) (db string, parts []string, err error) {
	for i := 0; i < len(loc); i++ {
		j := strings.Index(loc[i:], `/"`)
		if j < 0 {
			break
		}
		i += j
		if parts, ok := quotedParts(loc[i+1:]); ok {
			return loc[:i], parts, nil
		}
	}
	return "", nil, fmt.Errorf("ledger location %q is not db/\"schema\"[.\"table\"]", loc)
}

// quotedParts parses exactly "a" or "a"."b" (inner quotes doubled), as
// pgx.Identifier.Sanitize writes them.
func quotedParts(s string) ([]string, bool) {
	var parts []string
	for {
		if !strings.HasPrefix(s, `"`) {
			return nil, false
		}
		part, rest, ok := cutQuoted(s)
		if !ok {
			return nil, false
		}
		parts = append(parts, part)
		s = rest
		switch {
		case s == "":
			return parts, len(parts) <= 2
		case s[0] != '.' || len(parts) == 2:
			return nil, false
		}
		s = s[1:]
	}
}

// cutQuoted reads the double-quoted name s starts with (inner quotes
// doubled) and returns it unquoted with what follows it; ok is false when
// the quote is not closed.
func cutQuoted(s string) (name, rest string, ok bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '"' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '"' {
			b.WriteByte('"')
			i++
			continue
		}
		return b.String(), s[i+1:], true
	}
	return "", "", false
}

// compareTables orders tables by schema, then name.
func compareTables(a, b tableName) int {
	return cmp.Or(strings.Compare(a.Schema, b.Schema), strings.Compare(a.Name, b.Name))
}

// splitOutsideQuotes splits s at each sep outside double quotes. As in
// tables, a quote opens a quoted name only where a name starts (after a
// blank start or one of . , : ;); elsewhere it is a literal character, so
// a name written unquoted in tables can be written the same way here.
func splitOutsideQuotes(s string, sep rune) ([]string, error) {
	const (
		nameStart  = iota // only blanks since the last boundary
		unquoted          // inside an unquoted name: quotes are literal
		quoted            // inside a quoted name
		afterQuote        // a quoted name just closed: a quote is a doubled one
	)
	var (
		out   []string
		cur   strings.Builder
		state = nameStart
	)
	for _, r := range s {
		switch {
		case state == quoted:
			if r == '"' {
				state = afterQuote
			}
		case r == sep:
			out = append(out, cur.String())
			cur.Reset()
			state = nameStart
			continue
		case strings.ContainsRune(".,:;", r):
			state = nameStart
		case r == '"' && (state == nameStart || state == afterQuote):
			state = quoted
		case r == ' ' || r == '\t':
			// Blanks around names change nothing (as partStart).
		default:
			state = unquoted
		}
		cur.WriteRune(r)
	}
	if state == quoted {
		return nil, fmt.Errorf("unterminated double quote")
	}
	return append(out, cur.String()), nil
}

// parseKeyColumns parses message.key.columns, Debezium's syntax with
// literal names: entries separated by ';', each a table as in tables, ':'
// and its key columns separated by ','. Names are quoted as in tables
// (double quotes around a name that contains '.', ',', ';' or ':', or
// starts with '"').
func parseKeyColumns(s string) (map[tableName][]string, error) {
	out := map[tableName][]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	entries, err := splitOutsideQuotes(s, ';')
	if err != nil {
		return nil, err
	}
	var bad []string
	for _, e := range entries {
		if strings.TrimSpace(e) == "" {
			bad = append(bad, "an empty entry between semicolons")
			continue
		}
		parts, err := splitOutsideQuotes(e, ':')
		if err != nil || len(parts) != 2 {
			bad = append(bad, fmt.Sprintf("%q: expected <table>:<column>[,<column>...]", strings.TrimSpace(e)))
			continue
		}
		tables, err := parseTables(parts[0])
		if err != nil || len(tables) != 1 {
			bad = append(bad, fmt.Sprintf("%q: expected one table before ':', as in tables", strings.TrimSpace(parts[0])))
			continue
		}
		t := tables[0]
		if _, dup := out[t]; dup {
			bad = append(bad, fmt.Sprintf("table %s listed twice", t.quoted()))
			continue
		}
		items, err := splitTopLevel(parts[1])
		if err != nil || len(items) == 0 {
			bad = append(bad, fmt.Sprintf("%q: expected the key's column names after ':', separated by commas", strings.TrimSpace(e)))
			continue
		}
		var cols []string
		for _, it := range items {
			p, err := splitParts(it)
			switch {
			case err != nil:
				bad = append(bad, fmt.Sprintf("%q: %v", it, err))
			case len(p) != 1:
				bad = append(bad, fmt.Sprintf("%q: a column name (quote a name that contains '.')", it))
			case strings.ContainsRune(p[0], 0):
				// The catalog query would fail on it, under postgres.url.
				bad = append(bad, fmt.Sprintf("%q: a PostgreSQL name cannot contain a NUL byte", it))
			case slices.Contains(cols, p[0]):
				bad = append(bad, fmt.Sprintf("column %q listed twice for %s", p[0], t.quoted()))
			default:
				cols = append(cols, p[0])
			}
		}
		out[t] = cols
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return out, nil
}

// sortedTables returns m's tables in name order (for stable messages).
func sortedTables[V any](m map[tableName]V) []tableName {
	out := make([]tableName, 0, len(m))
	for t := range m {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b tableName) int {
		return cmp.Or(cmp.Compare(a.Schema, b.Schema), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// parseExcludedColumns parses column.exclude.list: comma-separated
// schema.table.column (table.column means public), names quoted as in
// tables.
func parseExcludedColumns(s string) (map[tableName]map[string]bool, error) {
	out := map[tableName]map[string]bool{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	items, err := splitTopLevel(s)
	if err != nil {
		return nil, err
	}
	var bad []string
	for _, it := range items {
		p, err := splitParts(it)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%q: %v", it, err))
			continue
		}
		if strings.ContainsRune(strings.Join(p, ""), 0) {
			// The catalog query would fail on it, under postgres.url.
			bad = append(bad, fmt.Sprintf("%q: a PostgreSQL name cannot contain a NUL byte", it))
			continue
		}
		var t tableName
		var col string
		switch len(p) {
		case 2:
			t, col = tableName{"public", p[0]}, p[1]
		case 3:
			t, col = tableName{p[0], p[1]}, p[2]
		default:
			bad = append(bad, fmt.Sprintf("%q: expected schema.table.column or table.column, got %d dot-separated parts (quote a name that contains '.')", it, len(p)))
			continue
		}
		if out[t] == nil {
			out[t] = map[string]bool{}
		}
		out[t][col] = true
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return out, nil
}
