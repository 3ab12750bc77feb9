package worker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
)

// Plugins that break the contract must not take the worker down with them:
// a Stop that blocks, a call that panics.

// within fails the test unless f returns before a deadline far beyond any
// graceful timeout here: it tells "returns" from "waits for the plugin",
// not a speed.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s waits for a plugin call that does not return", what)
	}
}

func TestTaskStopThatBlocksIsAbandonedNotWaitedFor(t *testing.T) {
	e := newEnv(t, WithGracefulTimeout(200*time.Millisecond))
	ctx := e.ctx()
	name := testenv.Unique("blockstop-")
	id, err := e.startTask(sourceConfig(name, name, sampleconn.KeyBlockStop, "true", sampleconn.KeyCount, "-1", sampleconn.KeyRate, "100"), 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.await("a Commit", func() bool { return e.rec.CountPrefix(inst+" Commit(") > 0 })
	var errs map[TaskID]error
	within(t, "StopTasks (graceful timeout 200ms)", func() { errs = e.w.StopTasks(ctx, []TaskID{id}, false) })
	if !errors.Is(errs[id], errAbandoned) {
		t.Errorf("StopTasks with a Stop that blocks: %v, want the task abandoned", errs[id])
	}
	var s Status
	within(t, "TaskStatus", func() { s, _ = e.w.TaskStatus(id) })
	if !s.Abandoned {
		t.Errorf("status while Stop blocks: %+v, want abandoned", s)
	}
	if n := e.rec.Count(inst + " Stopped"); n != 0 {
		t.Errorf("Stopped was called while Stop had not returned (%d times)", n)
	}
	e.rec.ReleaseBlocked()
	e.awaitCall(inst+" Stopped", 1)
	e.checkStoppedLast(inst)
}

func TestConnectorStopThatBlocksHoldsUpNoRead(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx()
	name, inst := stopWithBlockingStop(t, e, ctx, "blockstop-", true)
	var s Status
	within(t, "ConnectorStatus", func() { s, _ = e.w.ConnectorStatus(name) })
	if s.State != StateRunning {
		t.Errorf("status while Stop blocks: %+v", s)
	}
	within(t, "SetTargetState", func() { e.w.SetTargetState(name, TargetPaused) })
	e.rec.ReleaseBlocked()
	e.awaitCall(inst+" Stopped", 1)
	e.checkStoppedLast(inst)
	if e.rec.ResourceExists(inst + "/r") {
		t.Errorf("the deletion did not reach Stopped: %s still exists; calls: %v", inst+"/r", e.rec.CallsOf(inst))
	}
}

// A panic in a task or connector call fails that instance, which still gets
// Stop and Stopped (a panic in those is logged or returned), as Kafka
// Connect's WorkerTask catches Throwable; the process and every other
// instance go on.
func TestPanicsFailTheInstanceNotTheWorker(t *testing.T) {
	e := newEnv(t, WithGracefulTimeout(2*time.Second))
	ctx := e.ctx()
	awaitFailed := func(id TaskID, call string) {
		t.Helper()
		s := e.awaitTaskState(id, StateFailed)
		if !strings.Contains(s.Trace, call+" panicked") || !strings.Contains(s.Trace, "goroutine") {
			t.Errorf("%s: trace %q, want the panic and its stack", call, s.Trace)
		}
	}
	// Stopped, exactly once and last (a panicking one got as far as its
	// panic).
	finalCall := func(inst, call string) {
		t.Helper()
		last := "Stopped"
		if call == "Stopped" {
			last = "Stopped panicking"
		}
		e.awaitCall(inst+" "+last, 1)
		if calls := e.rec.CallsOf(inst); calls[len(calls)-1] != last || e.rec.Count(inst+" "+last) != 1 {
			t.Errorf("%s (%s panics): %s must be called exactly once and last; calls: %v", inst, call, last, calls)
		}
	}
	for _, call := range []string{"Start", "Poll", "Put", "Flush", "Stop", "Stopped"} {
		{
			name := testenv.Unique("panic-")
			cfg := sourceConfig(name, name, sampleconn.KeyPanic, call)
			if call == "Put" || call == "Flush" {
				produce(t, e.brokers, name, 3, func(i int) string { return "v" })
				cfg = sinkConfig(name, name, sampleconn.KeyPanic, call)
			}
			id, err := e.startTask(cfg, 0)
			inst := sampleconn.TaskInstance(name, 0)
			switch call {
			case "Start":
				if err == nil || !strings.Contains(err.Error(), "Start panicked") {
					t.Errorf("StartTask: %v, want the panic", err)
				}
				awaitFailed(id, call)
			case "Poll", "Put", "Flush":
				if err != nil {
					t.Fatal(err)
				}
				awaitFailed(id, call)
			case "Stop", "Stopped":
				if err != nil {
					t.Fatal(err)
				}
				errs := e.w.StopTasks(ctx, []TaskID{id}, false)
				if call == "Stopped" && (errs[id] == nil || !strings.Contains(errs[id].Error(), "Stopped panicked")) {
					t.Errorf("StopTasks: %v, want Stopped's panic", errs[id])
				}
				if call == "Stop" && errs[id] != nil {
					t.Errorf("StopTasks: %v, want nil (a panic in Stop is logged)", errs[id])
				}
			}
			finalCall(inst, call)
		}
	}
	for _, call := range []string{"Start", "TaskConfigs", "Stop", "Stopped"} {
		{
			name := testenv.Unique("panic-")
			err := e.w.StartConnector(ctx, ConnectorRun{Name: name, Config: sourceConfig(name, name, sampleconn.KeyPanic, call), Ledger: e.ledger, Target: TargetRunning})
			inst := sampleconn.ConnectorInstance(name)
			switch call {
			case "Start":
				if err == nil || !strings.Contains(err.Error(), "Start panicked") {
					t.Errorf("StartConnector: %v, want the panic", err)
				}
				if s, _ := e.w.ConnectorStatus(name); s.State != StateFailed {
					t.Errorf("status %+v, want FAILED", s)
				}
			case "TaskConfigs":
				if err != nil {
					t.Fatal(err)
				}
				if _, err := e.w.TaskConfigs(ctx, name); err == nil || !strings.Contains(err.Error(), "TaskConfigs panicked") {
					t.Errorf("TaskConfigs: %v, want the panic", err)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
			}
			err = e.w.StopConnector(ctx, name, false)
			if call == "Stopped" && (err == nil || !strings.Contains(err.Error(), "Stopped panicked")) {
				t.Errorf("StopConnector: %v, want Stopped's panic", err)
			}
			if call != "Stopped" && err != nil {
				t.Errorf("StopConnector (%s panics): %v", call, err)
			}
			finalCall(inst, call)
		}
	}
	// The worker still runs tasks.
	name := testenv.Unique("after-")
	if _, err := e.startTask(sourceConfig(name, name), 0); err != nil {
		t.Fatal(err)
	}
	e.await("a Commit of the task started after the panics", func() bool {
		return e.rec.CountPrefix(sampleconn.TaskInstance(name, 0)+" Commit(") > 0
	})
}

// A connector started again while its previous instance's Stopped still
// runs (a StopConnector whose caller gave up) waits for it: the two never
// overlap, as for tasks.
func TestConnectorRestartWaitsForPreviousStopped(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx()
	name := testenv.Unique("connwait-")
	if err := e.w.StartConnector(ctx, ConnectorRun{Name: name, Config: sourceConfig(name, name, sampleconn.KeyBlockStopped, "true"), Ledger: e.ledger, Target: TargetRunning}); err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.ConnectorInstance(name)
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := e.w.StopConnector(sctx, name, false); err == nil {
		t.Fatal("StopConnector returned nil while Stopped blocks")
	}
	e.awaitCall(inst+" Stopped blocking", 1)
	started := make(chan error, 1)
	go func() {
		started <- e.w.StartConnector(ctx, ConnectorRun{Name: name, Config: sourceConfig(name, name), Ledger: e.ledger, Target: TargetRunning})
	}()
	select {
	case err := <-started:
		t.Fatalf("StartConnector returned (%v) while the previous instance's Stopped was still running", err)
	case <-time.After(300 * time.Millisecond): // a wait for something not to happen, not a speed
	}
	e.rec.ReleaseBlocked()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	calls := e.rec.CallsOf(inst)
	stopped, restarted := slices.Index(calls, "Stopped"), slices.Index(calls[1:], "Start")+1
	if stopped < 0 || restarted <= stopped {
		t.Errorf("calls %v: the new instance's Start must follow the old instance's Stopped", calls)
	}
	if s, _ := e.w.ConnectorStatus(name); s.State != StateRunning {
		t.Errorf("status %+v, want RUNNING", s)
	}
}

// A deletion asked for while the Stop(false) of a failed task still runs
// (before Stopped began) reaches the task: Stop(true), then a Stopped that
// cleans up, not "Stopped already ran without the deletion".
func TestDeletionDuringAFailedTasksStopIsDelivered(t *testing.T) {
	e := newEnv(t, WithGracefulTimeout(10*time.Second))
	ctx := e.ctx()
	name := testenv.Unique("lostdel-")
	id, err := e.startTask(sourceConfig(name, name, sampleconn.KeyCount, "-1", sampleconn.KeyRate, "100",
		sampleconn.KeyFailAfter, "3", sampleconn.KeyBlockStop, "true"), 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.awaitTaskState(id, StateFailed)
	e.awaitCall(inst+" Stop blocking", 1) // the failure's Stop(false) runs; Stopped has not begun
	if n := e.rec.Count(inst + " Stopped"); n != 0 {
		t.Fatal("Stopped already called")
	}
	stopped := make(chan map[TaskID]error, 1)
	go func() { stopped <- e.w.StopTasks(ctx, []TaskID{id}, true) }()
	// Released once the deletion is recorded: its Stop(true) call waits
	// behind the blocked Stop(false).
	e.await("the deletion's Stop queued", func() bool {
		e.w.mu.Lock()
		ti := e.w.tasks[id]
		e.w.mu.Unlock()
		if ti == nil {
			return false
		}
		ti.mu.Lock()
		defer ti.mu.Unlock()
		return ti.deleted
	})
	e.rec.ReleaseBlocked()
	if err := (<-stopped)[id]; err != nil {
		t.Errorf("StopTasks(deleted) asked before Stopped began: %v; calls %v", err, e.rec.CallsOf(inst))
	}
	calls := e.rec.CallsOf(inst)
	if !slices.Contains(calls, "Stop(true)") || calls[len(calls)-1] != "Stopped" {
		t.Errorf("calls %v: want Stop(true) delivered before the final Stopped", calls)
	}
}

// A deletion asked for while a plain Stop of the connector still runs
// reaches it whichever goes first afterwards: Stop(true), then a Stopped
// that drops its resources.
func TestConnectorDeletionDuringAPlainStopIsDelivered(t *testing.T) {
	e := newEnv(t)
	ctx := e.ctx()
	name, inst := stopWithBlockingStop(t, e, ctx, "conndel-", false) // its Stop(false) blocks
	deleted := make(chan error, 1)
	go func() { deleted <- e.w.StopConnector(ctx, name, true) }()
	e.await("the deletion recorded", func() bool {
		e.w.mu.Lock()
		c := e.w.connectors[name]
		e.w.mu.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.deleted
	})
	e.rec.ReleaseBlocked()
	if err := <-deleted; err != nil {
		t.Errorf("StopConnector(deleted) asked before Stopped began: %v; calls %v", err, e.rec.CallsOf(inst))
	}
	calls := e.rec.CallsOf(inst)
	if i := slices.Index(calls, "Stop(true)"); i < 0 || calls[len(calls)-1] != "Stopped" {
		t.Errorf("calls %v: want Stop(true) delivered before the final Stopped", calls)
	}
	if e.rec.ResourceExists(inst + "/r") {
		t.Errorf("the deletion did not drop %s", inst+"/r")
	}
}

// stopWithBlockingStop starts a connector owning resource "r" whose Stop
// blocks until the test releases it, and stops it (a deletion if deleted)
// with a short deadline: StopConnector gives up while Stop still blocks.
func stopWithBlockingStop(t *testing.T, e *env, ctx context.Context, prefix string, deleted bool) (name, inst string) {
	t.Helper()
	name = testenv.Unique(prefix)
	cfg := sourceConfig(name, name, sampleconn.KeyBlockStop, "true", sampleconn.KeyResources, "r")
	if err := e.w.StartConnector(ctx, ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger, Target: TargetRunning}); err != nil {
		t.Fatal(err)
	}
	inst = sampleconn.ConnectorInstance(name)
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := e.w.StopConnector(sctx, name, deleted); err == nil {
		t.Fatal("StopConnector returned nil while Stop still blocks")
	}
	e.awaitCall(inst+" Stop blocking", 1)
	return name, inst
}
