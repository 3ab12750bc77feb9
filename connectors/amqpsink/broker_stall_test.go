package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestBlockedBrokerDoesNotHoldPut: RabbitMQ under a memory or disk alarm
// sends connection.blocked and stops reading from a connection that
// publishes (played here by a proxy: a real alarm is node-wide, and the
// broker is shared). A Put then waits inside a socket write that neither
// Stop nor the Put's context reached: it held the task until the alarm
// cleared. Both now cut it: the connection is closed, the task logs that
// the broker blocked it and why, no unconfirmed record is flushed, and
// after an interrupted Put the records are republished once the broker
// reads again.
func TestBlockedBrokerDoesNotHoldPut(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	for _, tc := range []struct {
		name string
		stop bool // Stop the task; otherwise cancel the Put's context (a pause)
	}{
		{"Stop", true},
		{"context cancelled", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBroker(t, u)
			proxy, purl := newAMQPProxy(t, u)
			cfg := baseConfig(t, purl, "big")
			cfg[KeyQueueType] = "classic"
			name := cfg["name"]
			q := name + ".big"
			cleanupByName(t, b, name, q)
			logs := &testenv.SyncBuffer{}
			lg := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			s, err := tryStartSinkLogged(t, cfg, connect.NewMemoryLedger(), &reporter{}, lg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("task log:\n%s", logs.String())
				}
			})
			tp := connect.TopicPartition{Topic: "big", Partition: 0}
			s.put(rec("big", 0, 0, "", "v0"))
			if o := s.flush()[tp]; o != 1 {
				t.Fatalf("flushed offset %d before the block, want 1", o)
			}

			const reason = "low on memory (played by the test's proxy)"
			proxy.block(reason)
			// More than the sockets between the task and the proxy hold.
			const n = 40
			body := strings.Repeat("x", 512<<10)
			var recs []connect.SinkRecord
			for i := int64(1); i <= n; i++ {
				recs = append(recs, rec("big", 0, i, "", body))
			}
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.task.Put(ctx, recs) }()
			returned := false
			t.Cleanup(func() {
				if !returned { // let the write fail, so the Put ends
					proxy.Close()
					<-done
				}
			})
			if !eventually(30*time.Second, publishStuckInWrite) {
				t.Fatal("the Put never waited in a socket write while the proxy read nothing")
			}
			if tc.stop {
				s.task.Stop(false)
			} else {
				cancel()
			}
			select {
			case err = <-done:
				returned = true
			case <-time.After(20 * time.Second):
				t.Fatal("Put still waits in a socket write 20 s after it was interrupted (the broker blocks the connection)")
			}
			if !strings.Contains(logs.String(), "blocked the connection") || !strings.Contains(logs.String(), reason) {
				t.Errorf("the task did not log that the broker blocked the connection, with the reason %q", reason)
			}

			if tc.stop {
				if err != nil {
					t.Errorf("Put interrupted by Stop = %v, want nil", err)
				}
				// The final Flush after Stop reports nothing unconfirmed.
				fctx, fcancel := context.WithTimeout(context.Background(), 2*time.Second)
				offs, err := s.task.Flush(fctx)
				fcancel()
				if err != nil {
					t.Fatal(err)
				}
				if o := offs[tp]; o != 1 {
					t.Errorf("final Flush reported offset %d, want 1: records the broker never confirmed were flushed", o)
				}
				if err := s.stop(true); err != nil {
					t.Fatal(err)
				}
				return
			}

			if !errors.Is(err, context.Canceled) {
				t.Errorf("Put with its context cancelled = %v, want context.Canceled", err)
			}
			proxy.unblock()
			// The runtime puts the batch again after a pause: the task
			// reconnects and republishes what the cut connection left
			// unconfirmed, and publishes the rest.
			s.put(recs...)
			if o := s.flush()[tp]; o != n+1 {
				t.Errorf("flushed offset %d after the broker read again, want %d", o, n+1)
			}
			seen := map[string]bool{}
			for _, d := range b.drainDistinct(q, n+1) {
				seen[d.MessageId] = true
			}
			for i := range n + 1 {
				if id := fmt.Sprintf("big-0-%d", i); !seen[id] {
					t.Errorf("record %s never arrived", id)
				}
			}
			if err := s.stop(true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRepublishRefusedEveryTimeBacksOff: a broker that closes the channel
// on every publish, for a reason the task does not classify as fatal (here
// 404: a proxy sends every publish to a missing exchange), let every
// reconnect succeed and every republish fail at once: the task reconnected
// in a tight loop, without backoff, and never failed, since the reconnect
// timeout only counted failed dials. The reconnects now back off and the
// task fails after rabbitmq.reconnect.timeout.ms, naming the broker's
// reason.
func TestRepublishRefusedEveryTimeBacksOff(t *testing.T) {
	proxy, s, _, _ := proxiedSink(t, "poison", "3000")
	defer func() { _ = s.stop(true) }()
	proxy.misroute(testenv.Unique("tc-missing-"))
	before := proxy.connections()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := s.task.Put(ctx, []connect.SinkRecord{rec("poison", 0, 0, "", "x")})
	if err == nil {
		_, err = s.task.Flush(ctx)
	}
	dials := proxy.connections() - before
	t.Logf("%d reconnects, %d connections, err: %v", s.task.reconnects, dials, err)
	if err == nil || !strings.Contains(err.Error(), KeyReconnectTimeout) || !strings.Contains(err.Error(), "404") {
		t.Errorf("Put/Flush with every republish refused = %v, want a failure naming %s and the broker's 404", err, KeyReconnectTimeout)
	}
	// 3 s of backoff from 100 ms is about 6 connections; without it there
	// were hundreds.
	if dials > 15 {
		t.Errorf("%d connections while every republish was refused: the reconnects do not back off", dials)
	}
}

// TestOutageGoesOn: whether the loss of a session continues the latest
// outage (its backoff, and its start, from which the reconnect timeout
// counts) or starts a fresh one. Only a session opened by a reconnect that
// republished messages and was lost before the broker answered any of them
// continues it; decision 0051's amendment rejected counting reconnects,
// which made two unrelated outages of a healthy task add up.
func TestOutageGoesOn(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name  string
		first bool // no outage yet
		lost  *session
		want  bool
	}{
		{"first outage", true, &session{republished: 3, opened: now, lost: now}, false},
		{"no session: the last reconnect was interrupted (reconnect continues the outage, trying at once)", false, nil, false},
		{"republished, nothing answered", false, &session{republished: 3, opened: now, lost: now.Add(10 * time.Millisecond)}, true},
		{"republished and answered: healthy in between", false, &session{republished: 3, answered: true, opened: now, lost: now}, false},
		{"nothing republished: idle between two outages", false, &session{opened: now, lost: now}, false},
		{"cut by the task after a stop or the end of a call", false, &session{republished: 3, cut: true, opened: now, lost: now}, false},
		// Blocked for longer than the reconnect timeout, then dropped (the
		// broker restarted): the broker is worth trying again at once.
		{"republished, nothing answered, but it lived long", false, &session{republished: 3, opened: now, lost: now.Add(time.Minute)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := &Task{}
			if !tc.first {
				task.out = outage{since: time.Now(), backoff: time.Second}
			}
			if got, _ := task.outageGoesOn(tc.lost); got != tc.want {
				t.Errorf("outageGoesOn = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTwoOutagesCloseTogetherDoNotAddUp (a guard for the rule above, not a
// reproduction: it passed before too): two outages of 2 s each, with the
// broker confirming the republished records in between, do not fail a task
// whose reconnect timeout is 3 s.
func TestTwoOutagesCloseTogetherDoNotAddUp(t *testing.T) {
	proxy, s, b, queue := proxiedSink(t, "twice", "3000")
	defer func() { _ = s.stop(true) }()
	tp := connect.TopicPartition{Topic: "twice", Partition: 0}
	next := int64(0)
	for outage := 1; outage <= 2; outage++ {
		s.put(rec("twice", 0, next, "", fmt.Sprint("v", next)))
		next++
		proxy.down()
		done := make(chan error, 1)
		go func() {
			err := s.task.Put(ctxT(t), []connect.SinkRecord{rec("twice", 0, next, "", fmt.Sprint("v", next))})
			if err == nil {
				_, err = s.task.Flush(ctxT(t))
			}
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("Put/Flush returned (%v) while the broker was unreachable", err)
		case <-time.After(2 * time.Second): // the outage
		}
		proxy.up()
		if err := <-done; err != nil {
			t.Fatalf("outage %d: %v", outage, err)
		}
		next++
		if o := s.flush()[tp]; o != next {
			t.Fatalf("after outage %d: flushed offset %d, want %d", outage, o, next)
		}
	}
	b.awaitBodies(queue, 0, int(next))
}

// A session that republished and then waited, blocked, longer than the
// reconnect timeout before the connection dropped (a memory alarm that
// ended in a broker restart) starts a fresh outage: the task reconnects to
// the broker that is back instead of failing without a single attempt.
func TestLongBlockThenDropReconnects(t *testing.T) {
	proxy, s, _, _ := proxiedSink(t, "blk", "2000")
	defer func() { proxy.unblock(); _ = s.stop(true) }()

	s.put(rec("blk", 0, 0, "", "v0"))
	s.flush()
	proxy.block("memory alarm")
	s.put(rec("blk", 0, 1, "", "v1"))
	proxy.down()
	awaitSessionGone(t, s.task)
	proxy.up()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The reconnect republishes v1 onto a connection the broker (still
	// blocking) never answers.
	if err := s.task.Put(ctx, []connect.SinkRecord{rec("blk", 0, 2, "", "v2")}); err != nil {
		t.Fatalf("Put after the first drop: %v", err)
	}
	time.Sleep(2500 * time.Millisecond) // time itself is the condition: the block outlasts the 2 s reconnect timeout
	proxy.down()
	awaitSessionGone(t, s.task)
	proxy.unblock()
	proxy.up()
	if err := s.task.Put(ctx, []connect.SinkRecord{rec("blk", 0, 3, "", "v3")}); err != nil {
		t.Fatalf("Put once the broker is back: %v", err)
	}
	if got := s.flush(); got[connect.TopicPartition{Topic: "blk", Partition: 0}] != 4 {
		t.Errorf("flushed %v, want every record confirmed (offset 4)", got)
	}
}

func awaitSessionGone(t *testing.T, task *Task) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for task.live() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the task did not notice the drop")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// proxiedSink starts a sink task on topic whose connection goes through an
// in-test AMQP proxy, with the given reconnect timeout (ms).
// It returns the proxy, the sink, the test's broker view and the topic's
// queue.
func proxiedSink(t *testing.T, topic, reconnectTimeout string) (*amqpProxy, *sink, *broker, string) {
	t.Helper()
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	proxy, purl := newAMQPProxy(t, u)
	cfg := baseConfig(t, purl, topic)
	cfg[KeyReconnectTimeout] = reconnectTimeout
	name := cfg["name"]
	cleanupByName(t, b, name, name+"."+topic)
	return proxy, startSink(t, cfg, connect.NewMemoryLedger(), &reporter{}), b, name + "." + topic
}

// A Put whose context ends while its last publish is stuck in a blocked
// write returns the context's error (the record stays in the backlog), not
// nil as if it had been published.
func TestCancelCutsTheLastPublish(t *testing.T) {
	proxy, s, _, _ := proxiedSink(t, "last", "300000")
	defer func() { proxy.unblock(); _ = s.stop(true) }()
	s.put(rec("last", 0, 0, "", "v0"))
	s.flush()
	proxy.block("memory alarm")
	body := strings.Repeat("x", 24<<20) // larger than every socket buffer on the way
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.task.Put(ctx, []connect.SinkRecord{rec("last", 0, 1, "", body)}) }()
	if !eventually(30*time.Second, publishStuckInWrite) {
		t.Fatal("the publish never got stuck in a write")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Put = %v, want context.Canceled (the record was not published)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the Put was not cut")
	}
}

// Stop ends a Put that waits for the provisioning lock (another connector
// holds it while the task declares a new topic's queue) without cutting the
// healthy session connection: that wait is not I/O on the session.
func TestStopDuringProvisionLockWait(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	_, vurl := testVhost(t, u)
	cfg := baseConfig(t, vurl)
	delete(cfg, KeyTopics)
	cfg[KeyTopicsRegex] = `ev\..*`
	logs := &testenv.SyncBuffer{}
	lg := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := tryStartSinkLogged(t, cfg, connect.NewMemoryLedger(), &reporter{}, lg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.stop(true) }()
	s.put(rec("ev.a", 0, 0, "", "a0"))
	s.flush()
	holder, err := amqp.Dial(vurl) // another connector holds the provisioning lock
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	hch, err := holder.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hch.QueueDeclare(ProvisionLockQueue, false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.task.Put(context.Background(), []connect.SinkRecord{rec("ev.b", 0, 0, "", "b0")}) }()
	// Nothing observable says the Put reached the lock wait: give it the
	// moment a dial and a refused declare take.
	time.Sleep(300 * time.Millisecond)
	s.task.Stop(false)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Put interrupted by Stop: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not end the wait for the provisioning lock")
	}
	if strings.Contains(logs.String(), "closing the connection") {
		t.Errorf("the healthy session connection was cut; the wait was for the provisioning lock:\n%s", logs.String())
	}
}

// A Put whose context is already cancelled (a pause, a stop) publishes
// nothing more of its batch; the batch put again afterwards is delivered
// once.
func TestCancelledPutPublishesNoMore(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	cfg := baseConfig(t, u, "paused")
	name := cfg["name"]
	cleanupByName(t, b, name, name+".paused")
	s := startSink(t, cfg, connect.NewMemoryLedger(), &reporter{})
	defer func() { _ = s.stop(true) }()
	s.put(rec("paused", 0, 0, "", "v0")) // the queue exists
	s.flush()
	batch := []connect.SinkRecord{rec("paused", 0, 1, "", "v1"), rec("paused", 0, 2, "", "v2")}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.task.Put(ctx, batch); !errors.Is(err, context.Canceled) {
		t.Errorf("Put with a cancelled context: %v, want context.Canceled", err)
	}
	if n := b.messages(name + ".paused"); n != 1 {
		t.Errorf("%d messages in the queue after the cancelled Put, want 1 (nothing of its batch)", n)
	}
	s.put(batch...)
	if got := s.flush()[connect.TopicPartition{Topic: "paused", Partition: 0}]; got != 3 {
		t.Errorf("flushed offset %d after the batch was put again, want 3", got)
	}
	b.awaitBodies(name+".paused", 0, 3)
}
