package amqpsink

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// deleteConnector drives a deletion of a connector that has no task running:
// a cleanup-only instance's Start, Stop(true) and Stopped.
func deleteConnector(t *testing.T, cfg connect.Config, l connect.Ledger) error {
	t.Helper()
	c := &Connector{}
	h := testHost(cfg["name"], -1, l, nil)
	h.CleanupOnly = true
	ctx := connect.WithHost(ctxT(t), h)
	_ = c.Start(ctx, cfg)
	c.Stop(true)
	return c.Stopped(ctx)
}

// A routing-key template whose binding key exceeds AMQP's 255 bytes is a
// validation error naming the key; before, Start created the exchange and
// queue, recorded a binding amqp091 can never send, and every deletion
// failed on it (the client closes the connection on the oversized frame).
func TestOverlongBindingKey(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "t")
	cfg[KeyRoutingKey] = strings.Repeat("r", 255) + "${topic}"
	name := cfg["name"]
	cleanupByName(t, b, name, name+".t")
	if errs := (&Connector{}).Validate(ctxT(t), cfg); len(errs[KeyRoutingKey]) == 0 {
		t.Errorf("Validate accepted a binding key over 255 bytes: %v", errs)
	}
	l := connect.NewMemoryLedger()
	if _, err := tryStartSink(t, cfg, l, nil); err == nil {
		t.Fatal("Start succeeded with a binding key over 255 bytes")
	} else if !strings.Contains(err.Error(), KeyRoutingKey) {
		t.Errorf("Start error does not name %s: %v", KeyRoutingKey, err)
	}
	if b.queueExists(name+".t") || b.exchangeExists(name) {
		t.Errorf("a refused configuration was half-provisioned: queue %v exchange %v", b.queueExists(name+".t"), b.exchangeExists(name))
	}
	if err := deleteConnector(t, cfg, l); err != nil {
		t.Errorf("deletion failed: %v", err)
	}
	if rs := listLedger(t, l); len(rs) != 0 {
		t.Errorf("ledger after deletion: %v", rs)
	}
}

// A ledger entry for a binding whose key is over 255 bytes (left by an
// earlier version) names a binding that cannot exist: deletion counts it as
// gone instead of failing on it forever.
func TestOverlongBindingEntryIsGone(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "t")
	name := cfg["name"]
	cleanupByName(t, b, name, name+".t")
	l := connect.NewMemoryLedger()
	s := startSink(t, cfg, l, &reporter{})
	if err := s.stop(false); err != nil {
		t.Fatal(err)
	}
	bad := binding{exchange: name, queue: name + ".t", key: strings.Repeat("r", 256), owner: name}
	if err := l.Own(ctxT(t), connect.Resource{Kind: KindBinding, Name: bad.name(), Location: location(u)}); err != nil {
		t.Fatal(err)
	}
	// The configuration that made it, which Start now refuses, still lets
	// a cleanup-only instance finish the deletion.
	cfg[KeyRoutingKey] = strings.Repeat("r", 255) + "${topic}"
	if err := deleteConnector(t, cfg, l); err != nil {
		t.Errorf("deletion failed: %v", err)
	}
	if b.queueExists(name+".t") || b.exchangeExists(name) {
		t.Errorf("after deletion: queue %v exchange %v", b.queueExists(name+".t"), b.exchangeExists(name))
	}
	if rs := listLedger(t, l); len(rs) != 0 {
		t.Errorf("ledger after deletion: %v", rs)
	}
}

// The third of three queues exists with another type: Start fails naming the
// key, and creates nothing (the two missing queues and the exchange are not
// made). Before, they were created and owned, and fixing the key to match
// the existing queue then failed on the connector's own queues.
func TestPreconditionFailedProvisionsNothing(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "a", "b", "c")
	name := cfg["name"]
	cleanupByName(t, b, name, name+".a", name+".b")
	b.declareQueue(name+".c", "classic")
	l := connect.NewMemoryLedger()
	_, err := tryStartSink(t, cfg, l, nil)
	if err == nil || !strings.Contains(err.Error(), KeyQueueType) {
		t.Fatalf("Start = %v, want an error naming %s", err, KeyQueueType)
	}
	for _, q := range []string{name + ".a", name + ".b"} {
		if b.queueExists(q) {
			t.Errorf("queue %s was created by a Start that failed on its configuration", q)
		}
	}
	if b.exchangeExists(name) {
		t.Errorf("exchange %s was created by a Start that failed on its configuration", name)
	}
	if rs := listLedger(t, l); len(rs) != 0 {
		t.Errorf("ledger after the failed Start: %v", rs)
	}
	// Aligned with the existing queue, it starts.
	cfg[KeyQueueType] = "classic"
	s, err := tryStartSink(t, cfg, l, nil)
	if err != nil {
		t.Fatalf("Start after aligning %s: %v", KeyQueueType, err)
	}
	if err := s.stop(true); err != nil {
		t.Fatal(err)
	}
	if !b.queueExists(name + ".c") {
		t.Error("the pre-existing queue was deleted")
	}
	if b.queueExists(name+".a") || b.queueExists(name+".b") || b.exchangeExists(name) {
		t.Error("owned objects survived deletion")
	}
}

// Hostile names: dots, case-only differences, unicode, 255-byte names are
// delivered to and deleted exactly; a queue differing only in case stays.
// (Passed before the fixes too: coverage, not a regression test.)
func TestHostileNames(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	long := strings.Repeat("x", 200)
	cfg := baseConfig(t, u, "Ab.c", "ab.c", long)
	name := cfg["name"]
	cfg[KeyQueue] = "ü." + name + ".${topic}"
	pad := strings.Repeat("y", 255-len("ü."+name+".")-len(long))
	cfg[KeyTopics] = "Ab.c,ab.c," + long + pad
	qs := []string{"ü." + name + ".Ab.c", "ü." + name + ".ab.c", "ü." + name + "." + long + pad}
	if len(qs[2]) != 255 {
		t.Fatalf("len %d", len(qs[2]))
	}
	other := "ü." + name + ".AB.C"
	cleanupByName(t, b, name, qs...)
	b.declareQueue(other, "quorum")
	b.publish(other, "theirs")
	l := connect.NewMemoryLedger()
	s := startSink(t, cfg, l, &reporter{})
	s.put(rec("Ab.c", 0, 0, "", "1"), rec("ab.c", 0, 0, "", "2"), rec(long+pad, 0, 0, "", "3"))
	s.flush()
	for _, q := range qs {
		if n := b.messages(q); n != 1 {
			t.Errorf("queue %q has %d messages", q, n)
		}
	}
	if err := s.stop(true); err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if b.queueExists(q) {
			t.Errorf("queue %q survived deletion", q)
		}
	}
	if b.messages(other) != 1 {
		t.Error("the case-different queue lost its message or was deleted")
	}
	if rs := listLedger(t, l); len(rs) != 0 {
		t.Errorf("ledger: %v", rs)
	}
}

// With topics.regex the binding key is only known when a topic's first
// record arrives: an over-long one fails the Put naming the key, before the
// queue is created or the binding recorded, so the deletion completes.
func TestOverlongBindingKeyOfRegexTopic(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u)
	delete(cfg, KeyTopics)
	cfg[KeyTopicsRegex] = `long\..*`
	cfg[KeyRoutingKey] = strings.Repeat("r", 250) + "${topic}"
	name := cfg["name"]
	topic := "long.topic"
	cleanupByName(t, b, name, name+"."+topic)
	l := connect.NewMemoryLedger()
	s := startSink(t, cfg, l, &reporter{})
	err := s.task.Put(ctxT(t), []connect.SinkRecord{rec(topic, 0, 0, "", "x")})
	if err == nil || !strings.Contains(err.Error(), KeyRoutingKey) {
		t.Errorf("Put = %v, want an error naming %s", err, KeyRoutingKey)
	}
	if b.queueExists(name + "." + topic) {
		t.Error("the queue of a topic whose binding key cannot be sent was created")
	}
	if err := s.stop(true); err != nil {
		t.Errorf("deletion failed: %v", err)
	}
	if rs := listLedger(t, l); len(rs) != 0 {
		t.Errorf("ledger after deletion: %v", rs)
	}
}

// With cleanup.on.delete=false a deletion only hands the objects over (it
// releases the ledger entries): a cleanup-only instance must finish it while
// the broker is unreachable. Before, its Start dialled the broker and
// failed, so the runtime never got to Stopped with the deletion, and a
// connector on a decommissioned broker could not be deleted at all.
func TestHandOverNeedsNoBroker(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	vhost, vurl := testVhost(t, u)
	cfg := baseConfig(t, vurl, "t")
	cfg[KeyCleanupOnDelete] = "false"
	l := connect.NewMemoryLedger()
	s := startSink(t, cfg, l, &reporter{})
	if err := s.stop(false); err != nil {
		t.Fatal(err)
	}
	if len(listLedger(t, l)) == 0 {
		t.Fatal("nothing owned: the test proves nothing")
	}
	ctl(t, "delete_vhost", vhost) // the broker is gone for this connector
	c := &Connector{}
	h := testHost(cfg["name"], -1, l, nil)
	h.CleanupOnly = true
	ctx := connect.WithHost(ctxT(t), h)
	if err := c.Start(ctx, cfg); err != nil {
		t.Errorf("cleanup-only Start: %v", err)
	}
	c.Stop(true)
	if err := c.Stopped(ctx); err != nil {
		t.Errorf("cleanup-only Stopped: %v", err)
	}
	if rs := listLedger(t, l); len(rs) != 0 {
		t.Errorf("ledger after the hand-over: %v", rs)
	}
}

// A queue name over 255 bytes or starting with amq. from a fixed topic list
// is reported by Validate under rabbitmq.queue; before, only Start found it,
// after it had created the exchange.
func TestValidateNamesAnOverlongQueue(t *testing.T) {
	cfg := connect.Config{"name": "c", "connector.class": Class, KeyURL: "amqp://h/", KeyTopics: "a," + strings.Repeat("q", 256)}
	errs := (&Connector{}).Validate(context.Background(), cfg)
	if len(errs[KeyQueue]) == 0 {
		t.Errorf("Validate = %v, want an error under %s", errs, KeyQueue)
	}
	cfg[KeyTopics] = "a"
	cfg[KeyQueue] = "amq.${topic}"
	if errs := (&Connector{}).Validate(context.Background(), cfg); len(errs[KeyQueue]) == 0 {
		t.Errorf("Validate = %v, want an error under %s for an amq. queue", errs, KeyQueue)
	}
	delete(cfg, KeyQueue)
	cfg[KeyTopics] = "a,b"
	if errs := (&Connector{}).Validate(context.Background(), cfg); len(errs) != 0 {
		t.Errorf("Validate of a good configuration = %v", errs)
	}
}

// A binding handed over by a deletion with cleanup.on.delete=false stays
// when a later connector of the same name, using the kept exchange and
// queue, is deleted. Before, both made the same binding (same exchange,
// queue, key and owner argument: the connector name), so the second
// deletion removed the one the first had handed over, and messages to the
// kept exchange were no longer routed to the kept queue.
func TestHandedOverBindingSurvivesALaterConnectorOfTheSameName(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	vhost, vurl := testVhost(t, u)
	first := baseConfig(t, vurl, "t")
	first[KeyCleanupOnDelete] = "false"
	s := startSink(t, first, connect.NewMemoryLedger(), &reporter{})
	if err := s.stop(true); err != nil {
		t.Fatalf("deleting the first connector: %v", err)
	}
	name, queue := first["name"], first["name"]+".t"
	kept := func() []string {
		var out []string
		for _, line := range strings.Split(bindings(t, vhost), "\n") {
			if f := strings.Split(line, "\t"); len(f) >= 4 && f[0] == name && f[1] == queue && strings.Contains(f[3], OwnerArg) {
				out = append(out, line)
			}
		}
		return out
	}
	handedOver := kept()
	if len(handedOver) != 1 {
		t.Fatalf("after the hand-over, bindings from %q to %q: %q, want one", name, queue, handedOver)
	}

	second := first.Clone()
	second[KeyCleanupOnDelete] = "true"
	l := connect.NewMemoryLedger()
	s = startSink(t, second, l, &reporter{})
	if n := len(kept()); n != 2 {
		t.Errorf("the later connector made %d marked bindings in all, want its own next to the handed-over one", n)
	}
	if err := s.stop(true); err != nil {
		t.Fatalf("deleting the later connector: %v", err)
	}
	if got := kept(); !slices.Equal(got, handedOver) {
		t.Errorf("after deleting the later connector, marked bindings %q, want the handed-over %q", got, handedOver)
	}
	if rs := listLedger(t, l); len(rs) != 0 {
		t.Errorf("ledger after the deletion: %v", rs)
	}
}
