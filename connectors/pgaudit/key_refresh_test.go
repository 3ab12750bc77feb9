package pgaudit

import (
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestKeyChangeReachesQuietTable: a primary key changed on a captured
// table with few changes reaches its records' keys within metaRefresh,
// also when the refresh falls due in a batch of another table's changes
// only (it used to reload only the tables in the batch, and restart the
// timer), under either capture method.
func TestKeyChangeReachesQuietTable(t *testing.T) {
	override(t, &metaRefresh, 300*time.Millisecond)
	for _, method := range []string{methodTrigger, methodLogical} {
		t.Run(method, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "busy")+` (id int PRIMARY KEY)`)
			mustExec(t, db, `CREATE TABLE `+qualified(s, "quiet")+` (id int PRIMARY KEY, k int NOT NULL)`)
			name := testenv.Unique("metarefresh-")
			cfg := baseConfig(name, url, auditSchemaFor(t, db), s+".busy", s+".quiet")
			if method == methodLogical {
				logicalAdmin(t)
				dropSlotAfter(t, db, name)
				cfg = logicalConfig(name, url, s+".busy", s+".quiet")
			}
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			defer func() {
				if err := r.stop(true); err != nil {
					t.Error(err)
				}
			}()
			mustExec(t, db, `INSERT INTO `+qualified(s, "quiet")+` VALUES (0, 0)`)
			r.collect(1, true)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "quiet")+` DROP CONSTRAINT quiet_pkey, ADD PRIMARY KEY (k)`)
			time.Sleep(2 * metaRefresh) // the refresh is due
			// It falls due in a batch of the busy table's changes only.
			mustExec(t, db, `INSERT INTO `+qualified(s, "busy")+` VALUES (1)`)
			r.collect(1, true)
			mustExec(t, db, `INSERT INTO `+qualified(s, "quiet")+` VALUES (1, 7)`)
			got := r.collect(1, true)
			if k := got[0].Key; len(k) != 1 || k["k"] == nil {
				t.Fatalf("the quiet table's change keyed %v, %v after its primary key became (k)", k, 2*metaRefresh)
			}
		})
	}
}
