// Package migrations embeds the versioned SQL that tidyconnect applies.
//
// pgaudit/ holds what the pgaudit connector provisions (*.up.sql, applied
// in file-name order on every Start; each statement is idempotent) and drops
// (*.down.sql, used on deletion). The files are text/template templates: every
// identifier placeholder is filled with an already-quoted identifier
// (pgx.Identifier.Sanitize) and every literal with a quoted literal, so no
// template can inject SQL. demo/ holds the demo schema of docker-compose.
package migrations

import "embed"

// PGAudit holds migrations/pgaudit/*.sql.
//
//go:embed pgaudit/*.sql
var PGAudit embed.FS
