package pgaudit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// ApplicationName is the application_name of a connection of the connector
// (role is "connector", "task-N" or "listen-N"), so that pg_stat_activity
// shows whose connection it is. PostgreSQL keeps 63 bytes of printable
// ASCII; longer or unusual names use the derived base name instead.
func ApplicationName(connector, role string) string {
	return ApplicationNamePrefix(connector) + role
}

// ApplicationNamePrefix is the common prefix of ApplicationName for one
// connector.
func ApplicationNamePrefix(connector string) string {
	id := connector
	plain := true
	for _, r := range connector {
		// ':' separates the parts: "a:b" would otherwise share the
		// prefix of connector "a".
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ':' {
			plain = false
		}
	}
	if !plain || len("tidyconnect:"+id+":listen-000") > 63 {
		id = objectNames(connector).base
		if len(id) > 36 { // keep the "_<hash>" tail, which makes it unique
			id = id[:25] + id[len(id)-11:]
		}
	}
	return "tidyconnect:" + id + ":"
}

func connConfig(url, appName string) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx's parse errors can quote the URL: never show the password.
		return nil, fmt.Errorf("%s is not a valid libpq URL or DSN: fix %s", connect.MaskCredentials(url), KeyURL)
	}
	cc.RuntimeParams["application_name"] = appName
	// Names in the configuration are UTF-8: in a session with another
	// encoding (a database's default is its own) they would not match the
	// catalog's, and go garbled into the triggers' arguments.
	cc.RuntimeParams["client_encoding"] = "UTF8"
	if cc.ConnectTimeout == 0 || cc.ConnectTimeout > 10*time.Second {
		cc.ConnectTimeout = 10 * time.Second
	}
	return cc, nil
}

func connectDB(ctx context.Context, url, appName string) (*pgx.Conn, error) {
	cc, err := connConfig(url, appName)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL at %s (check %s and that the server is up): %w", connect.MaskCredentials(url), KeyURL, err)
	}
	return conn, nil
}

// transient reports whether err is a lost or refused connection (worth a
// retry with backoff) rather than a problem retrying cannot fix.
func transient(err error) bool {
	if err == nil {
		return false
	}
	// pgx refuses to send a message over 1 GB: the same message would be
	// refused again, forever.
	if strings.Contains(err.Error(), "message body too large") {
		return false
	}
	// What the server said decides, also when it said it while connecting
	// (a wrong password, a missing database: retrying cannot help).
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutdown, cannot connect now
			pgErr.Code == "40001", pgErr.Code == "40P01", // serialization failure, deadlock
			pgErr.Code == "53300": // too many connections
			return true
		}
		return false
	}
	// A connect timeout (a server that stopped answering: a blackholed
	// host, a failover) wraps context.DeadlineExceeded too; the callers
	// tell their own cancellation apart by their context.
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	return pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed") ||
		strings.Contains(err.Error(), "unexpected EOF") || strings.Contains(err.Error(), "connection reset")
}

// lockKey serializes pgaudit provisioning and cleanup in a database: both
// check-then-create schemas and triggers, which must not interleave.
const lockKey int64 = 0x7469_6479_7067_6175 // "tidypgau"

// takeLock takes lockKey for tx, then sets the transaction's lock_timeout
// to 10 s for the table locks that follow. The advisory lock itself is
// waited for without a timeout (only ctx ends the wait): its holder is
// another pgaudit provisioning or cleanup, whose own waits are bounded,
// but whose initial snapshot (docs/decisions/0070) copies for as long as
// its tables take, and another connector's Start or deletion must not fail
// on a lock timeout meanwhile (TestInitialSnapshotLongCopyOtherStart).
//
// A statement_timeout of the role or database would cut that wait short
// the same way: it is off for the wait and set back afterwards.
func takeLock(ctx context.Context, tx pgx.Tx) error {
	var statementTimeout string
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.current_setting('statement_timeout'), pg_catalog.set_config('lock_timeout', '0', true), pg_catalog.set_config('statement_timeout', '0', true)`).Scan(&statementTimeout, new(string), new(string)); err != nil {
		return fmt.Errorf("taking the advisory lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return fmt.Errorf("taking the advisory lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('lock_timeout', '10s', true), pg_catalog.set_config('statement_timeout', $1, true)`, statementTimeout); err != nil {
		return fmt.Errorf("setting lock_timeout: %w", err)
	}
	return nil
}

// sleepCtx waits d or until ctx is done; a backoff, not a condition wait.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
