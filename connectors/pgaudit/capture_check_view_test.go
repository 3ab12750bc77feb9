package pgaudit

import "testing"

// TestRenamedWhileRunningViewTakesItsName: a captured table renamed while
// its task runs, with a view made under the old name (the usual way to
// keep old queries working), is still captured: its triggers went with it,
// and writes through the view reach it. The task's check of its tables'
// triggers took the view for a table made again without them and failed
// the task, asking for a restart whose Start would only refuse the view
// (not a table).
func TestRenamedWhileRunningViewTakesItsName(t *testing.T) {
	for _, level := range []string{"statement", "row"} {
		t.Run(level, func(t *testing.T) {
			db, s, r := capturingT(t, "renamed-view-", level)
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (1, 'a')`)
			r.collect(1, true)
			mustExec(t, db, `ALTER TABLE `+qualified(s, "t")+` RENAME TO t2`)
			mustExec(t, db, `CREATE VIEW `+qualified(s, "t")+` AS SELECT * FROM `+qualified(s, "t2"))
			mustExec(t, db, `INSERT INTO `+qualified(s, "t")+` VALUES (2, 'b')`)
			recs, err := r.tasks[0].Poll(testCtx(t))
			if err != nil {
				t.Fatalf("Poll after a view took the renamed table's name: %v, want its change", err)
			}
			if len(recs) != 1 {
				t.Fatalf("Poll returned %d records, want the change written through the view", len(recs))
			}
			// Filed under the name the table had when its triggers were made.
			checkChanges(t, []change{decode(t, recs[0])}, "tc."+s+".t", s, "t", []wantChange{
				{"c", `{"id":2}`, "null", `{"id":2,"v":"b"}`},
			})
		})
	}
}
