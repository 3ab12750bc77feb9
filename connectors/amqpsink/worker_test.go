package amqpsink

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// workerEnv runs amqpsink in the real worker against Kafka (kfake unless
// TIDYCONNECT_TEST_KAFKA_BROKERS is set).
type workerEnv struct {
	t       testing.TB
	brokers []string
	kcl     *kgo.Client
	w       *worker.Worker
	ledger  *connect.MemoryLedger
}

func newWorkerEnv(t testing.TB) *workerEnv {
	t.Helper()
	e := &workerEnv{t: t, brokers: testenv.KafkaBrokers(t), ledger: connect.NewMemoryLedger()}
	reg, err := plugins.New(Plugin())
	if err != nil {
		t.Fatal(err)
	}
	lg := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	e.w, err = worker.New(worker.WithID("amqpsink-test"), worker.WithPlugins(reg), worker.WithOffsetStore(worker.NewMemoryOffsetStore()),
		worker.WithKafka(e.brokers), worker.WithLogger(lg), worker.WithOffsetFlushInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.kcl, err = kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.w.Close(ctx); err != nil {
			t.Errorf("closing the worker: %v", err)
		}
		e.kcl.Close()
	})
	return e
}

func (e *workerEnv) createTopics(partitions int32, topics ...string) {
	e.t.Helper()
	if _, err := kadm.NewClient(e.kcl).CreateTopics(ctxT(e.t), partitions, -1, nil, topics...); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _, _ = kadm.NewClient(e.kcl).DeleteTopics(context.Background(), topics...) })
}

func (e *workerEnv) produce(recs ...*kgo.Record) {
	e.t.Helper()
	if err := e.kcl.ProduceSync(ctxT(e.t), recs...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// start runs the connector and its tasks as the herder would.
func (e *workerEnv) start(cfg connect.Config) []worker.TaskID {
	e.t.Helper()
	name := cfg["name"]
	ctx := ctxT(e.t)
	if err := e.w.StartConnector(ctx, worker.ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger, Target: worker.TargetRunning}); err != nil {
		e.t.Fatal(err)
	}
	tcs, err := e.w.TaskConfigs(ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []worker.TaskID
	for i, tc := range tcs {
		id := worker.TaskID{Connector: name, Task: i}
		if err := e.w.StartTask(ctx, worker.TaskRun{ID: id, ConnectorConfig: cfg, TaskConfig: tc, Ledger: e.ledger, Target: worker.TargetRunning}); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func (e *workerEnv) delete(name string, ids []worker.TaskID) {
	e.t.Helper()
	for id, err := range e.w.StopTasks(ctxT(e.t), ids, true) {
		if err != nil {
			e.t.Errorf("stopping task %v: %v", id, err)
		}
	}
	if err := e.w.StopConnector(ctxT(e.t), name, true); err != nil {
		e.t.Errorf("deleting connector: %v", err)
	}
}

// committed returns the consumer group's committed offsets of topic.
func (e *workerEnv) committed(name, topic string) map[int32]int64 {
	e.t.Helper()
	offs, err := kadm.NewClient(e.kcl).FetchOffsets(ctxT(e.t), "connect-"+name)
	if err != nil {
		return nil
	}
	out := map[int32]int64{}
	for p, o := range offs[topic] {
		out[p] = o.At
	}
	return out
}

func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func TestThroughWorker(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	for _, qt := range []string{"quorum", "classic"} {
		t.Run(qt, func(t *testing.T) {
			e := newWorkerEnv(t)
			cfg := baseConfig(t, u)
			name := cfg["name"]
			ta, tb := name+"-a", name+"-b"
			cfg[KeyTopics] = ta + "," + tb
			cfg[KeyQueueType] = qt
			cfg["tasks.max"] = "2"
			cleanupByName(t, b, name, name+"."+ta, name+"."+tb)
			e.createTopics(2, ta, tb)
			const n = 200
			var recs []*kgo.Record
			for i := range n {
				topic := ta
				if i%4 == 3 {
					topic = tb
				}
				recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % 2), Key: []byte("k" + strconv.Itoa(i)), Value: []byte(fmt.Sprintf("v%d", i)),
					Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(strconv.Itoa(i))}}})
			}
			e.produce(recs...)
			ids := e.start(cfg)
			wantA, wantB := n*3/4, n/4
			got := map[string]bool{}
			for _, d := range b.drainDistinct(name+"."+ta, wantA) {
				if d.Headers[HeaderTopic] != ta || string(asBytes(d.Headers["h"])) != string(d.Body[1:]) {
					t.Errorf("message %s: topic header %v, record header %q", d.Body, d.Headers[HeaderTopic], asBytes(d.Headers["h"]))
				}
				got[string(d.Body)] = true
			}
			for _, d := range b.drainDistinct(name+"."+tb, wantB) {
				if d.Headers[HeaderTopic] != tb {
					t.Errorf("message %s in queue of %s has topic header %v", d.Body, tb, d.Headers[HeaderTopic])
				}
				got[string(d.Body)] = true
			}
			if len(got) != n {
				t.Errorf("%d distinct messages, want %d", len(got), n)
			}
			// The worker commits what Flush reported: everything, eventually.
			if !eventually(30*time.Second, func() bool {
				ca, cb := e.committed(name, ta), e.committed(name, tb)
				return ca[0]+ca[1] == int64(wantA) && cb[0]+cb[1] == int64(wantB)
			}) {
				t.Errorf("committed offsets %v / %v, want sums %d / %d", e.committed(name, ta), e.committed(name, tb), wantA, wantB)
			}
			more := func(from, n int) {
				var rs []*kgo.Record
				for i := from; i < from+n; i++ {
					rs = append(rs, &kgo.Record{Topic: ta, Partition: 0, Value: []byte(fmt.Sprintf("v%d", i))})
				}
				e.produce(rs...)
			}
			qa := name + "." + ta
			// Pause and resume: nothing is dropped, records produced while
			// paused arrive after resuming.
			e.w.SetTargetState(name, worker.TargetPaused)
			if !eventually(30*time.Second, func() bool { st, _ := e.w.TaskStatus(ids[0]); return st.State == worker.StatePaused }) {
				t.Fatal("task did not pause")
			}
			more(n, 10)
			if !b.queueExists(qa) || !b.exchangeExists(name) {
				t.Fatal("pausing dropped the queue or the exchange")
			}
			e.w.SetTargetState(name, worker.TargetRunning)
			b.awaitBodies(qa, n, n+10)
			// STOPPED (or a restart): tasks and connector stop without
			// deletion; the queue keeps its messages.
			b.purge(qa) // redeliveries after the pause (at least once) are not the point here
			more(n+10, 10)
			if !eventually(30*time.Second, func() bool { return b.messages(qa) >= 10 }) {
				t.Fatalf("queue has %d messages, want at least 10", b.messages(qa))
			}
			for id, err := range e.w.StopTasks(ctxT(t), ids, false) {
				if err != nil {
					t.Errorf("stopping %v: %v", id, err)
				}
			}
			if err := e.w.StopConnector(ctxT(t), name, false); err != nil {
				t.Fatal(err)
			}
			before := b.messages(qa)
			if !b.queueExists(qa) || !b.exchangeExists(name) || before < 10 {
				t.Fatalf("after a plain stop: queue exists %v, exchange exists %v, messages %d (want true, true, >= 10)", b.queueExists(qa), b.exchangeExists(name), before)
			}
			ids = e.start(cfg)
			more(n+20, 5)
			b.awaitBodies(qa, n+10, n+25) // the kept ones and the new ones

			e.delete(name, ids)
			if b.queueExists(name+"."+ta) || b.exchangeExists(name) {
				t.Error("deletion through the worker left the queue or exchange")
			}
			if left := listLedger(t, e.ledger); len(left) != 0 {
				t.Errorf("ledger still lists %v", left)
			}
		})
	}
}

func TestThroughWorkerDeadLetter(t *testing.T) {
	u := testenv.RabbitMQURL(t)
	b := newBroker(t, u)
	e := newWorkerEnv(t)
	cfg := baseConfig(t, u)
	name := cfg["name"]
	topic, dlq := name+"-in", name+"-dlq"
	cfg[KeyTopics] = topic
	cfg[KeyErrorsTolerance] = "all"
	cfg[KeyDLQTopic] = dlq
	cfg["errors.deadletterqueue.context.headers.enable"] = "true"
	q := name + "." + topic
	cleanupByName(t, b, name, q)
	e.createTopics(1, topic, dlq)
	ids := e.start(cfg)
	if !eventually(30*time.Second, func() bool { return b.queueExists(q) }) {
		t.Fatal("the task did not declare its queue")
	}
	b.deleteQueue(q) // from now on nothing is bound: every message is returned
	const n = 20
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(fmt.Sprintf("lost-%d", i))})
	}
	e.produce(recs...)

	cons, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var dead []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(dead) < n && ctx.Err() == nil {
		cons.PollFetches(ctx).EachRecord(func(r *kgo.Record) { dead = append(dead, r) })
	}
	if len(dead) != n {
		t.Fatalf("%d records in the dead-letter topic, want %d", len(dead), n)
	}
	for _, r := range dead {
		var reason string
		for _, h := range r.Headers {
			if h.Key == "__connect.errors.exception.message" {
				reason = string(h.Value)
			}
		}
		if reason == "" || !strings.Contains(reason, "NO_ROUTE") {
			t.Errorf("dead letter %s: error header %q does not say NO_ROUTE", r.Value, reason)
		}
	}
	if !eventually(30*time.Second, func() bool { return e.committed(name, topic)[0] == n }) {
		t.Errorf("committed offset %v, want %d: tolerated records must be committed", e.committed(name, topic), n)
	}
	if st, _ := e.w.TaskStatus(ids[0]); st.State != worker.StateRunning {
		t.Errorf("task state %s (%s), want RUNNING with errors.tolerance=all", st.State, st.Trace)
	}
	e.delete(name, ids)
	if b.exchangeExists(name) {
		t.Error("deletion left the exchange")
	}
}
