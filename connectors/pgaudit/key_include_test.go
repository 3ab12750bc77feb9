package pgaudit

import (
	"reflect"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestPrimaryKeyIncludeColumns: the record key is the primary key's key
// columns, not the INCLUDE columns its index carries besides: an update
// of an included column keeps the row's key (else a compacted topic
// would keep the row under both keys), under either capture method.
func TestPrimaryKeyIncludeColumns(t *testing.T) {
	for _, method := range []string{methodTrigger, methodLogical} {
		t.Run(method, func(t *testing.T) {
			db, url := admin(t)
			s := newSchema(t, db)
			tbl := qualified(s, "i")
			mustExec(t, db, `CREATE TABLE `+tbl+` (id int, v text, PRIMARY KEY (id) INCLUDE (v))`)
			name := testenv.Unique("key-include-")
			cfg := baseConfig(name, url, auditSchemaFor(t, db), s+".i")
			if method == methodLogical {
				logicalAdmin(t)
				dropSlotAfter(t, db, name)
				cfg = logicalConfig(name, url, s+".i")
			}
			r := startConnector(t, cfg, connect.NewMemoryLedger())
			defer func() {
				if err := r.stop(true); err != nil {
					t.Error(err)
				}
			}()
			mustExec(t, db, `INSERT INTO `+tbl+` VALUES (1, 'a')`)
			mustExec(t, db, `UPDATE `+tbl+` SET v = 'b'`)
			mustExec(t, db, `DELETE FROM `+tbl)
			got := r.collect(3, true)
			for i, c := range got {
				if !reflect.DeepEqual(anyMap(c.Key), jsonOf(t, `{"id":1}`)) {
					t.Errorf("change %d (%s): key %v, want {\"id\":1}", i, c.Op, c.Key)
				}
			}
			r.quiet()
		})
	}
}
