package integration

import (
	"net/http"
	"testing"
	"time"
)

// TestSinkDeletedRightAfterSIGKILLDropsItsGroup: a sink deleted shortly
// after the worker was SIGKILLed (or whose deletion the restarted worker
// completes at start-up) still finds its consumer group holding the killed
// consumer, which never left, until the group's session timeout. The
// deletion used to give up on the group at once (logged as a warning) and
// forget the connector: the group kept its committed offsets, and a sink
// created later under the name resumed where the old one had stopped,
// never getting the records before (which went only into the queue the
// deletion dropped).
func TestSinkDeletedRightAfterSIGKILLDropsItsGroup(t *testing.T) {
	c := newChain(t)
	c.api.create(c.src, c.srcConfig())
	sink := c.sinkConfig()
	sink["offset.flush.interval.ms"] = "200" // offsets committed before the kill
	c.api.create(c.sink, sink)
	c.api.awaitRunning(c.src)
	c.api.awaitRunning(c.sink)
	col := c.collect(c.queue("customers"))
	c.exec("INSERT INTO "+c.table("customers")+" (name, email) VALUES ('Group Test', $1)", "group-"+c.id+"@example.com")
	if !eventually(60*time.Second, func() bool { msgs, _ := col.snapshot(); return len(msgs) > 0 }) {
		t.Fatal("the insert did not arrive in RabbitMQ")
	}
	if !eventually(30*time.Second, func() bool { n, _ := sinkOffsets(c); return n > 0 }) {
		t.Fatal("the sink committed no offsets")
	}

	c.w.kill()
	c.w.restart()
	c.api.deleteEventually(c.sink, 2*time.Minute)
	if c.w.logContains("could not delete the sink consumer group") {
		t.Errorf("the deletion left the consumer group %s behind", "connect-"+c.sink)
	}
	c.api.must(http.MethodPost, "/connectors",
		map[string]any{"name": c.sink, "config": sink, "initial_state": "STOPPED"}, http.StatusCreated)
	if n, body := sinkOffsets(c); n != 0 {
		t.Errorf("offsets of %s re-created after its deletion = %s, want none", c.sink, body)
	}
}
