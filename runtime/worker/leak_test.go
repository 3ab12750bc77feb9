package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
)

// workerGoroutine reports whether g runs the worker's code or is the life
// of a franz-go client (each client has one metadata loop).
func workerGoroutine(g string) bool {
	return strings.Contains(g, "tidyconnect/tidyconnect/runtime/") ||
		strings.Contains(g, "kgo.(*Client).updateMetadataLoop") ||
		strings.Contains(g, "kgo.(*Client).reapConnectionsLoop")
}

// awaitNoNewWorkerGoroutines waits until no goroutine started since before
// is one of the worker's (see workerGoroutine).
func awaitNoNewWorkerGoroutines(t *testing.T, before map[string]bool, what string) {
	t.Helper()
	testenv.AwaitNoNewGoroutines(t, before, what, 20*time.Second, workerGoroutine)
}

// reportingStartSink is a sample sink whose task reports an errant record
// during Start (Host.Errors is the task's from Start on) and then fails.
const reportingStartSink = "reporting-start-sink"

type reportingStartTask struct{ connect.SinkTask }

func (r *reportingStartTask) Start(ctx context.Context, cfg connect.Config) error {
	h := connect.HostFrom(ctx)
	rec := connect.SinkRecord{Topic: "in", Partition: 0, Offset: 0, Value: []byte("bad")}
	if err := h.Errors.Report(ctx, rec, errors.New("undeliverable")); err != nil {
		return err
	}
	return errors.New("reporting-start-sink: Start fails after a Report")
}

func leakPlugins(t *testing.T, rec *sampleconn.Recorder) *plugins.Registry {
	ps := sampleconn.Plugins(rec)
	sink := ps[1]
	reg, err := plugins.New(append(ps, connect.Plugin{
		Class:        reportingStartSink,
		NewConnector: sink.NewConnector,
		NewTask:      func() connect.Task { return &reportingStartTask{sink.NewTask().(connect.SinkTask)} },
	})...)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// A sink task that reported an errant record to the dead letter queue
// during Start, then failed to start, leaves no Kafka client behind: the
// DLQ producer goes with the instance even though no loop ever ran.
func TestLeakDLQProducerOfAFailedStart(t *testing.T) {
	rec := sampleconn.NewRecorder()
	e := newEnv(t, WithPlugins(leakPlugins(t, rec)))
	name, dlq := testenv.Unique("leak-dlq-"), testenv.Unique("leak-dlq-topic-")
	e.mu.Lock()
	e.extraTopics = append(e.extraTopics, dlq)
	e.mu.Unlock()
	// The worker's shared admin client is made before the snapshot.
	if _, err := e.w.kafkaAdmin(); err != nil {
		t.Fatal(err)
	}
	before := testenv.GoroutineIDs()
	cfg := sinkConfig(name, testenv.Unique("leak-in-"), KeyConnectorClass, reportingStartSink,
		KeyErrorsTolerance, "all", KeyDLQTopic, dlq, KeyDLQReplicationFactor, "1")
	if _, err := e.startTask(cfg, 0); err == nil {
		t.Fatal("StartTask succeeded; want Start's error")
	}
	awaitNoNewWorkerGoroutines(t, before, "a sink task whose Start failed")
}

// Tasks on every failure path (Start fails, Poll/Put fail, a Stop during a
// blocked Poll and Put, a Put blocked reporting to a DLQ, a topics.regex
// sink) and a connector whose Start ignores its context leave nothing
// behind once Close returned.
func TestLeakCloseAfterFailurePaths(t *testing.T) {
	e := newEnv(t, WithGracefulTimeout(2*time.Second))
	// The sinks read topic; the sources write to their own.
	topic, srcTopic := testenv.Unique("leak-t-"), testenv.Unique("leak-src-")
	e.mu.Lock()
	e.extraTopics = append(e.extraTopics, topic, srcTopic)
	e.mu.Unlock()
	produce(t, e.brokers, topic, 5, func(i int) string { return "v" })
	before := testenv.GoroutineIDs()

	failStart := testenv.Unique("leak-fs-")
	if _, err := e.startTask(sourceConfig(failStart, srcTopic, sampleconn.KeyFailStart, "true"), 0); err == nil {
		t.Fatal("want Start to fail")
	}
	failPoll := testenv.Unique("leak-fp-")
	if _, err := e.startTask(sourceConfig(failPoll, srcTopic, sampleconn.KeyFailAfter, "3"), 0); err != nil {
		t.Fatal(err)
	}
	failPut := testenv.Unique("leak-fpu-")
	if _, err := e.startTask(sinkConfig(failPut, topic, sampleconn.KeyFailAfter, "0"), 0); err != nil {
		t.Fatal(err)
	}
	blockedSrc := testenv.Unique("leak-bs-")
	bsID, err := e.startTask(sourceConfig(blockedSrc, srcTopic, sampleconn.KeyBlock, sampleconn.BlockUntilCtx, sampleconn.KeyBlockAfter, "2"), 0)
	if err != nil {
		t.Fatal(err)
	}
	blockedSink := testenv.Unique("leak-bk-")
	bkID, err := e.startTask(sinkConfig(blockedSink, topic, sampleconn.KeyBlock, sampleconn.BlockUntilCtx, sampleconn.KeyBlockAfter, "1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	regex := testenv.Unique("leak-rx-")
	if _, err := e.startTask(sinkConfig(regex, "", KeyTopics, "", KeyTopicsRegex, topic+".*"), 0); err != nil {
		t.Fatal(err)
	}
	errant, dlq := testenv.Unique("leak-er-"), testenv.Unique("leak-dlq-")
	e.mu.Lock()
	e.extraTopics = append(e.extraTopics, dlq)
	e.mu.Unlock()
	if _, err := e.startTask(sinkConfig(errant, topic, sampleconn.KeyErrant, "v", KeyErrorsTolerance, "all",
		KeyDLQTopic, dlq, KeyDLQReplicationFactor, "1"), 0); err != nil {
		t.Fatal(err)
	}
	slowConn := testenv.Unique("leak-sc-")
	sctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.w.StartConnector(sctx, ConnectorRun{Name: slowConn, Config: sourceConfig(slowConn, srcTopic, sampleconn.KeyBlockStart, sampleconn.BlockIgnoreCtx), Ledger: e.ledger}); err == nil {
		t.Fatal("want StartConnector to give up")
	}
	e.await("the failures and the blocked calls", func() bool {
		s1, _ := e.lastEvent(failPoll, 0)
		s2, _ := e.lastEvent(failPut, 0)
		return s1.State == StateFailed && s2.State == StateFailed &&
			strings.Contains(strings.Join(e.rec.CallsOf(sampleconn.TaskInstance(errant, 0)), ","), "Report")
	})
	for id, err := range e.w.StopTasks(e.ctx(), []TaskID{bsID, bkID}, false) {
		if err != nil {
			t.Errorf("StopTasks %v: %v", id, err)
		}
	}
	e.rec.ReleaseBlocked()
	ctx, cancelClose := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelClose()
	if err := e.w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	awaitNoNewWorkerGoroutines(t, before, "Close")
}

// A StartConnector racing Close: an instance Close did not stop must not
// have been started. Close lists the instances under the worker's lock;
// one registered before that must be stopped by Close (its Start awaited,
// then Stop and Stopped), one after is refused with ErrClosed. The window
// was a few instructions wide (between the listing and the started mark):
// the iterations sweep where Close lands; before the fix a run of them
// usually hit it (a connector RUNNING on a closed worker, never stopped).
func TestLeakStartConnectorRacingClose(t *testing.T) {
	rec := sampleconn.NewRecorder()
	reg, err := plugins.New(sampleconn.Plugins(rec)...)
	if err != nil {
		t.Fatal(err)
	}
	nStarted := 0
	defer func() { t.Logf("%d of the starts won the race", nStarted) }()
	for i := range 20000 {
		w, err := New(WithPlugins(reg), WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("race-%d-%s", i, testenv.Unique(""))
		started := make(chan error, 1)
		go func() {
			started <- w.StartConnector(context.Background(), ConnectorRun{Name: name, Config: sourceConfig(name, "t")})
		}()
		for range i % 40 { // sweeps where Close lands; not a wait for a condition
			runtime.Gosched()
		}
		if err := w.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		startErr := <-started
		if startErr == nil {
			nStarted++
		}
		calls := rec.CallsOf(sampleconn.ConnectorInstance(name))
		if slices.Contains(calls, "Start") && !slices.Contains(calls, "Stopped") {
			t.Fatalf("iteration %d: the connector was started (StartConnector: %v) but Close never stopped it: %v", i, startErr, calls)
		}
	}
}
