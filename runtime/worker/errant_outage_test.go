package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
)

// An errant record reported (here as a sink's Flush reports a nack learnt
// after Put) while no broker answers waits for Kafka, as a DLQ produce and
// a source's topic creation do: the DLQ topic's creation failed at once (a
// refused dial) and so did the task, but only for the first errant record
// after a start.
func TestErrantReportWaitsForKafkaToCreateTheDLQ(t *testing.T) {
	b := startOutageBroker(t)
	e := newEnvOn(t, []string{b.addr})
	name, topic, dlq := testenv.Unique("dlq-wait-"), testenv.Unique("dlq-wait-t-"), testenv.Unique("dlq-wait-dlq-")
	produce(t, e.brokers, topic, 2, func(i int) string { return fmt.Sprint(i) })
	id, err := e.startTask(sinkConfig(name, topic, KeyErrorsTolerance, "all", KeyDLQTopic, dlq), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.await("2 records put", func() bool { return len(e.rec.Sunk(name)) >= 2 })
	e.w.mu.Lock()
	reporter := e.w.tasks[id].host.Errors
	e.w.mu.Unlock()
	b.down()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- reporter.Report(ctx, connect.SinkRecord{Topic: topic, Offset: 1, Value: []byte("errant")}, errors.New("nacked"))
	}()
	select {
	case err := <-done:
		b.up()
		t.Fatalf("Report while Kafka is away returned %v; want it to wait for Kafka", err)
	case <-time.After(3 * time.Second):
	}
	b.up()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Report once Kafka is back = %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Report did not return once Kafka was back")
	}
	if recs := consume(t, e.brokers, dlq, 1); string(recs[0].Value) != "errant" {
		t.Errorf("dead letter record value %q", recs[0].Value)
	}
	if s, ok := e.w.TaskStatus(id); !ok || s.State != StateRunning {
		t.Errorf("task is %v (%s), want RUNNING", s.State, s.Trace)
	}
}

// A Report whose context ends (a pause or stop cancels Put's) while no
// broker answers returns: franz-go's ProduceSync kept waiting for Kafka
// past its context, so a Put blocked in Report held a pause and got a
// stop abandoned.
func TestErrantReportDuringOutageEndsWithItsContext(t *testing.T) {
	b := startOutageBroker(t)
	e := newEnvOn(t, []string{b.addr})
	name, topic, dlq := testenv.Unique("dlq-cut-"), testenv.Unique("dlq-cut-t-"), testenv.Unique("dlq-cut-dlq-")
	produce(t, e.brokers, topic, 3, func(i int) string {
		if i == 1 {
			return "bad"
		}
		return fmt.Sprint(i)
	})
	id, err := e.startTask(sinkConfig(name, topic, sampleconn.KeyErrant, "bad", KeyErrorsTolerance, "all", KeyDLQTopic, dlq), 0)
	if err != nil {
		t.Fatal(err)
	}
	// The first errant record made the DLQ producer (and topic).
	e.await("2 good records put", func() bool { return len(e.rec.Sunk(name)) >= 2 })
	e.awaitCall(sampleconn.TaskInstance(name, 0)+" Report(1)", 1)
	e.w.mu.Lock()
	reporter := e.w.tasks[id].host.Errors
	e.w.mu.Unlock()
	b.down()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- reporter.Report(ctx, connect.SinkRecord{Topic: topic, Offset: 2, Value: []byte("errant")}, errors.New("nacked"))
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Report = %v, want its context's error", err)
		}
	case <-time.After(10 * time.Second):
		b.up() // lets the stuck Report end
		t.Fatal("Report still blocked 9 s after its context ended")
	}
	b.up()
}

// A stop while Put waits in Report for a DLQ produce Kafka does not
// answer ends within the graceful timeout: the produce ignored the
// cancelled context of Put, which the task was abandoned in.
func TestStopWhilePutReportsToAnUnansweringDLQ(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e := newEnvOn(t, c.ListenAddrs())
	name, topic, dlq := testenv.Unique("dlq-stall-"), testenv.Unique("dlq-stall-t-"), testenv.Unique("dlq-stall-dlq-")
	produce(t, e.brokers, topic, 3, func(i int) string {
		if i == 1 {
			return "bad"
		}
		return fmt.Sprint(i)
	})
	pe := &scriptedEnv{t: t, c: c}
	arrived := pe.stallUntilEnd(kmsg.Produce)
	id, err := e.startTask(sinkConfig(name, topic, sampleconn.KeyErrant, "bad", KeyErrorsTolerance, "all", KeyDLQTopic, dlq, KeyGracefulTimeout, "2000"), 0)
	if err != nil {
		t.Fatal(err)
	}
	pe.stalled(arrived)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.w.StopTasks(ctx, []TaskID{id}, false)[id]; err != nil {
		t.Fatalf("StopTasks = %v; want the stop within the 2 s graceful timeout", err)
	}
	e.checkStoppedLast(sampleconn.TaskInstance(name, 0))
}
