package rest_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/rest"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// newKafkaE2E is the REST API over the real standalone herder, file store
// and runtime/worker, producing to and consuming from Kafka (kfake
// in-process unless TIDYCONNECT_TEST_KAFKA_BROKERS names a cluster).
func newKafkaE2E(t *testing.T) *e2e {
	t.Helper()
	seeds := testenv.KafkaBrokers(t)
	rec := sampleconn.NewRecorder()
	reg, err := plugins.New(sampleconn.Plugins(rec)...)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.SyncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := herder.NewStandalone(ctx,
		herder.WithStore(st), herder.WithPlugins(reg), herder.WithLogger(log),
		herder.WithKafkaAdmin(kadm.NewClient(cl)),
		herder.WithDeletionRetry(time.Hour, time.Hour),
		herder.WithWorker(func(l worker.StatusListener) (herder.Worker, error) {
			return worker.New(worker.WithID("e2e:8083"), worker.WithPlugins(reg), worker.WithOffsetStore(st),
				worker.WithKafka(seeds), worker.WithLogger(log), worker.WithStatusListener(l),
				worker.WithGracefulTimeout(5*time.Second), worker.WithOffsetFlushInterval(200*time.Millisecond))
		}),
	)
	if err != nil {
		cl.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("closing the herder: %v", err)
		}
		cl.Close()
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
		if s := logs.String(); strings.Contains(s, "hunter2") || strings.Contains(s, "pw123") {
			t.Errorf("a secret reached the log:\n%s", s)
		}
	})
	return &e2e{harness: newHarness(t, rest.New(h, rest.WithLogger(log)), logs), rec: rec, h: h, seeds: seeds}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within 20s; last: %s", what, detail)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *e2e) awaitStates(name, want string) {
	e.t.Helper()
	eventually(e.t, name+" reaching "+want, func() (bool, string) {
		got := e.states(name)
		return got == want, got
	})
}

// lifecycle returns an instance's lifecycle calls (Start, Stop, Stopped),
// without the data-path calls.
func (e *e2e) lifecycle(instance string) []string {
	var out []string
	for _, m := range e.rec.CallsOf(instance) {
		if m == "Start" || m == "Stopped" || strings.HasPrefix(m, "Stop(") {
			out = append(out, m)
		}
	}
	return out
}

func TestEndToEndKafka(t *testing.T) {
	e := newKafkaE2E(t)
	src, sink := testenv.Unique("e2e-src-"), testenv.Unique("e2e-sink-")
	topic := testenv.Unique("e2e-topic-")
	c0, t0, t1 := sampleconn.ConnectorInstance(src), sampleconn.TaskInstance(src, 0), sampleconn.TaskInstance(src, 1)
	instances := []string{c0, t0, t1}
	expectLifecycle := func(want ...string) {
		t.Helper()
		for _, in := range instances {
			if got := e.lifecycle(in); !slices.Equal(got, want) {
				t.Errorf("%s: lifecycle %q, want %q", in, got, want)
			}
		}
	}

	e.expect("POST", "/connectors", fmt.Sprintf(`{"name":%q,"config":{"connector.class":"sample-source","tasks.max":"2",
		"sample.topic":%q,"sample.count":"-1","sample.rate":"200","sample.resources":"audit","sample.password":"hunter2"}}`, src, topic), 201)
	e.awaitStates(src, "RUNNING RUNNING RUNNING")
	eventually(t, "40 records committed", func() (bool, string) {
		n := len(e.rec.Committed(src))
		return n >= 40, fmt.Sprint(n)
	})
	eventually(t, "the topic reported", func() (bool, string) {
		res := e.expect("GET", "/connectors/"+src+"/topics", "", 200)
		return strings.Contains(string(res.Body), topic), string(res.Body)
	})
	var owned []struct{ Kind, Name, Location string }
	e.expect("GET", "/connectors/"+src+"/resources", "", 200).json(t, &owned)
	if len(owned) != 3 {
		t.Fatalf("resources %+v, want 3", owned)
	}

	// Pause cancels Poll but is no stop.
	e.expect("PUT", "/connectors/"+src+"/pause", "", 202)
	e.awaitStates(src, "PAUSED PAUSED PAUSED")
	expectLifecycle("Start")
	e.expect("PUT", "/connectors/"+src+"/resume", "", 202)
	e.awaitStates(src, "RUNNING RUNNING RUNNING")

	// Restart with tasks: every instance is stopped (not deleted) and started.
	e.expect("POST", "/connectors/"+src+"/restart?includeTasks=true", "", 202)
	e.awaitStates(src, "RUNNING RUNNING RUNNING")
	expectLifecycle("Start", "Stop(false)", "Stopped", "Start")

	// Stop: STOPPED, no tasks; offsets were flushed on stop.
	e.expect("PUT", "/connectors/"+src+"/stop", "", 204)
	e.awaitStates(src, "STOPPED")
	expectLifecycle("Start", "Stop(false)", "Stopped", "Start", "Stop(false)", "Stopped")
	var offs struct {
		Offsets []struct {
			Partition map[string]any
			Offset    map[string]any
		}
	}
	e.expect("GET", "/connectors/"+src+"/offsets", "", 200).json(t, &offs)
	if len(offs.Offsets) != 2 {
		t.Fatalf("offsets after stop: %+v, want one per task", offs)
	}
	for _, o := range offs.Offsets {
		if pos, ok := sampleconn.Position(o.Offset); !ok || pos < 19 {
			t.Errorf("offset %v of %v, want a position of at least 19 (20+ records per task were committed)", o.Offset, o.Partition)
		}
	}
	e.expect("PATCH", "/connectors/"+src+"/offsets", `{"offsets":[{"partition":{"task":"0","partition":"0"},"offset":{"position":9}}]}`, 200)
	e.expect("PUT", "/connectors/"+src+"/resume", "", 202)
	e.awaitStates(src, "RUNNING RUNNING RUNNING")
	// Task 0 resumes after the altered position 9: position 10 comes again.
	eventually(t, "task 0 re-delivering from the altered offset", func() (bool, string) {
		n := 0
		for _, r := range e.rec.Committed(src) {
			if pos, _ := sampleconn.Position(r.SourceOffset); r.SourcePartition["task"] == "0" && pos == 10 {
				n++
			}
		}
		return n >= 2, fmt.Sprintf("position 10 of task 0 committed %d time(s)", n)
	})
	// Running: refused with Kafka Connect's sentence (the real herder wraps
	// its error, which the fake does not).
	if res := e.expect("DELETE", "/connectors/"+src+"/offsets", "", 400); !strings.Contains(string(res.Body), "must be in the STOPPED state before their offsets can be modified") {
		t.Errorf("offsets reset while running: %s, want Kafka Connect's message", res.Body)
	}

	// A sink reading the topic; its offsets are the consumer group's.
	e.expect("POST", "/connectors", fmt.Sprintf(`{"name":%q,"config":{"connector.class":"sample-sink","topics":%q}}`, sink, topic), 201)
	e.awaitStates(sink, "RUNNING RUNNING")
	eventually(t, "the sink received the records", func() (bool, string) {
		n := len(e.rec.Sunk(sink))
		return n >= 50, fmt.Sprint(n)
	})
	e.expect("PUT", "/connectors/"+sink+"/stop", "", 204)
	var sinkOffs struct {
		Offsets []struct {
			Partition map[string]any
			Offset    map[string]any
		}
	}
	eventually(t, "sink offsets committed", func() (bool, string) {
		res := e.expect("GET", "/connectors/"+sink+"/offsets", "", 200)
		res.json(t, &sinkOffs)
		return len(sinkOffs.Offsets) > 0, string(res.Body)
	})
	if p := sinkOffs.Offsets[0].Partition; p["kafka_topic"] != topic {
		t.Errorf("sink offsets %+v, want topic %s", sinkOffs, topic)
	}
	e.expect("DELETE", "/connectors/"+sink, "", 204)

	// Deletion: every task's Stop(true) and Stopped come before the
	// connector's Stop(true); what it owned is gone.
	e.expect("DELETE", "/connectors/"+src, "", 204)
	for _, in := range instances {
		got := e.lifecycle(in)
		if n := len(got); n < 2 || got[n-2] != "Stop(true)" || got[n-1] != "Stopped" {
			t.Errorf("%s ended with %q, want Stop(true), Stopped", in, got)
		}
	}
	connStop := e.rec.Index(c0 + " Stop(true)")
	for _, task := range []string{t0, t1} {
		if i := e.rec.LastIndex(task + " Stopped"); i < 0 || i > connStop {
			t.Errorf("%s Stopped at %d, after the connector's Stop(true) at %d", task, i, connStop)
		}
	}
	for _, r := range owned {
		if e.rec.ResourceExists(r.Name) {
			t.Errorf("resource %s survived the deletion", r.Name)
		}
	}
	e.expect("GET", "/connectors/"+src+"/status", "", 404)
	if res := e.expect("GET", "/connectors", "", 200); string(res.Body) != "[]\n" {
		t.Errorf("connectors after deletion: %s", res.Body)
	}
}

// A task whose Poll fails is FAILED with the error as trace; a restart
// with onlyFailed brings back that task only, as Kafka answers it (202,
// RESTARTING for what restarts).
func TestEndToEndKafkaFailedTaskRestart(t *testing.T) {
	e := newKafkaE2E(t)
	name, topic := testenv.Unique("e2e-fail-"), testenv.Unique("e2e-topic-")
	c0, t0, t1 := sampleconn.ConnectorInstance(name), sampleconn.TaskInstance(name, 0), sampleconn.TaskInstance(name, 1)
	e.expect("POST", "/connectors", fmt.Sprintf(`{"name":%q,"config":{"connector.class":"sample-source","tasks.max":"2",
		"sample.topic":%q,"sample.count":"-1","sample.rate":"200","sample.fail.after":"5","sample.fail.task":"1"}}`, name, topic), 201)
	e.awaitStates(name, "RUNNING RUNNING FAILED")
	st := e.status(name)
	if !strings.Contains(st.Tasks[1].Trace, "failed after 5 records") || st.Tasks[0].Trace != "" {
		t.Errorf("traces: task 0 %q, task 1 %q", st.Tasks[0].Trace, st.Tasks[1].Trace)
	}
	var ts struct {
		ID    int
		State string
		Trace string
	}
	e.expect("GET", "/connectors/"+name+"/tasks/1/status", "", 200).json(t, &ts)
	if ts.ID != 1 || ts.State != "FAILED" || ts.Trace == "" {
		t.Errorf("task status %+v", ts)
	}

	res := e.expect("POST", "/connectors/"+name+"/restart?includeTasks=true&onlyFailed=true", "", 202)
	var planned wireStatus
	res.json(t, &planned)
	if got := planned.Connector.State + " " + planned.Tasks[0].State + " " + planned.Tasks[1].State; got != "RUNNING RUNNING RESTARTING" {
		t.Errorf("restart answered %s, want RUNNING RUNNING RESTARTING", got)
	}
	// Only the failed task is restarted, never as a deletion: its old
	// instance's Stopped (whenever the worker ran it) precedes the new Start.
	eventually(t, "task 1 started again", func() (bool, string) {
		got := e.lifecycle(t1)
		return slices.Index(got, "Stopped") >= 0 && slices.Index(got[slices.Index(got, "Stopped"):], "Start") >= 0, fmt.Sprint(got)
	})
	if got := e.lifecycle(t1); slices.Contains(got, "Stop(true)") || got[0] != "Start" {
		t.Errorf("task 1 lifecycle %q", got)
	}
	for _, in := range []string{c0, t0} {
		if got := e.lifecycle(in); !slices.Equal(got, []string{"Start"}) {
			t.Errorf("%s lifecycle %q, want only Start", in, got)
		}
	}
	// The fresh instance fails again after its own 5 records.
	e.awaitStates(name, "RUNNING RUNNING FAILED")
	e.expect("DELETE", "/connectors/"+name, "", 204)
}
