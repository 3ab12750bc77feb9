package worker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
)

// scriptedConn and scriptedTask: a source connector whose Poll a test
// scripts, recording every call, run by a Worker on a kfake cluster the
// test can control.
type scriptedConn struct{}

func (scriptedConn) Spec() connect.Spec                          { return connect.Spec{Type: connect.TypeSource} }
func (scriptedConn) Start(context.Context, connect.Config) error { return nil }
func (scriptedConn) TaskConfigs(int) ([]connect.Config, error)   { return []connect.Config{{}}, nil }
func (scriptedConn) Stop(bool)                                   {}
func (scriptedConn) Stopped(context.Context) error               { return nil }

type scriptedTask struct {
	mu        sync.Mutex
	poll      func(ctx context.Context, n int) ([]connect.SourceRecord, error)
	polls     int
	committed []connect.SourceRecord
	calls     []string
	stopped   chan struct{}
	stopOnce  sync.Once
}

func (p *scriptedTask) log(s string)                                { p.mu.Lock(); p.calls = append(p.calls, s); p.mu.Unlock() }
func (p *scriptedTask) Start(context.Context, connect.Config) error { p.log("Start"); return nil }
func (p *scriptedTask) Stop(d bool)                                 { p.log(fmt.Sprintf("Stop(%v)", d)) }
func (p *scriptedTask) Stopped(context.Context) error {
	p.log("Stopped")
	p.stopOnce.Do(func() { close(p.stopped) })
	return nil
}
func (p *scriptedTask) Poll(ctx context.Context) ([]connect.SourceRecord, error) {
	p.mu.Lock()
	n := p.polls
	p.polls++
	p.mu.Unlock()
	return p.poll(ctx, n)
}
func (p *scriptedTask) Commit(_ context.Context, acked []connect.SourceRecord) error {
	p.mu.Lock()
	p.committed = append(p.committed, acked...)
	p.calls = append(p.calls, fmt.Sprintf("Commit(%d)", len(acked)))
	p.mu.Unlock()
	return nil
}
func (p *scriptedTask) Committed() []connect.SourceRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]connect.SourceRecord(nil), p.committed...)
}

type scriptedEnv struct {
	t     *testing.T
	c     *kfake.Cluster
	seeds []string
	w     *Worker
	task  *scriptedTask
	store *MemoryOffsetStore
	mu    sync.Mutex
	sts   []Status
}

// newScripted starts a kfake cluster and a Worker hosting one scripted
// source task.
func newScripted(t *testing.T, poll func(ctx context.Context, n int) ([]connect.SourceRecord, error), kopts []kfake.Opt, wopts ...Opt) *scriptedEnv {
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, kopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	pe := &scriptedEnv{t: t, c: c, seeds: c.ListenAddrs(), store: NewMemoryOffsetStore()}
	pe.task = &scriptedTask{poll: poll, stopped: make(chan struct{})}
	reg, err := plugins.New(connect.Plugin{Class: "scripted", NewConnector: func() connect.Connector { return scriptedConn{} }, NewTask: func() connect.Task { return pe.task }})
	if err != nil {
		t.Fatal(err)
	}
	pe.w, err = New(append([]Opt{WithPlugins(reg), WithOffsetStore(pe.store), WithKafka(pe.seeds), WithLogger(testLogger()),
		WithStatusListener(func(_ string, _ int, s Status) { pe.mu.Lock(); pe.sts = append(pe.sts, s); pe.mu.Unlock() })}, wopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := pe.w.Close(ctx); err != nil {
			t.Errorf("closing the worker: %v", err)
		}
	})
	return pe
}

func (pe *scriptedEnv) start(extra ...string) TaskID {
	cfg := connect.Config{KeyName: "p", KeyConnectorClass: "scripted", KeyOffsetFlushInterval: "100"}
	for i := 0; i+1 < len(extra); i += 2 {
		cfg[extra[i]] = extra[i+1]
	}
	id := TaskID{Connector: "p", Task: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pe.w.StartTask(ctx, TaskRun{ID: id, ConnectorConfig: cfg, TaskConfig: connect.Config{}, Target: TargetRunning}); err != nil {
		pe.t.Fatal(err)
	}
	return id
}

func (pe *scriptedEnv) lastStatus() Status {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if len(pe.sts) == 0 {
		return Status{}
	}
	return pe.sts[len(pe.sts)-1]
}

func (pe *scriptedEnv) adm() *kadm.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(pe.seeds...))
	if err != nil {
		pe.t.Fatal(err)
	}
	pe.t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// rec is record i of a scripted source (source partition "0").
func rec(topic string, i int, size int) connect.SourceRecord {
	return connect.SourceRecord{Topic: topic, Partition: 0, Key: []byte(fmt.Sprint(i)), Value: randBytes(size),
		SourcePartition: map[string]any{"p": "0"}, SourceOffset: map[string]any{"i": i}}
}

func randBytes(n int) []byte { b := make([]byte, n); _, _ = rand.Read(b); return b }

// firstBatch is a scripted Poll that returns recs once, then blocks until
// its context ends.
func firstBatch(recs ...connect.SourceRecord) func(ctx context.Context, n int) ([]connect.SourceRecord, error) {
	return func(ctx context.Context, n int) ([]connect.SourceRecord, error) {
		if n == 0 {
			return recs, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
}

// stallUntilEnd makes the broker hold every request of key unanswered
// until the test ends: only the worker can cut a wait for it short. The
// returned channel is closed when the first such request has arrived.
func (pe *scriptedEnv) stallUntilEnd(key kmsg.Key) <-chan struct{} {
	end, arrived := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// Runs before the worker's and the cluster's Close (registered
	// earlier), so that neither waits for a held request.
	pe.t.Cleanup(func() { close(end) })
	pe.c.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
		pe.c.KeepControl()
		once.Do(func() { close(arrived) })
		pe.c.SleepControl(func() { <-end })
		return nil, nil, false
	})
	return arrived
}

// stalled waits until the stalled request has reached the broker.
func (pe *scriptedEnv) stalled(arrived <-chan struct{}) {
	pe.t.Helper()
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		pe.t.Fatal("the request to stall never reached the broker")
	}
}

// polled waits until the task has polled n times.
func (pe *scriptedEnv) polled(n int) {
	pe.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pe.task.mu.Lock()
		done := pe.task.polls >= n
		pe.task.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			pe.t.Fatalf("the task did not poll %d times", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stopDespiteStall stops the task while Kafka holds a request of it
// unanswered for as long as the test runs: the stop must end through the
// graceful timeout (reported abandoned) or by cutting the request short,
// and Stopped must run without the request having been answered.
func (pe *scriptedEnv) stopDespiteStall(id TaskID) {
	pe.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pe.w.StopTasks(ctx, []TaskID{id}, false)[id]; err != nil && !errors.Is(err, errAbandoned) {
		pe.t.Fatalf("StopTasks = %v, want nil or the task reported abandoned", err)
	}
	if ctx.Err() != nil {
		pe.t.Fatalf("StopTasks returned only when its context ended: the graceful timeout did not end the stop")
	}
	select {
	case <-pe.task.stopped:
	case <-ctx.Done():
		pe.t.Fatalf("Stopped had not run 20s after the stop, with the Kafka request still unanswered")
	}
}

// TestSourceTopicWithoutCreatePermission: on a cluster where the worker may
// not create topics, a topic an administrator made is used (Kafka answers
// CreateTopics with TOPIC_AUTHORIZATION_FAILED before it checks existence).
func TestSourceTopicWithoutCreatePermission(t *testing.T) {
	const topic = "made-by-an-admin"
	pe := newScripted(t, func(ctx context.Context, n int) ([]connect.SourceRecord, error) {
		if n < 5 {
			return []connect.SourceRecord{rec(topic, n, 10)}, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}, nil)
	if _, err := pe.adm().CreateTopic(context.Background(), 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	pe.c.ControlKey(int16(kmsg.CreateTopics), func(r kmsg.Request) (kmsg.Response, error, bool) {
		pe.c.KeepControl()
		req := r.(*kmsg.CreateTopicsRequest)
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic = rt.Topic
			st.ErrorCode = kerr.TopicAuthorizationFailed.Code
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	pe.start()
	deadline := time.Now().Add(10 * time.Second)
	for len(pe.task.Committed()) < 5 {
		if st := pe.lastStatus(); st.State == StateFailed {
			t.Fatalf("the task failed: %s", st.Trace)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 5 records committed", len(pe.task.Committed()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStopCutsTopicCreationShort: a stop does not wait for a CreateTopics
// that hangs: Stopped runs although Kafka never answers it.
func TestStopCutsTopicCreationShort(t *testing.T) {
	pe := newScripted(t, firstBatch(rec("new-topic", 0, 10)), nil)
	arrived := pe.stallUntilEnd(kmsg.CreateTopics)
	id := pe.start(KeyGracefulTimeout, "1000")
	pe.polled(1)
	pe.stalled(arrived)
	pe.stopDespiteStall(id)
}

// TestStopWithABatchBeyondTheProducerBuffer: a Poll batch larger than any
// fixed producer buffer, while Kafka is slow, does not block the loop where
// a stop is not seen.
func TestStopWithABatchBeyondTheProducerBuffer(t *testing.T) {
	const topic = "slow"
	batch := make([]connect.SourceRecord, 20)
	for i := range batch {
		batch[i] = rec(topic, i, 10)
	}
	pe := newScripted(t, firstBatch(batch...), nil, WithMaxInFlightRecords(2))
	if _, err := pe.adm().CreateTopic(context.Background(), 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	arrived := pe.stallUntilEnd(kmsg.Produce)
	id := pe.start(KeyGracefulTimeout, "1000")
	pe.polled(1)
	pe.stalled(arrived)
	pe.stopDespiteStall(id)
}

// TestFailedProduceIsReportedOnce: a task that failed on a record Kafka
// refused reports it as the failure, not again as a refusal during the
// stop that follows.
func TestFailedProduceIsReportedOnce(t *testing.T) {
	var logs testenv.SyncBuffer
	over := rec("large", 0, 2<<20) // over kfake's 1 MB
	pe := newScripted(t, firstBatch(over), nil,
		WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	id := pe.start()
	deadline := time.Now().Add(10 * time.Second)
	for pe.lastStatus().State != StateFailed {
		if time.Now().After(deadline) {
			t.Fatalf("the task did not fail on a record over the broker's limit: %+v", pe.lastStatus())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A restart would meet the same record: the trace says what lets it
	// through.
	if tr := pe.lastStatus().Trace; !strings.Contains(tr, "MESSAGE_TOO_LARGE") || !strings.Contains(tr, "--max-message-bytes") || !strings.Contains(tr, "max.message.bytes") {
		t.Errorf("trace %q, want the limit named and how to raise it", tr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pe.w.StopTasks(ctx, []TaskID{id}, false)[id]; err != nil {
		t.Errorf("StopTasks of the failed task: %v", err)
	}
	if n := strings.Count(logs.String(), "refused by Kafka while the task stopped"); n != 0 {
		t.Errorf("the failure is reported %d more times as a refusal during the stop:\n%s", n, logs.String())
	}
}

// TestNothingCommittedBehindARefusedRecordOfItsPartition: a record Kafka
// refused (MESSAGE_TOO_LARGE) is sent again after a restart, so a later
// record of the same Kafka partition that Kafka did take is not committed
// either (as the trace says): a consume-and-delete source would otherwise
// drop that later change of the key and deliver the refused, older one
// after it.
func TestNothingCommittedBehindARefusedRecordOfItsPartition(t *testing.T) {
	pe := newScripted(t, firstBatch(rec("large", 0, 10), rec("large", 1, 2<<20), rec("large", 2, 10)), nil)
	id := pe.start()
	deadline := time.Now().Add(10 * time.Second)
	for pe.lastStatus().State != StateFailed {
		if time.Now().After(deadline) {
			t.Fatalf("the task did not fail on a record over the broker's limit: %+v", pe.lastStatus())
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pe.w.StopTasks(ctx, []TaskID{id}, false)[id]; err != nil {
		t.Errorf("StopTasks of the failed task: %v", err)
	}
	pe.task.mu.Lock()
	defer pe.task.mu.Unlock()
	var got []string
	for _, r := range pe.task.committed {
		got = append(got, string(r.Key))
	}
	if strings.Join(got, ",") != "0" {
		t.Errorf("committed %v, want only [0]: nothing behind the refused record 1 of partition 0", got)
	}
}
