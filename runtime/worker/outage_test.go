package worker

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/kafka"
)

// outageBroker is an in-process broker that can go away (connections
// refused) and come back on the same address with its data.
type outageBroker struct {
	t    *testing.T
	dir  string
	addr string
	e    *kafka.Embedded
}

func startOutageBroker(t *testing.T) *outageBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &outageBroker{t: t, dir: t.TempDir(), addr: ln.Addr().String()}
	ln.Close()
	b.up()
	t.Cleanup(func() {
		if b.e != nil {
			b.e.Close()
		}
	})
	return b
}

// up starts the broker; the port may take a moment to be free again.
func (b *outageBroker) up() {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		if b.e, err = kafka.StartEmbedded(ctx, b.dir, b.addr, kafka.WithEmbeddedLogger(testLogger())); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.t.Fatal(err)
}

func (b *outageBroker) down() { b.e.Close(); b.e = nil }

// A source task stopped (here: deleted) while Kafka is unreachable, with
// records in flight, ends within the graceful timeout instead of being
// abandoned: after the producer's flush gives up at 9/10 of it, the
// producer's Close must fit in the rest. franz-go's Close waits up to 1 s
// for a final client-metrics push (KIP-714) to a broker it cannot reach.
func TestSourceStopWhileKafkaUnreachableEndsInTime(t *testing.T) {
	b := startOutageBroker(t)
	e := newEnvOn(t, []string{b.addr})
	name, topic := testenv.Unique("unreachable-"), testenv.Unique("unreachable-topic-")
	cfg := sourceConfig(name, topic, sampleconn.KeyCount, "-1", sampleconn.KeyRate, "500", sampleconn.KeyBatch, "10",
		KeyGracefulTimeout, "5000")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.await("records acknowledged", func() bool { return len(e.rec.Committed(name)) >= 50 })
	b.down()
	inst := sampleconn.TaskInstance(name, 0)
	polls := e.rec.CountPrefix(inst + " Poll(")
	// Records polled after the broker went away are in flight.
	e.await("polls while Kafka is away", func() bool { return e.rec.CountPrefix(inst+" Poll(") >= polls+3 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = e.w.StopTasks(ctx, []TaskID{id}, true)[id]
	b.up() // for the cleanup's deletion of topics and groups
	if err != nil {
		t.Fatalf("StopTasks while Kafka is unreachable = %v; want a stop within the 5 s graceful timeout", err)
	}
	e.checkStoppedLast(inst)
}

// A source task whose first record of a topic comes while no broker
// answers waits for Kafka instead of failing: it used to fail once the
// topic's creation timed out (here shortened to 1 s), while records of
// topics it already knew simply waited.
func TestSourceTopicCreationWaitsForKafka(t *testing.T) {
	defer func(was time.Duration) { topicAttemptTimeout = was }(topicAttemptTimeout)
	topicAttemptTimeout = time.Second
	b := startOutageBroker(t)
	e := newEnvOn(t, []string{b.addr})
	name, topic := testenv.Unique("wait-topic-"), testenv.Unique("wait-topic-t-")
	b.down()
	id, err := e.startTask(sourceConfig(name, topic, sampleconn.KeyCount, "20", sampleconn.KeyBatch, "10"), 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.await("a Poll while Kafka is away", func() bool { return e.rec.CountPrefix(inst+" Poll(") >= 1 })
	// Several attempts of a second each, and their backoff.
	time.Sleep(4 * time.Second)
	if s, ok := e.w.TaskStatus(id); !ok || s.State != StateRunning {
		t.Fatalf("while Kafka is away the task is %v (%s), want RUNNING", s.State, s.Trace)
	}
	b.up()
	e.await("the records acknowledged once Kafka is back", func() bool { return len(e.rec.Committed(name)) >= 20 })
	if s, ok := e.w.TaskStatus(id); !ok || s.State != StateRunning {
		t.Errorf("after Kafka came back the task is %v (%s), want RUNNING", s.State, s.Trace)
	}
}
