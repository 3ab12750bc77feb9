package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/kafka"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
)

// event is one StatusListener call.
type event struct {
	connector string
	task      int
	status    Status
}

type env struct {
	t       *testing.T
	rec     *sampleconn.Recorder
	store   *MemoryOffsetStore
	brokers []string
	w       *Worker
	ledger  *connect.MemoryLedger

	mu          sync.Mutex
	events      []event
	extraTopics []string
}

func testLogger() *slog.Logger {
	if os.Getenv("TIDYCONNECT_TEST_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

func newEnv(t *testing.T, opts ...Opt) *env {
	t.Helper()
	return newEnvOn(t, testenv.KafkaBrokers(t), opts...)
}

// newEnvOn is newEnv on the given brokers (a kfake cluster a test controls).
func newEnvOn(t *testing.T, brokers []string, opts ...Opt) *env {
	t.Helper()
	e := &env{t: t, rec: sampleconn.NewRecorder(), store: NewMemoryOffsetStore(), brokers: brokers, ledger: connect.NewMemoryLedger()}
	reg, err := plugins.New(sampleconn.Plugins(e.rec)...)
	if err != nil {
		t.Fatal(err)
	}
	base := []Opt{
		WithID("test-worker"), WithPlugins(reg), WithOffsetStore(e.store), WithKafka(e.brokers),
		WithLogger(testLogger()), WithOffsetFlushInterval(100 * time.Millisecond),
		WithStatusListener(func(c string, task int, s Status) {
			e.mu.Lock()
			e.events = append(e.events, event{c, task, s})
			e.mu.Unlock()
		}),
	}
	e.w, err = New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.rec.ReleaseBlocked()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.w.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		e.dropKafkaObjects(ctx)
	})
	return e
}

// dropKafkaObjects deletes the topics and consumer groups the test's
// connectors used, so a run against a real broker leaves nothing behind
// (the in-process broker is discarded anyway).
func (e *env) dropKafkaObjects(ctx context.Context) {
	e.mu.Lock()
	connectors := map[string]bool{}
	for _, ev := range e.events {
		connectors[ev.connector] = true
	}
	topics := slices.Clone(e.extraTopics)
	e.mu.Unlock()
	var groups []string
	for c := range connectors {
		topics = append(topics, e.w.Topics(c)...)
		groups = append(groups, groupID(c))
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	_, _ = adm.DeleteGroups(ctx, groups...)
	if len(topics) > 0 {
		_, _ = adm.DeleteTopics(ctx, topics...)
	}
}

func deleteTopics(brokers []string, topics ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = kadm.NewClient(cl).DeleteTopics(ctx, topics...)
}

// dropTopic registers a topic the test created itself for deletion.
func (e *env) dropTopic(topics ...string) {
	e.mu.Lock()
	e.extraTopics = append(e.extraTopics, topics...)
	e.mu.Unlock()
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *env) lastEvent(connector string, task int) (Status, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.events) - 1; i >= 0; i-- {
		if ev := e.events[i]; ev.connector == connector && ev.task == task {
			return ev.status, true
		}
	}
	return Status{}, false
}

// awaitTaskState waits until the listener last reported state for the task.
func (e *env) awaitTaskState(id TaskID, state State) Status {
	e.t.Helper()
	ctx := e.ctx()
	for {
		if s, ok := e.lastEvent(id.Connector, id.Task); ok && s.State == state {
			return s
		}
		select {
		case <-ctx.Done():
			s, _ := e.lastEvent(id.Connector, id.Task)
			e.t.Fatalf("task %v: last reported state %+v, want %s", id, s, state)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (e *env) await(what string, pred func() bool) {
	e.t.Helper()
	ctx := e.ctx()
	for !pred() {
		select {
		case <-ctx.Done():
			e.t.Fatalf("timed out waiting for %s; calls: %v", what, e.rec.Calls())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (e *env) awaitCall(call string, n int) {
	e.t.Helper()
	if err := e.rec.AwaitCall(e.ctx(), call, n); err != nil {
		e.t.Fatal(err)
	}
}

func sourceConfig(name, topic string, extra ...string) connect.Config {
	cfg := connect.Config{
		KeyName: name, KeyConnectorClass: sampleconn.SourceClass, KeyTasksMax: "1",
		sampleconn.KeyTopic: topic, KeyOffsetFlushInterval: "100",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		cfg[extra[i]] = extra[i+1]
	}
	return cfg
}

func sinkConfig(name, topic string, extra ...string) connect.Config {
	cfg := connect.Config{
		KeyName: name, KeyConnectorClass: sampleconn.SinkClass, KeyTasksMax: "1",
		KeyTopics: topic, KeyOffsetFlushInterval: "100",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		cfg[extra[i]] = extra[i+1]
	}
	return cfg
}

// startTask starts task 0 of cfg (without a connector instance) and returns
// its id and StartTask's error.
func (e *env) startTask(cfg connect.Config, n int) (TaskID, error) {
	id := TaskID{Connector: cfg[KeyName], Task: n}
	tc := cfg.Clone()
	tc[sampleconn.KeyTaskID] = fmt.Sprint(n)
	return id, e.w.StartTask(e.ctx(), TaskRun{ID: id, ConnectorConfig: cfg, TaskConfig: tc, Ledger: e.ledger, Target: TargetRunning})
}

// checkStoppedLast asserts the contract on an instance's calls: Stopped
// exactly once, and nothing after it.
func (e *env) checkStoppedLast(instance string) {
	e.t.Helper()
	calls := e.rec.CallsOf(instance)
	n := 0
	for _, c := range calls {
		if c == "Stopped" {
			n++
		}
	}
	if n != 1 || calls[len(calls)-1] != "Stopped" {
		e.t.Errorf("%s: Stopped must be called exactly once and last; calls: %v", instance, calls)
	}
}

// produce creates topic (partitions as given by producePartitions, default
// 1) and writes n records value(0)..value(n-1) to partition 0.
func produce(t *testing.T, brokers []string, topic string, n int, value func(i int) string) {
	producePartitions(t, brokers, topic, 1, n, value)
}

func producePartitions(t *testing.T, brokers []string, topic string, partitions int32, n int, value func(i int) string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafka.EnsureTopics(ctx, kadm.NewClient(cl), partitions, -1, topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteTopics(brokers, topic) })
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(value(i))})
	}
	if len(recs) == 0 {
		return
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// consume reads at least n records of topic from the start.
func consume(t *testing.T, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records from %s", len(out), n, topic)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

func groupOffset(t *testing.T, brokers []string, group, topic string, p int32) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := offs.Lookup(topic, p)
	if !ok {
		return -1
	}
	return o.At
}

// awaitGoroutines waits until the goroutine count is back to at most want.
func awaitGoroutines(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= want {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			var ours []string
			for _, g := range strings.Split(string(buf), "\n\n") {
				if strings.Contains(g, "tidyconnect") || strings.Contains(g, "franz-go") {
					ours = append(ours, g)
				}
			}
			t.Fatalf("%d goroutines, want at most %d; ours:\n%s", n, want, strings.Join(ours, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func positions(recs []connect.SourceRecord) []int64 {
	var out []int64
	for _, r := range recs {
		p, _ := sampleconn.Position(r.SourceOffset)
		out = append(out, p)
	}
	return out
}

func seq(from, to int64) []int64 {
	var out []int64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

var _ = slices.Equal[[]int64]

func stickyForTest() kgo.TopicPartitioner { return kgo.StickyKeyPartitioner(nil).ForTopic("t") }

func recordWithPartition(p int32) *kgo.Record { return &kgo.Record{Topic: "t", Partition: p} }

func newProducer(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func produceTo(t *testing.T, cl *kgo.Client, topic string, p int32, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}
