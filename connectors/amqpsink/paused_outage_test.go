package amqpsink

import (
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPausedTaskOutlastsTheReconnectTimeout: a connector paused while
// RabbitMQ is away (maintenance: the usual reason to pause it) with a
// message still waiting for its confirm. While paused, only the periodic
// Flush runs; it tries to reconnect and, once rabbitmq.reconnect.timeout.ms
// ("how long a running task keeps reconnecting") has passed, returns the
// error. A paused task is not running: it must stay PAUSED (Kafka Connect
// never fails a task on a flush/preCommit error), and once resumed with the
// broker back, deliver the message and commit it.
func TestPausedTaskOutlastsTheReconnectTimeout(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	proxy, purl := newAMQPProxy(t, u)
	e := newWorkerEnv(t)
	cfg := baseConfig(t, purl)
	name := cfg["name"]
	topic := name + "-t"
	queue := name + "." + topic
	cfg[KeyTopics] = topic
	cfg[KeyQueueType] = "classic"
	cfg[KeyReconnectTimeout] = "1000"
	cleanupByName(t, b, name, queue)
	e.createTopics(1, topic)
	ids := e.start(cfg)
	t.Cleanup(func() {
		proxy.unblock()
		proxy.up()
		for range e.w.StopTasks(ctxT(t), ids, true) {
		}
		if err := e.w.StopConnector(ctxT(t), name, true); err != nil {
			t.Errorf("deleting connector: %v", err)
		}
	})
	state := func() worker.State { st, _ := e.w.TaskStatus(ids[0]); return st.State }
	if !eventually(30*time.Second, func() bool { return state() == worker.StateRunning }) {
		t.Fatal("task did not start")
	}
	proxy.block("review: hold the confirm")
	e.produce(&kgo.Record{Topic: topic, Partition: 0, Value: []byte("v0")})
	time.Sleep(2 * time.Second) // polled, put and published; no confirm

	e.w.SetTargetState(name, worker.TargetPaused)
	if !eventually(10*time.Second, func() bool { return state() == worker.StatePaused }) {
		t.Fatalf("task is %s, want PAUSED", state())
	}
	proxy.down()
	// Several flushes (every 100 ms), well past the reconnect timeout.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if st, _ := e.w.TaskStatus(ids[0]); st.State != worker.StatePaused {
			t.Fatalf("paused task is %s while RabbitMQ is away (trace %q), want PAUSED", st.State, st.Trace)
		}
		time.Sleep(100 * time.Millisecond)
	}

	proxy.unblock()
	proxy.up()
	e.w.SetTargetState(name, worker.TargetRunning)
	if !eventually(30*time.Second, func() bool { return e.committed(name, topic)[0] == 1 }) {
		st, _ := e.w.TaskStatus(ids[0])
		t.Fatalf("committed %v after the resume with the broker back (task %s, trace %q), want offset 1", e.committed(name, topic), st.State, st.Trace)
	}
	if n := b.messages(queue); n < 1 {
		t.Errorf("%d messages in the queue, want the one put before the pause", n)
	}
}
