package pgaudit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// resourceExists looks a ledger resource up in the catalog.
func resourceExists(ctx context.Context, db *pgxpool.Pool, r connect.Resource) (bool, error) {
	var ok bool
	switch r.Kind {
	case KindSchema:
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, r.Name).Scan(&ok)
		return ok, err
	case KindTable, KindSequence, KindFunction, KindTrigger:
		_, parts, err := parseQualified(r.Location)
		if err != nil {
			return false, err
		}
		switch r.Kind {
		case KindTable, KindSequence:
			err = db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{parts[0], r.Name}.Sanitize()).Scan(&ok)
		case KindFunction:
			err = db.QueryRow(ctx, `SELECT to_regprocedure($1) IS NOT NULL`, pgx.Identifier{parts[0], r.Name[:len(r.Name)-2]}.Sanitize()+"()").Scan(&ok)
		case KindTrigger:
			err = db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2)`, pgx.Identifier(parts).Sanitize(), r.Name).Scan(&ok)
		}
		return ok, err
	case KindReplicationSlot:
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, r.Name).Scan(&ok)
		return ok, err
	case KindPublication:
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, r.Name).Scan(&ok)
		return ok, err
	}
	return false, fmt.Errorf("unknown resource kind %q", r.Kind)
}
