package pgaudit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestBackoffStartsAgainAfterAnOutage: each outage is retried with a
// backoff from 100 ms doubling to 5 s. An idle task (its reads find
// nothing) kept the backoff an earlier outage reached, so the first retry
// of the next one (a single terminated backend, say) waited up to 5 s.
func TestBackoffStartsAgainAfterAnOutage(t *testing.T) {
	db, url := admin(t)
	if !strings.Contains(url, "127.0.0.1:5432") {
		testenv.Skip(t, "the test proxies 127.0.0.1:5432; %s points elsewhere", testenv.PostgresEnv)
	}
	px := newProxy(t, "127.0.0.1:5432")
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("backoff-"), strings.Replace(url, "127.0.0.1:5432", px.addr, 1), auditSchemaFor(t, db), s+".t")
	r := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() { _ = r.stop(true) }()
	task := r.tasks[0]
	poll := func() {
		ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
		defer cancel()
		_, _ = task.Poll(ctx)
	}

	for _, tc := range []struct {
		name   string
		during int // Polls while the database is away
	}{
		{"short outage", 1},
		{"longer outage", 4},
	} {
		px.down()
		for range tc.during {
			poll()
		}
		if task.backoff == 0 {
			t.Fatalf("%s: no backoff while the database is away: the set-up does not show what the test is about", tc.name)
		}
		px.up()
		// Idle: the reads after the outage find nothing.
		await(t, 10*time.Second, func() (bool, string, error) {
			poll()
			return task.backoff == 0, tc.name + ": the backoff of an outage that ended is kept: the next outage's first retry waits " + task.backoff.String(), nil
		})
	}
}
