package integration

import (
	"fmt"
	"testing"
	"time"
)

// TestChainTombstones: pgaudit with tombstones.on.delete=true through the
// worker and Kafka into amqpsink: a deleted row's delete message is
// followed by the tombstone's, an empty message (the null value survives
// the producer, the broker and the sink's consumer as null: an empty
// value would be the same message, but a JSON "null" or a dropped record
// would not). The sink's default behavior.on.null.values is publish.
func TestChainTombstones(t *testing.T) {
	c := newChain(t)
	c.deploy("tombstones.on.delete", "true")
	customers := c.collect(c.queue("customers"))

	var id int64
	if err := c.pg.QueryRow(c.ctx, "INSERT INTO "+c.table("customers")+" (name, email) VALUES ('tomb', $1) RETURNING id", "tomb-"+c.id+"@example.com").Scan(&id); err != nil {
		t.Fatal(err)
	}
	c.exec("DELETE FROM "+c.table("customers")+" WHERE id = $1", id)

	ok := eventually(60*time.Second, func() bool {
		msgs, bad := customers.snapshot()
		return len(msgs) >= 2 && len(bad) >= 1
	})
	msgs, bad := customers.snapshot()
	if !ok {
		t.Fatalf("after 60s: %d changes and %d other messages (%q) on the queue, want the insert, the delete and one empty message", len(msgs), len(bad), bad)
	}
	var got []string
	for _, m := range msgs {
		if m.id() == fmt.Sprint(id) {
			got = append(got, m.kind())
		}
	}
	if fmt.Sprint(got) != "[insert delete]" || len(bad) != 1 || bad[0] != "" {
		t.Fatalf("changes of row %d %v, other messages %q; want [insert delete] and one empty message (the tombstone)", id, got, bad)
	}
	// The tombstone came right after the delete (one partition, one queue).
	if order := customers.order(); fmt.Sprint(order[len(order)-2:]) != "[delete other]" {
		t.Fatalf("arrivals %v, want the delete then the empty message last", order)
	}
}
