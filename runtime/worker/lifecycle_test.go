package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
)

// TestTaskLifecycle drives one task through each way a task can end and
// checks the contract: Stopped exactly once and last, Stop before it, the
// right connectorDeleted, owned resources dropped only on deletion.
func TestTaskLifecycle(t *testing.T) {
	tests := []struct {
		name      string
		sink      bool
		extra     []string
		deleted   bool
		wantStart bool // StartTask returns an error
		wantFail  string
		stopCalls []string // the Stop calls expected, in order
		dropped   bool
	}{
		{name: "source stop", stopCalls: []string{"Stop(false)"}},
		{name: "source delete", deleted: true, stopCalls: []string{"Stop(true)"}, dropped: true},
		{name: "sink stop", sink: true, stopCalls: []string{"Stop(false)"}},
		{name: "sink delete", sink: true, deleted: true, stopCalls: []string{"Stop(true)"}, dropped: true},
		{name: "source start fails", extra: []string{sampleconn.KeyFailStart, "true"}, wantStart: true, wantFail: "Start failed", stopCalls: []string{"Stop(false)"}},
		{name: "sink start fails", sink: true, extra: []string{sampleconn.KeyFailStart, "true"}, wantStart: true, wantFail: "Start failed", stopCalls: []string{"Stop(false)"}},
		{name: "poll fails", extra: []string{sampleconn.KeyFailAfter, "5", sampleconn.KeyBatch, "5"}, wantFail: "Poll failed after 5 records", stopCalls: []string{"Stop(false)"}},
		{name: "put fails", sink: true, extra: []string{sampleconn.KeyFailAfter, "0"}, wantFail: "Put failed after 0 records", stopCalls: []string{"Stop(false)"}},
		{name: "poll blocks until ctx, stop", extra: []string{sampleconn.KeyBlock, sampleconn.BlockUntilCtx}, stopCalls: []string{"Stop(false)"}},
		{name: "put blocks until ctx, delete", sink: true, extra: []string{sampleconn.KeyBlock, sampleconn.BlockUntilCtx}, deleted: true, stopCalls: []string{"Stop(true)"}, dropped: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			name, topic := testenv.Unique("life-"), testenv.Unique("life-topic-")
			extra := append([]string{sampleconn.KeyResources, "r1"}, tc.extra...)
			var cfg connect.Config
			if tc.sink {
				produce(t, e.brokers, topic, 10, func(i int) string { return fmt.Sprint(i) })
				cfg = sinkConfig(name, topic, extra...)
			} else {
				cfg = sourceConfig(name, topic, extra...)
			}
			inst := sampleconn.TaskInstance(name, 0)
			id, err := e.startTask(cfg, 0)
			if tc.wantStart {
				if err == nil {
					t.Fatal("StartTask succeeded, want Start's error")
				}
				// StartTask returns after Stop and Stopped.
				e.checkStoppedLast(inst)
			} else if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.wantFail != "":
				s := e.awaitTaskState(id, StateFailed)
				if !strings.Contains(s.Trace, tc.wantFail) {
					t.Errorf("trace %q, want it to contain %q", s.Trace, tc.wantFail)
				}
				e.awaitCall(inst+" Stopped", 1)
				// Stopping a failed task calls nothing more on it.
				if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, tc.deleted); errs[id] != nil {
					t.Errorf("StopTasks of a failed task: %v", errs[id])
				}
			default:
				e.awaitTaskState(id, StateRunning)
				if tc.sink {
					e.await("records put or a blocked Put", func() bool {
						return e.rec.CountPrefix(inst+" Put") > 0
					})
				} else {
					e.await("a Poll", func() bool { return e.rec.CountPrefix(inst+" Poll") > 0 })
				}
				if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, tc.deleted); errs[id] != nil {
					t.Fatalf("StopTasks: %v", errs[id])
				}
			}
			e.checkStoppedLast(inst)
			var stops []string
			for _, c := range e.rec.CallsOf(inst) {
				if strings.HasPrefix(c, "Stop(") {
					stops = append(stops, c)
				}
			}
			if !slices.Equal(stops, tc.stopCalls) {
				t.Errorf("Stop calls %v, want %v (all calls %v)", stops, tc.stopCalls, e.rec.CallsOf(inst))
			}
			res := inst + "/r1"
			if !tc.wantStart {
				if got := e.rec.ResourceExists(res); got == tc.dropped {
					t.Errorf("resource %s exists=%v after the task ended, want exists=%v", res, got, !tc.dropped)
				}
			}
			if _, ok := e.w.TaskStatus(id); ok && tc.wantFail == "" {
				t.Errorf("a stopped task is still listed")
			}
		})
	}
}

// TestStopDeliveredMoreThanOnce checks a second StopTasks (here: a deletion
// after a plain stop began) reaches the task before its Stopped.
func TestStopDeliveredMoreThanOnce(t *testing.T) {
	e := newEnv(t, WithGracefulTimeout(200*time.Millisecond))
	name, topic := testenv.Unique("twice-"), testenv.Unique("twice-topic-")
	cfg := sourceConfig(name, topic, sampleconn.KeyBlock, sampleconn.BlockIgnoreCtx, sampleconn.KeyResources, "r")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.awaitCall(inst+" Poll blocking", 1)
	errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false)
	if !errors.Is(errs[id], errAbandoned) {
		t.Fatalf("StopTasks of a task ignoring its context: %v, want abandoned", errs[id])
	}
	errs = e.w.StopTasks(e.ctx(), []TaskID{id}, true)
	if !errors.Is(errs[id], errAbandoned) {
		t.Fatalf("second StopTasks: %v, want abandoned", errs[id])
	}
	if got := e.rec.CallsOf(inst); !slices.Contains(got, "Stop(false)") || !slices.Contains(got, "Stop(true)") || slices.Contains(got, "Stopped") {
		t.Fatalf("calls %v: want both Stop calls and no Stopped yet", got)
	}
	e.rec.ReleaseBlocked()
	e.awaitCall(inst+" Stopped", 1)
	e.checkStoppedLast(inst)
	if e.rec.ResourceExists(inst + "/r") {
		t.Error("the deletion's Stop(true) did not make Stopped drop the resource")
	}
}

// TestGracefulTimeoutAbandons checks a task that ignores cancellation is
// reported, does not hold up other tasks or Close, and still gets Stopped
// once when its call returns.
func TestGracefulTimeoutAbandons(t *testing.T) {
	// The worker's graceful timeout is far longer than the test may take:
	// only the connector's own 300 ms can end the stuck task's stop.
	e := newEnv(t, WithGracefulTimeout(time.Hour))
	stuck, other := testenv.Unique("stuck-"), testenv.Unique("other-")
	topic := testenv.Unique("stuck-topic-")
	produce(t, e.brokers, topic, 5, func(i int) string { return fmt.Sprint(i) })
	// The per-connector key overrides the worker's hour.
	stuckCfg := sinkConfig(stuck, topic, sampleconn.KeyBlock, sampleconn.BlockIgnoreCtx, KeyGracefulTimeout, "300")
	otherCfg := sourceConfig(other, topic, sampleconn.KeyBlock, sampleconn.BlockUntilCtx)
	stuckID, err := e.startTask(stuckCfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	otherID, err := e.startTask(otherCfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	stuckInst := sampleconn.TaskInstance(stuck, 0)
	e.awaitCall(stuckInst+" Put blocking", 1)
	e.awaitCall(sampleconn.TaskInstance(other, 0)+" Poll blocking", 1)

	sctx := e.ctx()
	errs := e.w.StopTasks(sctx, []TaskID{stuckID, otherID}, false)
	if !errors.Is(errs[stuckID], errAbandoned) {
		t.Errorf("stuck task: %v, want abandoned", errs[stuckID])
	}
	if errs[otherID] != nil {
		t.Errorf("other task: %v", errs[otherID])
	}
	// A stop ended by the caller's context is reported abandoned too: the
	// context must still be live, so the connector's 300 ms ended it.
	if sctx.Err() != nil {
		t.Errorf("StopTasks returned only when its context ended (%v): the connector's 300 ms graceful timeout was not used", sctx.Err())
	}
	e.checkStoppedLast(sampleconn.TaskInstance(other, 0))
	if st, ok := e.w.TaskStatus(stuckID); !ok || !st.Abandoned {
		t.Errorf("TaskStatus of the stuck task = %+v, %v; want Abandoned", st, ok)
	}
	if s, _ := e.lastEvent(stuck, 0); !s.Abandoned {
		t.Errorf("listener not told of the abandonment: %+v", s)
	}
	if n := e.rec.Count(stuckInst + " Stopped"); n != 0 {
		t.Fatalf("Stopped called while Put is still blocked")
	}
	// A restart may replace the abandoned instance.
	if _, err := e.startTask(stuckCfg, 0); err != nil {
		t.Errorf("restarting over an abandoned instance: %v", err)
	}

	e.rec.ReleaseBlocked()
	e.awaitCall(stuckInst+" Stopped", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.w.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	// Two instances ran under this id; each got exactly one Stopped, last.
	calls := e.rec.CallsOf(stuckInst)
	if n := e.rec.Count(stuckInst + " Stopped"); n != 2 || calls[len(calls)-1] != "Stopped" {
		t.Errorf("calls %v: want two instances each ending with one Stopped", calls)
	}
}

// TestAbandonedTaskHandler: the handler set with WithAbandonedTaskHandler
// is told once, with the task's id, when an abandoned instance finishes
// after all, and only once the worker no longer lists it; a task that stops
// in time is never reported.
func TestAbandonedTaskHandler(t *testing.T) {
	type call struct {
		id     TaskID
		listed bool // TaskStatus still listed the id during the call
	}
	calls := make(chan call, 4)
	var w *Worker
	e := newEnv(t, WithAbandonedTaskHandler(func(id TaskID) {
		_, listed := w.TaskStatus(id)
		calls <- call{id, listed}
	}))
	w = e.w
	stuck, fine := testenv.Unique("stuck-"), testenv.Unique("fine-")
	topic := testenv.Unique("abandoned-topic-")
	stuckID, err := e.startTask(sourceConfig(stuck, topic, sampleconn.KeyBlock, sampleconn.BlockIgnoreCtx, KeyGracefulTimeout, "200"), 0)
	if err != nil {
		t.Fatal(err)
	}
	fineID, err := e.startTask(sourceConfig(fine, topic, sampleconn.KeyBlock, sampleconn.BlockUntilCtx), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.awaitCall(sampleconn.TaskInstance(stuck, 0)+" Poll blocking", 1)
	e.awaitCall(sampleconn.TaskInstance(fine, 0)+" Poll blocking", 1)
	errs := e.w.StopTasks(e.ctx(), []TaskID{stuckID, fineID}, false)
	if !errors.Is(errs[stuckID], errAbandoned) || errs[fineID] != nil {
		t.Fatalf("StopTasks = %v, want the stuck task abandoned and the other stopped", errs)
	}
	select {
	case c := <-calls:
		t.Fatalf("handler called with %+v before the abandoned instance returned", c)
	default:
	}

	e.rec.ReleaseBlocked()
	select {
	case c := <-calls:
		if c.id != stuckID || c.listed {
			t.Errorf("handler called with %+v, want %+v no longer listed", c, stuckID)
		}
	case <-e.ctx().Done():
		t.Fatal("handler not called after the abandoned instance returned")
	}
	if n := e.rec.Count(sampleconn.TaskInstance(stuck, 0) + " Stopped"); n != 1 {
		t.Errorf("Stopped of the abandoned instance called %d times before the handler, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.w.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if len(calls) != 0 {
		t.Errorf("handler called again: %+v", <-calls)
	}
}

func TestPauseAndResume(t *testing.T) {
	for _, sink := range []bool{false, true} {
		t.Run(map[bool]string{false: "source", true: "sink"}[sink], func(t *testing.T) {
			e := newEnv(t)
			name, topic := testenv.Unique("pause-"), testenv.Unique("pause-topic-")
			var cfg connect.Config
			call := "Poll("
			if sink {
				produce(t, e.brokers, topic, 5, func(i int) string { return fmt.Sprint(i) })
				cfg = sinkConfig(name, topic)
				call = "Put("
			} else {
				cfg = sourceConfig(name, topic, sampleconn.KeyCount, "-1", sampleconn.KeyRate, "200", sampleconn.KeyBatch, "2")
			}
			inst := sampleconn.TaskInstance(name, 0)
			id, err := e.startTask(cfg, 0)
			if err != nil {
				t.Fatal(err)
			}
			e.await("a first "+call, func() bool { return e.rec.CountPrefix(inst+" "+call) > 0 })
			e.w.SetTargetState(name, TargetPaused)
			e.awaitTaskState(id, StatePaused)
			if s, _ := e.w.TaskStatus(id); s.State != StatePaused {
				t.Errorf("TaskStatus = %+v", s)
			}
			// Whatever was in progress has returned; from now on nothing.
			before := e.rec.CountPrefix(inst + " " + call)
			if sink {
				produce(t, e.brokers, topic, 5, func(i int) string { return fmt.Sprint(5 + i) })
			}
			time.Sleep(300 * time.Millisecond) // a window in which a call would show up
			if after := e.rec.CountPrefix(inst + " " + call); after != before {
				t.Errorf("%d %s calls while paused", after-before, call)
			}
			if n := e.rec.CountPrefix(inst + " Stop("); n != 0 {
				t.Errorf("pause called Stop: %v", e.rec.CallsOf(inst))
			}
			e.w.SetTargetState(name, TargetRunning)
			e.awaitTaskState(id, StateRunning)
			if sink {
				e.await("records after resume", func() bool { return len(e.rec.Sunk(name)) >= 10 })
			} else {
				e.await("Polls after resume", func() bool { return e.rec.CountPrefix(inst+" "+call) > before+2 })
			}
			if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
				t.Fatal(errs[id])
			}
			e.checkStoppedLast(inst)
		})
	}
}

// TestConnectorLifecycle covers the connector instance operations and the
// deletion order: tasks (Stop(true), Stopped) before the connector.
func TestConnectorLifecycle(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("conn-"), testenv.Unique("conn-topic-")
	cfg := sourceConfig(name, topic, KeyTasksMax, "2", sampleconn.KeyResources, "shared", sampleconn.KeyBlock, sampleconn.BlockUntilCtx)
	if err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger, Target: TargetRunning}); err != nil {
		t.Fatal(err)
	}
	if err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger}); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("second StartConnector: %v, want ErrAlreadyExists", err)
	}
	if s, ok := e.w.ConnectorStatus(name); !ok || s.State != StateRunning || s.WorkerID != "test-worker" {
		t.Errorf("ConnectorStatus = %+v, %v", s, ok)
	}
	tcs, err := e.w.TaskConfigs(e.ctx(), name)
	if err != nil || len(tcs) != 2 {
		t.Fatalf("TaskConfigs = %v, %v; want 2", tcs, err)
	}
	var ids []TaskID
	for i, tc := range tcs {
		id := TaskID{Connector: name, Task: i}
		ids = append(ids, id)
		if err := e.w.StartTask(e.ctx(), TaskRun{ID: id, ConnectorConfig: cfg, TaskConfig: tc, Ledger: e.ledger, Target: TargetRunning}); err != nil {
			t.Fatal(err)
		}
	}
	e.w.SetTargetState(name, TargetPaused)
	if s, _ := e.w.ConnectorStatus(name); s.State != StatePaused {
		t.Errorf("connector status after pause: %+v", s)
	}
	e.w.SetTargetState(name, TargetRunning)
	for _, err := range e.w.StopTasks(e.ctx(), ids, true) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := e.w.StopConnector(e.ctx(), name, true); err != nil {
		t.Fatal(err)
	}
	connStop := e.rec.Index(sampleconn.ConnectorInstance(name) + " Stop(true)")
	for i := range 2 {
		inst := sampleconn.TaskInstance(name, i)
		e.checkStoppedLast(inst)
		if e.rec.Index(inst+" Stopped") > connStop {
			t.Errorf("task %d Stopped after the connector's Stop", i)
		}
	}
	e.checkStoppedLast(sampleconn.ConnectorInstance(name))
	if left := e.rec.Resources(); len(left) != 0 {
		t.Errorf("resources left after deletion: %v", left)
	}
	if owned, _ := e.ledger.List(e.ctx()); len(owned) != 0 {
		t.Errorf("ledger after deletion: %v", owned)
	}
	if _, ok := e.w.ConnectorStatus(name); ok {
		t.Error("a stopped connector is still listed")
	}
	if _, err := e.w.TaskConfigs(e.ctx(), name); !errors.Is(err, ErrNotRunning) {
		t.Errorf("TaskConfigs after stop: %v", err)
	}
}

func TestConnectorStartFailsAndStopped(t *testing.T) {
	tests := []struct {
		name        string
		target      TargetState
		failStart   bool
		wantState   State
		wantStarted bool
	}{
		{"running", TargetRunning, false, StateRunning, true},
		{"paused", TargetPaused, false, StatePaused, true},
		{"stopped target never starts", TargetStopped, false, StateStopped, false},
		{"start fails", TargetRunning, true, StateFailed, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			name := testenv.Unique("cstart-")
			cfg := sourceConfig(name, "t", sampleconn.KeyFailStart, fmt.Sprint(tc.failStart))
			err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger, Target: tc.target})
			if (err != nil) != tc.failStart {
				t.Fatalf("StartConnector: %v", err)
			}
			s, _ := e.w.ConnectorStatus(name)
			if s.State != tc.wantState {
				t.Errorf("state %s, want %s", s.State, tc.wantState)
			}
			if ev, _ := e.lastEvent(name, -1); ev.State != tc.wantState {
				t.Errorf("listener last got %+v", ev)
			}
			inst := sampleconn.ConnectorInstance(name)
			if err := e.w.StopConnector(e.ctx(), name, false); err != nil {
				t.Fatal(err)
			}
			if tc.wantStarted {
				e.checkStoppedLast(inst)
			} else if calls := e.rec.CallsOf(inst); len(calls) != 0 {
				t.Errorf("an instance never started got calls %v", calls)
			}
		})
	}
}

func TestUnknownPluginAndBadConfig(t *testing.T) {
	e := newEnv(t)
	cfg := sourceConfig("x", "t")
	cfg[KeyConnectorClass] = "nope"
	if err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: "x", Config: cfg}); !errors.Is(err, ErrUnknownPlugin) {
		t.Errorf("StartConnector: %v", err)
	}
	bad := sinkConfig("y", "")
	bad[KeyOffsetFlushInterval] = "soon"
	_, err := e.startTask(bad, 0)
	if err == nil || !strings.Contains(err.Error(), KeyOffsetFlushInterval) || !strings.Contains(err.Error(), KeyTopics) {
		t.Errorf("StartTask with a bad config: %v, want an error naming %s and %s", err, KeyOffsetFlushInterval, KeyTopics)
	}
}

func TestCloseStopsEverythingWithoutLeaks(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("close-"), testenv.Unique("close-topic-")
	sinkName := testenv.Unique("close-sink-")
	produce(t, e.brokers, topic, 5, func(i int) string { return fmt.Sprint(i) })
	// The broker is up and the worker has no client yet: every goroutine
	// the worker starts from here on must be gone after Close.
	before := runtime.NumGoroutine()
	if err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: name, Config: sourceConfig(name, topic), Ledger: e.ledger}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.startTask(sourceConfig(name, topic, sampleconn.KeyBlock, sampleconn.BlockUntilCtx, sampleconn.KeyBlockAfter, "10"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.startTask(sinkConfig(sinkName, topic), 0); err != nil {
		t.Fatal(err)
	}
	e.await("records flowing", func() bool { return len(e.rec.Sunk(sinkName)) >= 5 })
	if runtime.NumGoroutine() <= before {
		t.Fatal("no goroutines started: the leak check would prove nothing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, inst := range []string{sampleconn.TaskInstance(name, 0), sampleconn.TaskInstance(sinkName, 0), sampleconn.ConnectorInstance(name)} {
		e.checkStoppedLast(inst)
		if slices.Contains(e.rec.CallsOf(inst), "Stop(true)") {
			t.Errorf("%s: Close delivered a deletion", inst)
		}
	}
	// Tasks before the connector.
	if e.rec.Index(sampleconn.TaskInstance(name, 0)+" Stopped") > e.rec.Index(sampleconn.ConnectorInstance(name)+" Stop(false)") {
		t.Error("Close stopped the connector before its task finished")
	}
	if err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: name, Config: sourceConfig(name, topic)}); !errors.Is(err, ErrClosed) {
		t.Errorf("StartConnector after Close: %v", err)
	}
	awaitGoroutines(t, before)
}

func TestStatusListenerSeesEveryChange(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("events-"), testenv.Unique("events-topic-")
	id, err := e.startTask(sourceConfig(name, topic, sampleconn.KeyFailAfter, "4", sampleconn.KeyBatch, "2"), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.awaitTaskState(id, StateFailed)
	e.mu.Lock()
	var states []State
	for _, ev := range e.events {
		if ev.connector == name && ev.task == 0 {
			states = append(states, ev.status.State)
			if ev.status.WorkerID != "test-worker" {
				t.Errorf("event without worker id: %+v", ev)
			}
		}
	}
	e.mu.Unlock()
	if !slices.Equal(states, []State{StateRunning, StateFailed}) {
		t.Errorf("states %v, want RUNNING then FAILED", states)
	}
	// Records acknowledged before the failure were committed.
	e.awaitCall(sampleconn.TaskInstance(name, 0)+" Stopped", 1)
	if got := positions(e.rec.Committed(name)); !slices.Equal(got, seq(0, 4)) {
		t.Errorf("committed %v before the failure, want 0..3", got)
	}
}

func TestProduceErrorFailsSourceTask(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("toolarge-"), testenv.Unique("toolarge-topic-")
	// A 2 MB value exceeds the producer's 1 MB batch limit.
	id, err := e.startTask(sourceConfig(name, topic, sampleconn.KeyValueSize, "2000000", sampleconn.KeyBatch, "1", sampleconn.KeyCount, "3"), 0)
	if err != nil {
		t.Fatal(err)
	}
	s := e.awaitTaskState(id, StateFailed)
	if !strings.Contains(s.Trace, "producing to Kafka failed") {
		t.Errorf("trace %q", s.Trace)
	}
	e.awaitCall(sampleconn.TaskInstance(name, 0)+" Stopped", 1)
	e.checkStoppedLast(sampleconn.TaskInstance(name, 0))
	if n := len(e.rec.Committed(name)); n != 0 {
		t.Errorf("%d records committed that Kafka refused", n)
	}
	if n := len(e.store.All(name)); n != 0 {
		t.Errorf("offsets stored for refused records: %v", e.store.All(name))
	}
}

func TestRequestTaskReconfiguration(t *testing.T) {
	asked := make(chan string, 1)
	e := newEnv(t, WithTaskReconfigurationHandler(func(c string) { asked <- c }))
	name := testenv.Unique("reconf-")
	var host *connect.Host
	cfg := sourceConfig(name, "t")
	if err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger}); err != nil {
		t.Fatal(err)
	}
	e.w.mu.Lock()
	host = e.w.connectors[name].host
	e.w.mu.Unlock()
	if host.RequestTaskReconfiguration == nil || host.Offsets == nil || host.Task != -1 || host.Logger == nil {
		t.Fatalf("connector host %+v", host)
	}
	host.RequestTaskReconfiguration()
	select {
	case got := <-asked:
		if got != name {
			t.Errorf("reconfiguration asked for %q", got)
		}
	case <-e.ctx().Done():
		t.Fatal("the handler was not called")
	}
}

func TestCleanupOnlyTaskMovesNoData(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("cleanup-"), testenv.Unique("cleanup-topic-")
	cfg := sourceConfig(name, topic, sampleconn.KeyResources, "r")
	id := TaskID{Connector: name}
	// A first instance owns the resource; the cleanup-only one drops it.
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Fatal(errs[id])
	}
	polls := e.rec.CountPrefix(inst + " Poll")
	if err := e.w.StartTask(e.ctx(), TaskRun{ID: id, ConnectorConfig: cfg, TaskConfig: cfg, Ledger: e.ledger, Target: TargetRunning, CleanupOnly: true}); err != nil {
		t.Fatal(err)
	}
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, true); errs[id] != nil {
		t.Fatal(errs[id])
	}
	if n := e.rec.CountPrefix(inst + " Poll"); n != polls {
		t.Errorf("a cleanup-only instance was polled %d times", n-polls)
	}
	if e.rec.ResourceExists(inst + "/r") {
		t.Error("the cleanup-only instance's Stop(true)+Stopped did not drop the owned resource")
	}
}

// attrRecorder keeps every log record's message and attributes.
type attrRecorder struct {
	mu    *sync.Mutex
	recs  *[]map[string]string
	attrs []slog.Attr
}

func (h attrRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h attrRecorder) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	for _, a := range h.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	*h.recs = append(*h.recs, m)
	h.mu.Unlock()
	return nil
}
func (h attrRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(slices.Clone(h.attrs), as...)
	return h
}
func (h attrRecorder) WithGroup(string) slog.Handler { return h }

func TestLogsCarryConnectorAndTask(t *testing.T) {
	var mu sync.Mutex
	var recs []map[string]string
	e := newEnv(t, WithLogger(slog.New(attrRecorder{mu: &mu, recs: &recs})))
	name, topic := testenv.Unique("logs-"), testenv.Unique("logs-topic-")
	cfg := sourceConfig(name, topic, sampleconn.KeyPassword, "hunter2", sampleconn.KeyURL, "postgres://u:hunter2@h/db")
	id, err := e.startTask(cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Fatal(errs[id])
	}
	mu.Lock()
	defer mu.Unlock()
	var starting, stopped bool
	for _, r := range recs {
		for _, v := range r {
			if strings.Contains(v, "hunter2") {
				t.Errorf("a secret was logged: %v", r)
			}
		}
		if r["connector"] != name {
			continue
		}
		switch r["msg"] {
		case "starting task":
			starting = r["task"] == "3"
		case "task stopped":
			stopped = r["task"] == "3"
		}
	}
	if !starting || !stopped {
		t.Errorf("task logs without connector/task attributes: %v", recs)
	}
}

// TestConnectorStartBlocking: a Start that ignores cancellation does not
// hold the caller; Stop is delivered, and Stopped comes once Start returns.
func TestConnectorStartBlocking(t *testing.T) {
	e := newEnv(t)
	name := testenv.Unique("slowstart-")
	inst := sampleconn.ConnectorInstance(name)
	cfg := sourceConfig(name, "t", sampleconn.KeyBlockStart, sampleconn.BlockIgnoreCtx, sampleconn.KeyResources, "r")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.w.StartConnector(ctx, ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger}); err == nil {
		t.Fatal("StartConnector returned nil while Start still blocks")
	}
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	if err := e.w.StopConnector(sctx, name, false); err == nil {
		t.Error("StopConnector returned nil while Start still blocks")
	}
	e.awaitCall(inst+" Stop(false)", 1)
	// A deletion while the plain stop still waits for Start: its Stop(true)
	// reaches the instance before Stopped.
	dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer dcancel()
	if err := e.w.StopConnector(dctx, name, true); err == nil {
		t.Error("deleting StopConnector returned nil while Start still blocks")
	}
	e.awaitCall(inst+" Stop(true)", 1)
	if e.rec.Count(inst+" Stopped") != 0 {
		t.Fatal("Stopped called while Start is still running")
	}
	if _, ok := e.w.ConnectorStatus(name); !ok {
		t.Error("a connector still stopping is no longer listed")
	}
	e.rec.ReleaseBlocked()
	e.awaitCall(inst+" Stopped", 1)
	e.checkStoppedLast(inst)
	if e.rec.Index(inst+" Start") > e.rec.Index(inst+" Stopped") {
		t.Errorf("Stopped before Start returned: %v", e.rec.CallsOf(inst))
	}
	if e.rec.ResourceExists(inst + "/r") {
		t.Error("the deletion's Stop(true) did not make Stopped drop the resource")
	}
	e.await("the connector forgotten", func() bool { _, ok := e.w.ConnectorStatus(name); return !ok })

	// until-ctx: the caller's deadline interrupts Start, which fails.
	name2 := testenv.Unique("ctxstart-")
	cfg2 := sourceConfig(name2, "t", sampleconn.KeyBlockStart, sampleconn.BlockUntilCtx)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	err := e.w.StartConnector(ctx2, ConnectorRun{Name: name2, Config: cfg2, Ledger: e.ledger})
	if err == nil {
		t.Fatal("StartConnector succeeded")
	}
	e.awaitCall(sampleconn.ConnectorInstance(name2)+" Stopped", 1)
	if s, _ := e.w.ConnectorStatus(name2); s.State != StateFailed {
		t.Errorf("status %+v, want FAILED", s)
	}
}
