package pgaudit

import (
	"context"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// A connector re-created after a deletion with cleanup.on.delete=false
// takes back every object it finds with its marker, the commit-order
// trigger included: the ledger lists it again, and a later deletion is
// accounted for it.
func TestRecreatedConnectorTakesBackTheOrderTrigger(t *testing.T) {
	db, url := admin(t)
	s := newSchema(t, db)
	mustExec(t, db, `CREATE TABLE `+qualified(s, "t")+` (id int PRIMARY KEY)`)
	cfg := baseConfig(testenv.Unique("ordown-"), url, auditSchemaFor(t, db), s+".t")
	cfg[KeyCaptureOrder] = orderCommit
	l := connect.NewMemoryLedger()
	r := startConnector(t, cfg, l)
	before, err := l.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r.conn.s.cleanup = false // deleted with cleanup.on.delete=false
	if err := r.stop(true); err != nil {
		t.Fatal(err)
	}
	if left, _ := l.List(context.Background()); len(left) != 0 {
		t.Fatalf("ledger after a deletion with cleanup.on.delete=false: %v", left)
	}
	r = startConnector(t, cfg, l)
	defer func() { _ = r.stop(true) }()
	after, err := l.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	order := connect.Resource{Kind: KindTrigger, Name: objectNames(cfg["name"]).order}
	if !containsResource(before, order) {
		t.Fatalf("the first run does not list the order trigger %v: %v", order, before)
	}
	if !containsResource(after, order) || len(after) != len(before) {
		t.Errorf("the re-created connector lists %d resources (before: %d), order trigger listed: %v", len(after), len(before), containsResource(after, order))
	}
}

func containsResource(rs []connect.Resource, r connect.Resource) bool {
	for _, x := range rs {
		if x.Kind == r.Kind && x.Name == r.Name {
			return true
		}
	}
	return false
}
