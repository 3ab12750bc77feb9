package pgaudit

import (
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestLogicalKeptSlotInUseNotTakenBack: a slot that is not in the ledger
// is taken back (a deletion with cleanup.on.delete=false kept it) only
// while nobody streams it. One a running connector of the same name
// streams (another deployment's, with its own ledger) is refused: taking
// it would make this connector's deletion end that one's stream and drop
// its slot.
func TestLogicalKeptSlotInUseNotTakenBack(t *testing.T) {
	db, url := logicalAdmin(t)
	s := newSchema(t, db)
	tbl := qualified(s, "k")
	mustExec(t, db, `CREATE TABLE `+tbl+` (id int PRIMARY KEY)`)
	name := testenv.Unique("logical-keptbusy-")
	dropSlotAfter(t, db, name)
	cfg := logicalConfig(name, url, s+".k")
	first := startConnector(t, cfg, connect.NewMemoryLedger())
	defer func() {
		if err := first.stop(true); err != nil {
			t.Error(err)
		}
	}()
	_, slot := logicalNames(name)
	await(t, 10*time.Second, func() (bool, string, error) {
		var active bool
		err := db.QueryRow(testCtx(t), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		return active, "the first connector streaming its slot", err
	})

	// The second deployment's connector: its Start fails, and its
	// deletion (of the failed connector) drops nothing of the first's.
	l2 := connect.NewMemoryLedger()
	second := &Connector{}
	if err := second.Start(connect.WithHost(testCtx(t), testHost(name, -1, l2)), cfg); err == nil {
		t.Errorf("a second connector of the name took the slot a running one streams")
	} else if !strings.Contains(err.Error(), "in use") {
		t.Errorf("second Start: %v, want the slot named as in use", err)
	}
	second.Stop(true)
	if err := second.Stopped(connect.WithHost(testCtx(t), testHost(name, -1, l2))); err != nil {
		t.Logf("deleting the second: %v", err)
	}
	if slot, pub := slotAndPublication(t, db, name); !slot || !pub {
		t.Errorf("after the second's deletion: the first's slot %v publication %v", slot, pub)
	}
	mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1)`)
	if got := first.collect(1, true); got[0].After["id"] == nil {
		t.Errorf("the first connector after the second's attempt: %v", got[0].Raw)
	}
}
