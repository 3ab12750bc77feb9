package amqpsink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/connecttest"
)

func TestConformance(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	_, ctlErr := lookRabbitmqctl()
	if ctlErr != nil && os.Getenv(testenv.RequireEnv) == "1" {
		t.Fatalf("%s=1, but without rabbitmqctl the kit would not check that bindings are removed and connections closed: %v", testenv.RequireEnv, ctlErr)
	}
	subject := connecttest.Subject{
		Plugin: Plugin(),
		Config: func(t testing.TB) connect.Config {
			cfg := baseConfig(t, u, "orders", "payments")
			cleanupByName(t, b, cfg["name"], cfg["name"]+".orders", cfg["name"]+".payments")
			return cfg
		},
		Exists: func(_ context.Context, r connect.Resource) (bool, error) {
			switch r.Kind {
			case KindQueue:
				return b.queueExists(r.Name), nil
			case KindExchange:
				return b.exchangeExists(r.Name), nil
			case KindBinding:
				bd, err := parseBinding(r.Name)
				if err != nil {
					return false, err
				}
				if ctlErr != nil {
					// Without rabbitmqctl a binding lives as long as both ends.
					return b.queueExists(bd.queue) && b.exchangeExists(bd.exchange), nil
				}
				return hasBinding(t, vhostOf(t, u), bd), nil
			case KindBindingOwner:
				// No broker object: it stands for the bindings made with it.
				if ctlErr != nil {
					connector, _, _ := strings.Cut(r.Name, "#")
					return b.exchangeExists(connector), nil
				}
				return strings.Contains(bindings(t, vhostOf(t, u)), r.Name), nil
			}
			return false, fmt.Errorf("unknown kind %q", r.Kind)
		},
		PreExisting: func(t testing.TB, cfg connect.Config) connect.Resource {
			q := cfg["name"] + ".orders"
			b.declareQueue(q, "quorum")
			return connect.Resource{Kind: KindQueue, Name: q, Location: location(u)}
		},
		SinkRecords: func(t testing.TB, cfg connect.Config) []connect.SinkRecord {
			return []connect.SinkRecord{rec("orders", 0, 5, "k", "a"), rec("orders", 1, 9, "", "b"), rec("payments", 0, 0, "", "c"), rec("orders", 0, 6, "", "d")}
		},
		BrokenConfig: func(t testing.TB) connect.Config {
			return baseConfig(t, "amqp://guest:guest@127.0.0.1:1/", "orders")
		},
	}
	if ctlErr == nil {
		subject.Connections = func(_ context.Context, name string) (int, error) { return connections(t, name), nil }
	} else {
		t.Logf("the kit cannot check that connections are closed, nor bindings removed (only their ends): %v", ctlErr)
	}
	connecttest.Run(t, subject)
}

// listLedger returns what the ledger lists, failing the test on an error.
func listLedger(t testing.TB, l connect.Ledger) []connect.Resource {
	t.Helper()
	rs, err := l.List(ctxT(t))
	if err != nil {
		t.Fatalf("listing the ledger: %v", err)
	}
	return rs
}

func hasBinding(t testing.TB, vhost string, bd binding) bool {
	for _, line := range strings.Split(bindings(t, vhost), "\n") {
		f := strings.Split(line, "\t")
		if len(f) >= 4 && f[0] == bd.exchange && f[1] == bd.queue && f[2] == bd.key && strings.Contains(f[3], bd.owner) {
			return true
		}
	}
	return false
}

func TestDelivery(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	for _, tc := range []struct {
		queueType, exchangeType string
	}{
		{"quorum", "topic"},
		{"classic", "topic"},
		{"classic", "direct"},
		{"quorum", "headers"},
	} {
		t.Run(tc.queueType+"-"+tc.exchangeType, func(t *testing.T) {
			cfg := baseConfig(t, u, "orders", "payments")
			cfg[KeyQueueType] = tc.queueType
			cfg[KeyExchangeType] = tc.exchangeType
			cfg[KeyContentType] = "application/json"
			name := cfg["name"]
			qOrders, qPayments := name+".orders", name+".payments"
			cleanupByName(t, b, name, qOrders, qPayments)
			s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
			defer func() {
				if err := s.stop(true); err != nil {
					t.Errorf("delete: %v", err)
				}
			}()
			var recs []connect.SinkRecord
			for i := range 10 {
				r := rec("orders", int32(i%2), int64(100+i/2), fmt.Sprintf("k%d", i), fmt.Sprintf(`{"n":%d}`, i))
				r.Headers = []connect.Header{{Key: "trace", Value: []byte(fmt.Sprintf("t%d", i))}}
				recs = append(recs, r)
			}
			recs = append(recs, rec("payments", 0, 7, "", `{"p":1}`))
			s.put(recs...)
			offs := s.flush()
			want := map[connect.TopicPartition]int64{{Topic: "orders", Partition: 0}: 105, {Topic: "orders", Partition: 1}: 105, {Topic: "payments", Partition: 0}: 8}
			for tp, o := range want {
				if offs[tp] != o {
					t.Errorf("Flush offset for %v = %d, want %d (all: %v)", tp, offs[tp], o, offs)
				}
			}
			got := b.drain(qOrders, 10)
			slices.SortFunc(got, func(a, c amqp.Delivery) int { return strings.Compare(string(a.Body), string(c.Body)) })
			for i, d := range got {
				r := recs[i]
				checks := []struct {
					what      string
					got, want any
				}{
					{"body", string(d.Body), string(r.Value)},
					{"content-type", d.ContentType, "application/json"},
					{"delivery mode", d.DeliveryMode, uint8(amqp.Persistent)},
					{"message-id", d.MessageId, fmt.Sprintf("orders-%d-%d", r.Partition, r.Offset)},
					{"timestamp", d.Timestamp.Unix(), r.Timestamp.Unix()},
					{"header topic", d.Headers[HeaderTopic], "orders"},
					{"header partition", d.Headers[HeaderPartition], r.Partition},
					{"header offset", d.Headers[HeaderOffset], r.Offset},
					{"header key", string(asBytes(d.Headers[HeaderKey])), string(r.Key)},
					{"record header", string(asBytes(d.Headers["trace"])), string(r.Headers[0].Value)},
				}
				for _, c := range checks {
					if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
						t.Errorf("message %d: %s = %v, want %v", i, c.what, c.got, c.want)
					}
				}
			}
			p := b.drain(qPayments, 1)
			if !bytes.Equal(p[0].Body, []byte(`{"p":1}`)) {
				t.Errorf("payments body = %s", p[0].Body)
			}
			if _, ok := p[0].Headers[HeaderKey]; ok {
				t.Errorf("a record without key got a %s header", HeaderKey)
			}
			if n := b.messages(qOrders); n != 0 {
				t.Errorf("queue %s has %d extra messages: a record went to the wrong queue", qOrders, n)
			}
		})
	}
}

func asBytes(v any) []byte {
	switch x := v.(type) {
	case []byte:
		return x
	case string:
		return []byte(x)
	}
	return nil
}

func TestTopicsRegexDeclaresOnFirstSight(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u)
	delete(cfg, KeyTopics)
	cfg[KeyTopicsRegex] = `ev\..*`
	name := cfg["name"]
	cleanupByName(t, b, name, name+".ev.a", name+".ev.b")
	ledger := connect.NewMemoryLedger()
	s := startSink(t, cfg, ledger, &reporter{})
	if b.queueExists(name + ".ev.a") {
		t.Fatal("a queue exists before any record of its topic arrived")
	}
	s.put(rec("ev.a", 0, 0, "", "a"), rec("ev.b", 0, 0, "", "b"), rec("ev.a", 0, 1, "", "a2"))
	s.flush()
	if got := b.drain(name+".ev.a", 2); string(got[1].Body) != "a2" {
		t.Errorf("ev.a second message = %s", got[1].Body)
	}
	b.drain(name+".ev.b", 1)
	rs := listLedger(t, ledger)
	var queues []string
	for _, r := range rs {
		if r.Kind == KindQueue {
			queues = append(queues, r.Name)
		}
	}
	slices.Sort(queues)
	if want := []string{name + ".ev.a", name + ".ev.b"}; !slices.Equal(queues, want) {
		t.Errorf("owned queues = %v, want %v", queues, want)
	}
	if err := s.stop(true); err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		if b.queueExists(q) {
			t.Errorf("queue %s survived deletion", q)
		}
	}
}

// TestLifecycleKeepsAndDeletes: a plain stop keeps queues and messages; a
// deletion drops exactly the owned exchange, queues and bindings; a
// pre-existing queue survives with its messages; a fresh cleanup-only
// instance finishes an interrupted deletion.
func TestLifecycleKeepsAndDeletes(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "mine", "theirs")
	cfg[KeyQueueType] = "classic"
	name := cfg["name"]
	mine, theirs := name+".mine", name+".theirs"
	cleanupByName(t, b, name, mine)
	b.declareQueue(theirs, "classic")
	b.publish(theirs, "before the connector")
	ledger := connect.NewMemoryLedger()

	s := startSink(t, cfg, ledger, &reporter{})
	s.put(rec("mine", 0, 0, "", "m0"), rec("theirs", 0, 0, "", "t0"))
	s.flush()
	if err := s.stop(false); err != nil { // pause / STOPPED / restart look like this
		t.Fatal(err)
	}
	if b.messages(mine) != 1 || b.messages(theirs) != 2 || !b.exchangeExists(name) {
		t.Fatalf("a plain stop lost something: mine=%d theirs=%d exchange=%v", b.messages(mine), b.messages(theirs), b.exchangeExists(name))
	}
	s = startSink(t, cfg, ledger, &reporter{}) // restart
	s.put(rec("mine", 0, 1, "", "m1"))
	s.flush()
	rs := listLedger(t, ledger)
	for _, r := range rs {
		if r.Kind == KindQueue && r.Name == theirs {
			t.Errorf("pre-existing queue %s was recorded as owned", theirs)
		}
	}
	if err := s.stop(false); err != nil {
		t.Fatal(err)
	}

	// A deletion that crashed before Stopped: a fresh instance started only
	// for cleanup must drop everything the ledger lists.
	c := &Connector{}
	h := testHost(name, -1, ledger, nil)
	h.CleanupOnly = true
	ctx := connect.WithHost(ctxT(t), h)
	if err := c.Start(ctx, cfg); err != nil {
		t.Fatalf("cleanup-only Start: %v", err)
	}
	c.Stop(true)
	if err := c.Stopped(ctx); err != nil {
		t.Fatalf("cleanup-only Stopped: %v", err)
	}
	if b.queueExists(mine) || b.exchangeExists(name) {
		t.Errorf("after deletion: owned queue exists=%v, owned exchange exists=%v", b.queueExists(mine), b.exchangeExists(name))
	}
	if !b.queueExists(theirs) {
		t.Fatal("the pre-existing queue was deleted")
	}
	if n := b.messages(theirs); n != 2 {
		t.Errorf("pre-existing queue has %d messages after deletion, want 2", n)
	}
	if left := listLedger(t, ledger); len(left) != 0 {
		t.Errorf("ledger still lists %v", left)
	}
	if _, err := lookRabbitmqctl(); err == nil {
		for _, line := range strings.Split(bindings(t, vhostOf(t, u)), "\n") {
			f := strings.Split(line, "\t")
			if len(f) >= 4 && (f[0] == name || strings.Contains(f[3], OwnerArg)) && strings.Contains(line, name) {
				t.Errorf("a binding of the connector remains: %s", line)
			}
		}
	}
}

func TestCleanupOnDeleteFalseKeepsEverything(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "keep")
	cfg[KeyCleanupOnDelete] = "false"
	name := cfg["name"]
	cleanupByName(t, b, name, name+".keep")
	ledger := connect.NewMemoryLedger()
	s := startSink(t, cfg, ledger, &reporter{})
	s.put(rec("keep", 0, 0, "", "x"))
	s.flush()
	if owned := listLedger(t, ledger); len(owned) == 0 {
		t.Fatal("nothing was owned before the deletion; the test proves nothing")
	}
	if err := s.stop(true); err != nil {
		t.Fatal(err)
	}
	if !b.queueExists(name+".keep") || !b.exchangeExists(name) || b.messages(name+".keep") != 1 {
		t.Error("cleanup.on.delete=false did not keep the exchange, queue and message")
	}
	// The kept objects are handed over: the ledger ends empty, so the
	// runtime can finish the deletion.
	if left := listLedger(t, ledger); len(left) != 0 {
		t.Errorf("cleanup.on.delete=false left ledger entries %v; the deletion could never complete", left)
	}
}

func TestMismatchedObjectFailsStart(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	for _, tc := range []struct {
		name    string
		prepare func(name string)
		want    func(name string) []string
	}{
		{"classic queue where quorum is configured",
			func(name string) { b.declareQueue(name+".t", "classic") },
			func(name string) []string { return []string{name + ".t", "x-queue-type", KeyQueueType} }},
		{"fanout exchange where topic is configured",
			func(name string) {
				if err := b.on(func(ch *amqp.Channel) error {
					return ch.ExchangeDeclare(name, "fanout", true, false, false, false, nil)
				}); err != nil {
					t.Fatal(err)
				}
			},
			func(name string) []string { return []string{`exchange "` + name + `"`, "type", KeyExchangeType} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t, u, "t")
			name := cfg["name"]
			cleanupByName(t, b, name, name+".t")
			tc.prepare(name)
			ledger := connect.NewMemoryLedger()
			_, err := tryStartSink(t, cfg, ledger, nil)
			if err == nil {
				t.Fatal("Start succeeded against an existing object with different arguments")
			}
			for _, want := range tc.want(name) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			// Whatever the failed Start created is owned and goes on deletion;
			// the pre-existing object stays.
			c := &Connector{}
			ctx := connect.WithHost(ctxT(t), testHost(name, -1, ledger, nil))
			_ = c.Start(ctx, cfg)
			c.Stop(true)
			if err := c.Stopped(ctx); err != nil {
				t.Fatal(err)
			}
			if b.queueExists(name+".t") != strings.Contains(tc.name, "queue") {
				t.Errorf("queue exists = %v after deletion", b.queueExists(name+".t"))
			}
			if !strings.Contains(tc.name, "queue") && !b.exchangeExists(name) {
				t.Error("the pre-existing exchange was deleted")
			}
		})
	}
}

func TestUnroutableGoesToErrorReporter(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	for _, tolerate := range []bool{true, false} {
		t.Run(fmt.Sprintf("tolerate=%v", tolerate), func(t *testing.T) {
			cfg := baseConfig(t, u, "lost")
			name := cfg["name"]
			cleanupByName(t, b, name, name+".lost")
			rep := &reporter{tolerate: tolerate}
			s := startSink(t, cfg, connect.NewMemoryLedger(), rep)
			defer func() { _ = s.stop(true) }()
			s.put(rec("lost", 0, 0, "", "ok"))
			s.flush()
			b.deleteQueue(name + ".lost") // now nothing is bound: messages come back
			err := s.task.Put(ctxT(t), []connect.SinkRecord{rec("lost", 0, 1, "", "x"), rec("lost", 0, 2, "", "y")})
			offs, ferr := s.task.Flush(ctxT(t))
			got := rep.got()
			if len(got) == 0 {
				t.Fatalf("no record was reported (Put: %v, Flush: %v)", err, ferr)
			}
			if !strings.Contains(got[0].err.Error(), "NO_ROUTE") || got[0].rec.Offset != 1 {
				t.Errorf("first report = offset %d, %v; want offset 1, NO_ROUTE", got[0].rec.Offset, got[0].err)
			}
			tp := connect.TopicPartition{Topic: "lost", Partition: 0}
			if tolerate {
				if err != nil || ferr != nil || len(got) != 2 || offs[tp] != 3 {
					t.Errorf("tolerated: Put=%v Flush=%v reports=%d offset=%d; want nil, nil, 2, 3", err, ferr, len(got), offs[tp])
				}
			} else {
				if err == nil && ferr == nil {
					t.Error("an undeliverable record with errors.tolerance=none did not fail the task")
				}
				if offs[tp] > 1 {
					t.Errorf("offset %d was flushed past an undelivered record", offs[tp])
				}
			}
		})
	}
}

// TestUnpublishableRecordIsReported: a record whose routing key (here
// from ${key}) exceeds AMQP's 255 bytes, or whose value exceeds the
// broker's max_message_size, cannot be published at all: it is reported
// like an undeliverable one, instead of making the client (or the broker)
// drop the channel and every reconnect republish and fail again. The
// records around them are delivered, once, and the offsets move past them.
func TestUnpublishableRecordIsReported(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "keyed")
	cfg[KeyRoutingKey] = "${topic}.${key}"
	cfg[KeyMaxMessageBytes] = "100"
	name := cfg["name"]
	cleanupByName(t, b, name, name+".keyed")
	rep := &reporter{tolerate: true}
	s := startSink(t, cfg, connect.NewMemoryLedger(), rep)
	defer func() { _ = s.stop(true) }()
	s.put(rec("keyed", 0, 0, "a", "first"), rec("keyed", 0, 1, strings.Repeat("k", 300), "too long"),
		rec("keyed", 0, 2, "c", strings.Repeat("v", 101)), rec("keyed", 0, 3, "b", "last"))
	offs := s.flush()
	got := rep.got()
	if len(got) != 2 || got[0].rec.Offset != 1 || !strings.Contains(got[0].err.Error(), KeyRoutingKey) ||
		got[1].rec.Offset != 2 || !strings.Contains(got[1].err.Error(), KeyMaxMessageBytes) {
		t.Fatalf("reports = %+v, want offset 1 naming %s and offset 2 naming %s", got, KeyRoutingKey, KeyMaxMessageBytes)
	}
	if tp := (connect.TopicPartition{Topic: "keyed", Partition: 0}); offs[tp] != 4 {
		t.Errorf("flushed offset %d, want 4", offs[tp])
	}
	var bodies []string
	for _, d := range b.drain(name+".keyed", 2) {
		bodies = append(bodies, string(d.Body))
	}
	if !slices.Equal(bodies, []string{"first", "last"}) {
		t.Errorf("delivered %v, want [first last] once each", bodies)
	}
	if n := b.messages(name + ".keyed"); n != 0 {
		t.Errorf("%d more messages in the queue: republished", n)
	}
}

func TestMessageIDFitsAShortString(t *testing.T) {
	long := strings.Repeat("t", 249)
	for _, r := range []connect.SinkRecord{rec("orders", 3, 42, "", ""), rec(long, 2147483647, 9223372036854775807, "", ""), rec(long[:1]+long, 0, 0, "", "")} {
		id := messageID(r)
		if len(id) > maxShortString {
			t.Errorf("message-id of topic %d bytes has %d bytes", len(r.Topic), len(id))
		}
		if r.Topic == "orders" && id != "orders-3-42" {
			t.Errorf("message-id %q, want orders-3-42", id)
		}
	}
	if a, b := messageID(rec(long, 0, 1, "", "")), messageID(rec(long[:248]+"u", 0, 1, "", "")); a == b {
		t.Errorf("two long topics share message-id %q", a)
	}
}

// TestConnectionLoss closes every connection of a vhost of its own while
// messages are in flight and checks that every record arrived at least once
// and that no Flush ever reported more than was put.
func TestConnectionLoss(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	rabbitmqctl(t)
	vhost, vurl := testVhost(t, u)
	cfg := baseConfig(t, vurl, "stream")
	cfg[KeyMaxInFlight] = "256"
	name := cfg["name"]
	s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
	tp := connect.TopicPartition{Topic: "stream", Partition: 0}
	const batch, after, limit = 100, 30, 2000
	next := 0
	putBatch := func() {
		var recs []connect.SinkRecord
		for range batch {
			recs = append(recs, rec("stream", 0, int64(next), "", fmt.Sprintf("m%06d", next)))
			next++
		}
		s.put(recs...)
	}
	// Close while messages are in flight. Whether any is unconfirmed at the
	// instant of the close is up to timing, so close again (up to 5 times)
	// until the republish path has run at least once.
	for attempt := 1; s.task.republished == 0; attempt++ {
		if attempt > 5 {
			t.Fatalf("after 5 closes no unconfirmed message was ever republished (%d reconnects)", s.task.reconnects)
		}
		reconnects := s.task.reconnects
		closed := make(chan struct{})
		var closeErr error
		putBatch()
		go func() {
			defer close(closed)
			out, err := exec.Command(rabbitmqctl(t), "close_all_connections", "-p", vhost, "amqpsink connection-loss test").CombinedOutput()
			if err != nil {
				closeErr = fmt.Errorf("%v: %s", err, out)
			}
		}()
		// Stream without waiting for confirms until the close happened, and
		// a while after it; flush now and then as the worker does.
		for extra := 0; extra < after && next < limit*batch; {
			select {
			case <-closed:
				extra++
			default:
			}
			putBatch()
			if next%(50*batch) == 0 {
				if o := s.flush()[tp]; o > int64(next) {
					t.Fatalf("flushed offset %d beyond what was put (%d)", o, next)
				}
			}
		}
		<-closed
		if closeErr != nil {
			t.Fatalf("rabbitmqctl close_all_connections: %v", closeErr)
		}
		if o := s.flush()[tp]; o != int64(next) {
			t.Fatalf("flushed offset = %d after the close, want %d", o, next)
		}
		if s.task.reconnects == reconnects {
			t.Fatal("the task did not reconnect: the connections were not closed mid-stream")
		}
	}
	total := next
	b := newBroker(t, vurl) // after the close, so it is not closed itself
	n := b.messages(name + ".stream")
	if n < total {
		t.Fatalf("queue has %d messages, fewer than the %d records", n, total)
	}
	seen := map[string]bool{}
	for _, d := range b.drain(name+".stream", n) {
		seen[d.MessageId] = true
	}
	for i := range total {
		if id := fmt.Sprintf("stream-0-%d", i); !seen[id] {
			t.Fatalf("record %s never arrived", id)
		}
	}
	t.Logf("%d records, %d messages, %d reconnect(s), %d unconfirmed republished (%d duplicates)", total, n, s.task.reconnects, s.task.republished, n-total)
	if err := s.stop(true); err != nil {
		t.Fatal(err)
	}
}

// TestStopInterruptsReconnect: with the broker gone (its vhost deleted), a
// Flush waiting to reconnect returns promptly when the task is stopped, and
// reports nothing unconfirmed.
func TestStopInterruptsReconnect(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	vhost, vurl := testVhost(t, u)
	cfg := baseConfig(t, vurl, "s")
	s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
	stopped := false
	t.Cleanup(func() {
		if !stopped { // the test failed half-way
			if err := s.stop(false); err != nil {
				t.Errorf("stopping the sink: %v", err)
			}
		}
	})
	s.put(rec("s", 0, 0, "", "a"))
	s.flush()
	ctl(t, "delete_vhost", vhost) // closes the connections; reconnecting fails
	type result struct {
		offs        map[connect.TopicPartition]int64
		putErr, err error
	}
	done := make(chan result, 1)
	ctx := ctxT(t)
	go func() {
		putErr := s.task.Put(ctx, []connect.SinkRecord{rec("s", 0, 1, "", "b")})
		o, err := s.task.Flush(ctx)
		done <- result{o, putErr, err}
	}()
	// Wait until the task noticed, then stop it.
	deadline := time.Now().Add(30 * time.Second)
	for s.task.live() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the task did not notice within 30s that its vhost was deleted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.task.Stop(true)
	select {
	case r := <-done:
		// A stop is no failure: Put and Flush return quietly, and the
		// runtime delivers what was not confirmed again.
		if r.putErr != nil || r.err != nil {
			t.Errorf("Put = %v, Flush = %v after Stop while reconnecting; want both nil", r.putErr, r.err)
		}
		if o := r.offs[connect.TopicPartition{Topic: "s", Partition: 0}]; o > 1 {
			t.Errorf("flushed offset %d includes a record the broker never confirmed", o)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Put/Flush did not return after Stop while reconnecting")
	}
	stopped = true
	if err := s.task.Stopped(ctxT(t)); err != nil {
		t.Errorf("task Stopped: %v", err)
	}
	s.conn.Stop(false)
	if err := s.conn.Stopped(ctxT(t)); err != nil {
		t.Errorf("connector Stopped: %v", err)
	}
}

func TestUnreachableBrokerFailsStartClearly(t *testing.T) {
	cfg := baseConfig(t, "amqp://bob:s3cret@127.0.0.1:1/", "x")
	for _, inst := range []struct {
		name  string
		start func(ctx context.Context) error
	}{
		{"connector", func(ctx context.Context) error { return (&Connector{}).Start(ctx, cfg) }},
		{"task", func(ctx context.Context) error { return (&Task{}).Start(ctx, cfg) }},
	} {
		t.Run(inst.name, func(t *testing.T) {
			err := inst.start(connect.WithHost(ctxT(t), testHost(cfg["name"], 0, connect.NewMemoryLedger(), nil)))
			if err == nil {
				t.Fatal("Start succeeded against a closed port")
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error leaks the password: %v", err)
			}
			for _, want := range []string{KeyURL, "127.0.0.1:1", "bob:xxxxx"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

func TestStoppedClosesConnections(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	rabbitmqctl(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "c")
	name := cfg["name"]
	cleanupByName(t, b, name, name+".c")
	before := runtime.NumGoroutine()
	s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
	s.put(rec("c", 0, 0, "", "x"))
	s.flush()
	if n := connections(t, name); n != 2 {
		t.Errorf("broker lists %d connections named tidyconnect:%s:*, want 2 (connector and task)", n, name)
	}
	if err := s.stop(true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, g := connections(t, name), runtime.NumGoroutine()
		if n == 0 && g <= before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Stopped: %d connections remain, %d goroutines (was %d)", n, g, before)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestStopInterruptsWaitForConfirms suspends the queue's process inside the
// broker (rabbitmqctl eval), so confirms stop coming; a Put blocked on a full
// window must return when the task is stopped, and Flush must report nothing
// unconfirmed.
func TestStopInterruptsWaitForConfirms(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	rabbitmqctl(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "slow")
	cfg[KeyQueueType] = "classic"
	cfg[KeyMaxInFlight] = "2"
	name := cfg["name"]
	q := name + ".slow"
	cleanupByName(t, b, name, q)
	s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
	resume := suspendQueue(t, u, q)

	done := make(chan error, 1)
	go func() {
		var recs []connect.SinkRecord
		for i := range 10 {
			recs = append(recs, rec("slow", 0, int64(i), "", "x"))
		}
		done <- s.task.Put(ctxT(t), recs)
	}()
	if !eventually(30*time.Second, func() bool { return s.task.inflight() == 2 }) {
		t.Fatalf("Put did not fill the window of 2 (in flight: %d)", s.task.inflight())
	}
	select {
	case err := <-done:
		t.Fatalf("Put returned (%v) while the window was full and no confirm came", err)
	case <-time.After(200 * time.Millisecond): // it should be blocked; a wait, not an assertion
	}
	s.task.Stop(false)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Put interrupted by Stop returned %v, want nil (nothing is lost: nothing unconfirmed is flushed)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Put did not return after Stop while waiting for confirms")
	}
	// The final Flush after Stop waits for confirms, but only within its ctx.
	fctx, cancel := context.WithTimeout(context.Background(), time.Second)
	offs, err := s.task.Flush(fctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := offs[connect.TopicPartition{Topic: "slow"}]; ok && o != 0 {
		t.Errorf("Flush reported offset %d with no message confirmed", o)
	}
	// Once confirms flow again, the final Flush reports them.
	resume()
	offs, err = s.task.Flush(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if o := offs[connect.TopicPartition{Topic: "slow"}]; o != 2 {
		t.Errorf("final Flush after the queue resumed reported offset %d, want 2 (the two published records confirmed)", o)
	}
	if err := s.stop(true); err != nil {
		t.Fatal(err)
	}
}

// TestCleanupFailureKeepsLedgerForRetry: when the broker (here: the vhost)
// is unreachable at deletion, Stopped fails naming what remains and keeps the
// ledger; a later cleanup-only instance finishes, counting objects that are
// already gone as deleted.
func TestCleanupFailureKeepsLedgerForRetry(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	vhost, vurl := testVhost(t, u)
	cfg := baseConfig(t, vurl, "gone")
	ledger := connect.NewMemoryLedger()
	s := startSink(t, cfg, ledger, &reporter{})
	owned := listLedger(t, ledger)
	if len(owned) == 0 {
		t.Fatal("the connector owns nothing: the test has no cleanup to fail")
	}
	s.task.Stop(true)
	if err := s.task.Stopped(ctxT(t)); err != nil {
		t.Fatalf("task Stopped: %v", err)
	}
	ctl(t, "delete_vhost", vhost)
	s.conn.Stop(true)
	err := s.conn.Stopped(connect.WithHost(ctxT(t), testHost(s.name, -1, ledger, nil)))
	if err == nil {
		t.Fatal("Stopped reported a successful cleanup while the vhost was gone")
	}
	for _, r := range brokerObjects(owned) {
		if !strings.Contains(err.Error(), r.Name) {
			t.Errorf("cleanup error does not name remaining %v: %v", r, err)
		}
	}
	if left := listLedger(t, ledger); len(left) != len(owned) {
		t.Errorf("a failed cleanup changed the ledger: %v, was %v", left, owned)
	}
	addVhost(t, vhost, u) // the broker is back (empty: the objects are already gone)
	c := &Connector{}
	h := testHost(s.name, -1, ledger, nil)
	h.CleanupOnly = true
	ctx := connect.WithHost(ctxT(t), h)
	if err := c.Start(ctx, cfg); err != nil {
		t.Fatalf("cleanup-only Start: %v", err)
	}
	c.Stop(true)
	if err := c.Stopped(ctx); err != nil {
		t.Fatalf("retried cleanup: %v", err)
	}
	if left := listLedger(t, ledger); len(left) != 0 {
		t.Errorf("retried cleanup left %v in the ledger", left)
	}
}

// TestPublishRefusedFailsTheTask: a user who may declare the queues but not
// publish to the exchange gets its channel closed (403) on the first
// publish. That used to look like a lost connection: reconnect, republish,
// closed again, without end and without backoff. The task now fails,
// saying what permission is missing, and publishes nothing more.
func TestPublishRefusedFailsTheTask(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	vhost, vurl := testVhost(t, u)
	b := newBroker(t, vurl)
	cfg := baseConfig(t, vurl, "denied")
	name := cfg["name"]
	user := "guest"
	if pu, err := url.Parse(u); err == nil && pu.User != nil {
		user = pu.User.Username()
	}
	// Write on the queues (binding needs it), not on the exchange.
	ctl(t, "set_permissions", "-p", vhost, user, ".*", "^"+regexp.QuoteMeta(name)+`\..*`, ".*")
	s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
	defer func() { _ = s.stop(true) }()

	var err error
	deadline := time.Now().Add(30 * time.Second)
	for off := int64(0); err == nil && time.Now().Before(deadline); off++ {
		err = s.task.Put(ctxT(t), []connect.SinkRecord{rec("denied", 0, off, "", "x")})
		if err == nil {
			_, err = s.task.Flush(ctxT(t))
		}
	}
	if err == nil || !strings.Contains(err.Error(), "write permission") || !strings.Contains(err.Error(), "403") {
		t.Fatalf("Put/Flush with publishing refused = %v, want a failure naming the 403 and the write permission", err)
	}
	if n := s.task.reconnects; n > 1 {
		t.Errorf("%d reconnects before failing, want at most 1", n)
	}
	if n := b.messages(name + ".denied"); n != 0 {
		t.Errorf("%d messages arrived although publishing is refused", n)
	}
}

// TestRePutDoesNotRepublish: the runtime puts a batch again after a Put
// that a pause or stop interrupted halfway; the records that Put already
// took are not published a second time, and a batch put again after a
// Put that completed is published again (the consumer went back).
func TestRePutDoesNotRepublish(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "again")
	cfg[KeyMaxInFlight] = "1" // the second record waits for the first's confirm
	name := cfg["name"]
	cleanupByName(t, b, name, name+".again")
	s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
	defer func() { _ = s.stop(true) }()
	batch := func(from int64) []connect.SinkRecord {
		var recs []connect.SinkRecord
		for o := from; o < from+3; o++ {
			recs = append(recs, rec("again", 0, o, "", fmt.Sprint("m", o)))
		}
		return recs
	}
	// A Put with a cancelled context publishes the first record, then
	// stops in the wait for its confirm (almost always: retried with the
	// next offsets when the confirm won the race).
	from := int64(0)
	for ; ; from += 3 {
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.task.Put(cancelled, batch(from)); errors.Is(err, context.Canceled) {
			break
		}
		if from > 30 {
			t.Fatal("no Put was interrupted")
		}
	}
	s.put(batch(from)...) // put again, whole
	s.flush()
	want := int(from) + 3
	seen := map[string]int{}
	for _, d := range b.drain(name+".again", want) {
		seen[string(d.Body)]++
	}
	for o := 0; o < want; o++ {
		if n := seen[fmt.Sprint("m", o)]; n != 1 {
			t.Errorf("m%d delivered %d times, want once", o, n)
		}
	}
	if n := b.messages(name + ".again"); n != 0 {
		t.Errorf("%d more messages: records put again were republished", n)
	}
	// After a complete Put, the same offsets again are a rewind: delivered.
	s.put(batch(from)...)
	s.flush()
	if got := b.drain(name+".again", 3); len(got) != 3 {
		t.Errorf("%d messages after putting completed records again, want 3", len(got))
	}
}

// ctxReporter tolerates every record, but, like the runtime's reporter
// producing to a dead-letter topic, fails when its context is done.
type ctxReporter struct{ reporter }

func (r *ctxReporter) Report(ctx context.Context, rec connect.SinkRecord, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return r.reporter.Report(ctx, rec, err)
}

// TestInterruptedReportIsNotFatal: a report cut short because the call was
// cancelled (a pause cancels Put and Flush) is made again by the next call;
// it does not fail the task for good.
func TestInterruptedReportIsNotFatal(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "paused")
	name := cfg["name"]
	cleanupByName(t, b, name, name+".paused")
	rep := &ctxReporter{reporter{tolerate: true}}
	s := startSink(t, cfg, connect.NewMemoryLedger(), rep)
	defer func() { _ = s.stop(true) }()
	s.put(rec("paused", 0, 0, "", "ok"))
	s.flush()
	b.deleteQueue(name + ".paused") // the next records come back unroutable
	// The broker can return a record before the Put that published it
	// reports its failures at the end: then that Put reports it. Put
	// records until one is still waiting for its report after its Put.
	last := int64(1)
	for ; ; last++ {
		if last > 20 {
			t.Fatal("no unroutable record was left waiting for its report after its Put")
		}
		reported := len(rep.got())
		s.put(rec("paused", 0, last, "", "lost"))
		deadline := time.Now().Add(30 * time.Second)
		for !s.task.pendingFailures() && len(rep.got()) == reported {
			if time.Now().After(deadline) {
				t.Fatal("the unroutable record never came back")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if s.task.pendingFailures() {
			break
		}
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.task.Flush(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Flush with a cancelled context = %v, want context.Canceled", err)
	}
	offs, err := s.task.Flush(ctxT(t))
	if err != nil {
		t.Fatalf("Flush after the interrupted report: %v", err)
	}
	if tp := (connect.TopicPartition{Topic: "paused", Partition: 0}); offs[tp] != last+1 || int64(len(rep.got())) != last {
		t.Errorf("offset %d, reports %d; want %d and %d", offs[tp], len(rep.got()), last+1, last)
	}
}

// TestReconfigurationUnbindsOldQueues: a new queue template binds the new
// queues and removes the connector's bindings of the old ones, which would
// otherwise keep receiving copies; the old queues and their messages stay
// until the connector is deleted.
func TestReconfigurationUnbindsOldQueues(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "moved")
	name := cfg["name"]
	oldQ, newQ := name+".moved", name+".v2.moved"
	cleanupByName(t, b, name, oldQ, newQ)
	l := connect.NewMemoryLedger()
	s := startSink(t, cfg, l, &reporter{})
	s.put(rec("moved", 0, 0, "", "before"))
	s.flush()
	if err := s.stop(false); err != nil {
		t.Fatal(err)
	}

	cfg[KeyQueue] = name + ".v2.${topic}"
	s = startSink(t, cfg, l, &reporter{})
	defer func() { _ = s.stop(true) }()
	s.put(rec("moved", 0, 1, "", "after"))
	s.flush()
	if got := b.drain(newQ, 1); len(got) != 1 || string(got[0].Body) != "after" {
		t.Errorf("new queue got %v, want [after]", got)
	}
	if n := b.messages(oldQ); n != 1 {
		t.Errorf("old queue holds %d messages, want 1 (its own, not a copy of the new one)", n)
	}
	for _, r := range listLedger(t, l) {
		if r.Kind == KindBinding && strings.Contains(r.Name, url.QueryEscape(oldQ)+"&") {
			t.Errorf("the ledger still lists the old binding %v", r)
		}
	}
}
