package herder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// blockingSource is a sample source with one task whose Poll blocks,
// ignoring its context, until rec.ReleaseBlocked; grace is the task's
// graceful timeout in ms.
func blockingSource(topic, grace string) connect.Config {
	return sourceConfig(topic, 1,
		sampleconn.KeyBlock, sampleconn.BlockIgnoreCtx,
		worker.KeyGracefulTimeout, grace)
}

// callIndex is the index of the first call of instance with method, or -1.
func callIndex(rec *sampleconn.Recorder, instance, method string) int {
	for i, c := range rec.Calls() {
		if c.Instance == instance && c.Method == method {
			return i
		}
	}
	return -1
}

// TestDeleteWaitsForAbandonedTask (P2): a task still blocked in Poll past
// the graceful timeout makes the deletion attempt fail visibly; the
// connector gets no Stop(true) and its shared resources stay until the task
// has returned; a restart of the task in between does not start a second
// instance beside the stuck one (and the deletion drops the held-back
// start); the next DELETE completes the deletion.
func TestDeleteWaitsForAbandonedTask(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	t.Cleanup(rec.ReleaseBlocked) // never leave a goroutine blocked
	ctx := testCtx(t)
	name := testenv.Unique("stuck-")
	task, connInst := sampleconn.TaskInstance(name, 0), sampleconn.ConnectorInstance(name)
	if _, err := hs.h.CreateConnector(ctx, name, blockingSource(testenv.Unique("t-"), "200"), ""); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitCall(ctx, task+" Poll blocking", 1); err != nil {
		t.Fatal(err)
	}

	// A restart stops the task (it is abandoned) and must not start a
	// second instance while the first is still blocked.
	if err := hs.h.RestartTask(ctx, worker.TaskID{Connector: name, Task: 0}); err != nil {
		t.Fatal(err)
	}
	if n := rec.Count(task + " Start"); n != 1 {
		t.Errorf("task Start calls after restarting an abandoned task = %d, want 1 (no second instance beside the stuck one)", n)
	}

	err := hs.h.DeleteConnector(ctx, name)
	var de *DeletionError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "task 0") || !strings.Contains(err.Error(), "abandoned") {
		t.Fatalf("DELETE with a task stuck in Poll: %v, want a *DeletionError naming task 0 as abandoned", err)
	}
	if got := stopCalls(rec, connInst); slices.Contains(got, "Stop(true)") {
		t.Errorf("connector got %v while its task was still running: shared resources may be dropped under it", got)
	}
	if len(rec.Resources()) != 2 {
		t.Errorf("resources after the failed attempt = %v, want the connector's and the task's", rec.Resources())
	}
	st, err := hs.h.ConnectorStatus(ctx, name)
	if err != nil || st.Deletion == nil || st.Deletion.Phase != store.PhaseCleanupFailed ||
		st.Connector.State != worker.StateFailed || !strings.Contains(st.Connector.Trace, "task 0") {
		t.Fatalf("status after the failed attempt = %+v (%v), want FAILED, cleanup-failed, trace naming task 0", st, err)
	}

	// The blocked Poll returns; the task's Stopped runs (it had Stop(true)).
	rec.ReleaseBlocked()
	if err := rec.AwaitCall(ctx, task+" Stopped", 1); err != nil {
		t.Fatal(err)
	}
	if err := hs.h.DeleteConnector(ctx, name); err != nil {
		t.Fatalf("DELETE after the task returned: %v", err)
	}
	if res := rec.Resources(); len(res) != 0 {
		t.Errorf("resources after the deletion: %v", res)
	}
	ti, ci := callIndex(rec, task, "Stopped"), callIndex(rec, connInst, "Stop(true)")
	if ti < 0 || ci < 0 || ci < ti {
		t.Errorf("connector Stop(true) at %d, task Stopped at %d: the connector must stop after its task (calls %v)", ci, ti, rec.Calls())
	}
	if _, err := hs.h.ConnectorStatus(ctx, name); !errors.Is(err, ErrNotFound) {
		t.Errorf("after the deletion: %v, want ErrNotFound", err)
	}
	// The held-back restart was dropped by the deletion: it never started.
	if n := rec.Count(task + " Start"); n != 1 {
		t.Errorf("task Start calls after the deletion = %d, want 1 (the held-back start is dropped by a deletion)", n)
	}
}

// TestCloseDuringDeletionWithStuckTask (P2): Close while a deletion waits
// for a stuck task never turns into Stop(true) on the connector; the
// deletion stays recorded and the next start completes it.
func TestCloseDuringDeletionWithStuckTask(t *testing.T) {
	rec := sampleconn.NewRecorder()
	dir := t.TempDir()
	hs := newHarness(t, kindReal, dir, rec, nil)
	t.Cleanup(rec.ReleaseBlocked)
	ctx := testCtx(t)
	name := testenv.Unique("closing-")
	task, connInst := sampleconn.TaskInstance(name, 0), sampleconn.ConnectorInstance(name)
	// A long graceful timeout: the deletion is still waiting when Close comes.
	if _, err := hs.h.CreateConnector(ctx, name, blockingSource(testenv.Unique("t-"), "5000"), ""); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitCall(ctx, task+" Poll blocking", 1); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithCancel(ctx)
	deleted := make(chan error, 1)
	go func() { deleted <- hs.h.DeleteConnector(dctx, name) }()
	if err := rec.AwaitCall(ctx, task+" Stop(true)", 1); err != nil {
		t.Fatal(err)
	}
	cancel() // the request gives up; the deletion goes on in the herder
	select {
	case <-deleted:
	case <-ctx.Done():
		t.Fatal("DeleteConnector did not return after its context ended")
	}
	// Release the task once shutdown has stopped the connector (plainly),
	// so the worker's Close can finish.
	released := make(chan error, 1)
	go func() {
		err := rec.AwaitCall(ctx, connInst+" Stopped", 1) // bounded by ctx
		rec.ReleaseBlocked()
		released <- err
	}()
	hs.closeFn()
	if err := <-released; err != nil {
		t.Fatalf("the connector was not stopped at shutdown: %v", err)
	}
	if got := stopCalls(rec, connInst); !slices.Equal(got, []string{"Stop(false)"}) {
		t.Errorf("connector Stop calls at shutdown during a deletion with a stuck task = %v, want [Stop(false)]", got)
	}
	if len(rec.Resources()) == 0 {
		t.Fatalf("resources dropped at shutdown")
	}

	hs.start() // completes the recorded deletion
	if _, err := hs.h.ConnectorStatus(ctx, name); !errors.Is(err, ErrNotFound) {
		st, _ := hs.h.ConnectorStatus(ctx, name)
		t.Fatalf("after restart: %v (%+v), want the deletion completed", err, st)
	}
	if res := rec.Resources(); len(res) != 0 {
		t.Errorf("resources after the resumed deletion: %v", res)
	}
}

// TestPutConfigDuringFailedDeletion (P3): after a failed deletion the
// operator can fix the config with PUT or PATCH (validated as usual); the
// connector stays in deletion and the next DELETE uses the new config.
func TestPutConfigDuringFailedDeletion(t *testing.T) {
	tests := []struct {
		name string
		// restart restarts the herder between the fix and the DELETE; without
		// it the connector instance still running with the old config must
		// not be the one that cleans up.
		restart bool
		fix     func(h *Standalone, ctx context.Context, name string, cfg connect.Config) (ConnectorInfo, error)
		bad     func(h *Standalone, ctx context.Context, name string, cfg connect.Config) error
	}{
		{
			name: "put",
			fix: func(h *Standalone, ctx context.Context, name string, cfg connect.Config) (ConnectorInfo, error) {
				cfg = cfg.Clone()
				cfg[sampleconn.KeyFailStopped] = "false"
				info, created, err := h.PutConnectorConfig(ctx, name, cfg)
				if created {
					return info, errors.New("PUT reported created for an existing connector")
				}
				return info, err
			},
			bad: func(h *Standalone, ctx context.Context, name string, cfg connect.Config) error {
				cfg = cfg.Clone()
				cfg[KeyTasksMax] = "zero"
				_, _, err := h.PutConnectorConfig(ctx, name, cfg)
				return err
			},
		},
		{
			name:    "patch",
			restart: true,
			fix: func(h *Standalone, ctx context.Context, name string, _ connect.Config) (ConnectorInfo, error) {
				v := "false"
				return h.PatchConnectorConfig(ctx, name, map[string]*string{sampleconn.KeyFailStopped: &v})
			},
			bad: func(h *Standalone, ctx context.Context, name string, _ connect.Config) error {
				v := "zero"
				_, err := h.PatchConnectorConfig(ctx, name, map[string]*string{KeyTasksMax: &v})
				return err
			},
		},
	}
	for _, kind := range workerKinds {
		for _, tt := range tests {
			t.Run(kind+"/"+tt.name, func(t *testing.T) {
				rec := sampleconn.NewRecorder()
				hs := newHarness(t, kind, t.TempDir(), rec, nil)
				ctx := testCtx(t)
				name := testenv.Unique("fixme-")
				// A cleanup that fails because of the config (a stale URL, say).
				cfg := sourceConfig(testenv.Unique("t-"), 1, sampleconn.KeyFailStopped, "true")
				if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
					t.Fatal(err)
				}
				hs.awaitRunning(name, 1)
				err := hs.h.DeleteConnector(ctx, name)
				var de *DeletionError
				if !errors.As(err, &de) || !strings.Contains(err.Error(), "PUT /connectors/"+name+"/config") {
					t.Fatalf("first DELETE: %v, want a *DeletionError telling to fix the config with PUT", err)
				}

				var ce *ConfigError
				if err := tt.bad(hs.h, ctx, name, cfg); !errors.As(err, &ce) || len(ce.Fields[KeyTasksMax]) == 0 {
					t.Errorf("invalid config during deletion: %v, want a *ConfigError naming %s", err, KeyTasksMax)
				}
				info, err := tt.fix(hs.h, ctx, name, cfg)
				if err != nil || info.Config[sampleconn.KeyFailStopped] != "false" {
					t.Fatalf("fixing the config during deletion: %+v %v", info, err)
				}
				in, ok, err := hs.st.Intent(ctx, name)
				if err != nil || !ok || in.Config[sampleconn.KeyFailStopped] != "false" {
					t.Fatalf("intent after the fix = %+v %v %v, want the new config", in, ok, err)
				}
				st, err := hs.h.ConnectorStatus(ctx, name)
				if err != nil || st.Deletion == nil {
					t.Fatalf("status after the fix = %+v %v: the connector must stay in deletion", st, err)
				}
				if err := hs.h.Resume(ctx, name); err == nil {
					t.Errorf("resume after a config fix during deletion must be refused")
				}
				other := cfg.Clone()
				other[KeyConnectorClass] = sampleconn.SinkClass
				other[KeyTopics] = "x"
				if _, _, err := hs.h.PutConnectorConfig(ctx, name, other); !errors.As(err, &ce) || len(ce.Fields[KeyConnectorClass]) == 0 {
					t.Errorf("class change during deletion: %v, want a *ConfigError naming %s", err, KeyConnectorClass)
				}

				if tt.restart {
					// The fix survives a restart (the intent holds it), and
					// the attempt at start-up uses it.
					hs.restart()
				}
				if _, err := hs.h.ConnectorStatus(ctx, name); !errors.Is(err, ErrNotFound) {
					if err := hs.h.DeleteConnector(ctx, name); err != nil {
						t.Fatalf("DELETE with the fixed config: %v", err)
					}
				}
				if _, err := hs.h.ConnectorStatus(ctx, name); !errors.Is(err, ErrNotFound) {
					t.Errorf("after the deletion: %v, want ErrNotFound", err)
				}
				if res := rec.Resources(); len(res) != 0 {
					t.Errorf("resources after the deletion with the fixed config: %v", res)
				}
			})
		}
	}
}

// TestDeleteWithEmptyLedgerNeedsNoCleanupInstance (P4): a connector that
// owns nothing is deleted without starting a cleanup-only instance, so a
// Start that can never succeed (a decommissioned system) does not block it.
func TestDeleteWithEmptyLedgerNeedsNoCleanupInstance(t *testing.T) {
	for _, kind := range workerKinds {
		t.Run(kind, func(t *testing.T) {
			rec := sampleconn.NewRecorder()
			hs := newHarness(t, kind, t.TempDir(), rec, nil)
			ctx := testCtx(t)
			name := testenv.Unique("nothing-")
			cfg := sourceConfig(testenv.Unique("t-"), 1, sampleconn.KeyFailStart, "true", sampleconn.KeyResources, "")
			if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
				t.Fatal(err)
			}
			if err := hs.h.DeleteConnector(ctx, name); err != nil {
				t.Fatalf("DELETE of a connector that owns nothing and cannot start: %v", err)
			}
			if n := rec.Count(sampleconn.ConnectorInstance(name) + " Start"); n != 1 {
				t.Errorf("connector Start calls = %d, want 1 (no cleanup-only instance)", n)
			}
			if _, err := hs.h.ConnectorStatus(ctx, name); !errors.Is(err, ErrNotFound) {
				t.Errorf("after the deletion: %v, want ErrNotFound", err)
			}
		})
	}
}

// TestReadsDuringStuckDeletion (P8): while a deletion is stuck in the
// connector's Stopped, GET requests on it and operations on other
// connectors answer without waiting for it.
func TestReadsDuringStuckDeletion(t *testing.T) {
	for _, kind := range workerKinds {
		t.Run(kind, func(t *testing.T) {
			rec := sampleconn.NewRecorder()
			hs := newHarness(t, kind, t.TempDir(), rec, nil)
			ctx := testCtx(t)
			stuck, other := testenv.Unique("stuck-"), testenv.Unique("other-")
			cfg := sourceConfig(testenv.Unique("t-"), 1)
			cfg[KeyConnectorClass] = flakyClass
			if _, err := hs.h.CreateConnector(ctx, stuck, cfg, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := hs.h.CreateConnector(ctx, other, sourceConfig(testenv.Unique("t-"), 1), ""); err != nil {
				t.Fatal(err)
			}
			hs.awaitRunning(stuck, 1)
			hs.awaitRunning(other, 1)
			block := make(chan struct{})
			blockCleanup.Store(&block)
			unblock := func() {
				if blockCleanup.Swap(nil) != nil {
					close(block)
				}
			}
			t.Cleanup(unblock)

			dctx, cancel := context.WithCancel(ctx)
			deleted := make(chan error, 1)
			go func() { deleted <- hs.h.DeleteConnector(dctx, stuck) }()
			pollUntil(t, "the deletion to reach the connector", func() bool {
				st, err := hs.h.ConnectorStatus(ctx, stuck)
				return err == nil && st.Deletion != nil && st.Deletion.Phase == store.PhaseStoppingConnector
			})

			// Each read gets a deadline: waiting for the deletion's lock
			// would hit it.
			reads := []struct {
				name string
				call func(context.Context) error
			}{
				{"info", func(c context.Context) error { _, err := hs.h.ConnectorInfo(c, stuck); return err }},
				{"task configs", func(c context.Context) error { _, err := hs.h.TaskConfigs(c, stuck); return err }},
				{"topics", func(c context.Context) error { _, err := hs.h.Topics(c, stuck); return err }},
				{"status", func(c context.Context) error { _, err := hs.h.ConnectorStatus(c, stuck); return err }},
				{"resources", func(c context.Context) error { _, err := hs.h.Resources(c, stuck); return err }},
				{"other connector's info", func(c context.Context) error { _, err := hs.h.ConnectorInfo(c, other); return err }},
				{"pause another connector", func(c context.Context) error { return hs.h.Pause(c, other) }},
			}
			for _, r := range reads {
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				if err := r.call(rctx); err != nil {
					t.Errorf("%s during a stuck deletion: %v", r.name, err)
				}
				rcancel()
			}
			select {
			case err := <-deleted:
				t.Fatalf("the deletion returned while its cleanup was blocked: %v", err)
			default:
			}
			unblock()
			if err := <-deleted; err != nil {
				t.Fatalf("deletion after unblocking: %v", err)
			}
			cancel()
		})
	}
}

// TestStartupReportsOrphanLedgers: a ledger left without config or intent
// (by a version that could forget a connector under a running task) is
// listed at start-up; recreating the connector and deleting it drops what
// it lists.
func TestStartupReportsOrphanLedgers(t *testing.T) {
	rec := sampleconn.NewRecorder()
	dir := t.TempDir()
	ctx := testCtx(t)
	name := testenv.Unique("orphan-")
	st, err := store.OpenFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	leaked := rec.CreateResource(sampleconn.ConnectorInstance(name) + "/leaked")
	if err := st.PutConnector(ctx, store.ConnectorRecord{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := st.Ledger(name).Own(ctx, leaked); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteConnector(ctx, name); err != nil {
		t.Fatal(err)
	}
	st.Close()

	hs := newHarness(t, kindSync, dir, rec, nil)
	got := hs.h.OrphanLedgers()
	if len(got) != 1 || !slices.Equal(got[name], []connect.Resource{leaked}) {
		t.Fatalf("OrphanLedgers at start-up = %v, want %s owning %v", got, name, leaked)
	}
	if names, err := hs.h.Connectors(ctx); err != nil || slices.Contains(names, name) {
		t.Errorf("an orphan ledger must not show up as a connector: %v (%v)", names, err)
	}
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(testenv.Unique("t-"), 1), ""); err != nil {
		t.Fatal(err)
	}
	if err := hs.h.DeleteConnector(ctx, name); err != nil {
		t.Fatal(err)
	}
	if rec.ResourceExists(leaked.Name) {
		t.Errorf("the orphan's resource survived recreating and deleting the connector")
	}
}

// TestBackgroundRetryWaitsForAbandonedTask: the background retry of a
// deletion that failed on a stuck task completes it once the task returns,
// without another DELETE.
func TestBackgroundRetryWaitsForAbandonedTask(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil, WithDeletionRetry(20*time.Millisecond, 100*time.Millisecond))
	t.Cleanup(rec.ReleaseBlocked)
	ctx := testCtx(t)
	name := testenv.Unique("retry-")
	task, connInst := sampleconn.TaskInstance(name, 0), sampleconn.ConnectorInstance(name)
	if _, err := hs.h.CreateConnector(ctx, name, blockingSource(testenv.Unique("t-"), "100"), ""); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitCall(ctx, task+" Poll blocking", 1); err != nil {
		t.Fatal(err)
	}
	var de *DeletionError
	if err := hs.h.DeleteConnector(ctx, name); !errors.As(err, &de) {
		t.Fatalf("DELETE with a stuck task: %v, want a *DeletionError", err)
	}
	// Some background attempts fail while the task is stuck, and none
	// reaches the connector.
	pollUntil(t, "a background retry", func() bool {
		st, err := hs.h.ConnectorStatus(ctx, name)
		return err == nil && st.Deletion != nil && st.Deletion.Attempts >= 3
	})
	if got := stopCalls(rec, connInst); slices.Contains(got, "Stop(true)") {
		t.Fatalf("connector got %v while its task was stuck", got)
	}
	rec.ReleaseBlocked()
	pollUntil(t, "the background retry to complete the deletion", func() bool {
		_, err := hs.h.ConnectorStatus(ctx, name)
		return errors.Is(err, ErrNotFound)
	})
	if res := rec.Resources(); len(res) != 0 {
		t.Errorf("resources after the background retry: %v", res)
	}
}

// TestCloseIsNotHeldUpByAStuckConnector (P8): at shutdown a connector
// whose task is stuck past Close's deadline does not keep the others from
// stopping gracefully (Stopped runs before Close returns). Sequential
// stops failed this whenever the stuck connector came first.
func TestCloseIsNotHeldUpByAStuckConnector(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	t.Cleanup(rec.ReleaseBlocked)
	ctx := testCtx(t)
	stuck := testenv.Unique("stuck-")
	if _, err := hs.h.CreateConnector(ctx, stuck, blockingSource(testenv.Unique("t-"), "30000"), ""); err != nil {
		t.Fatal(err)
	}
	var others []string
	for range 3 {
		n := testenv.Unique("fine-")
		if _, err := hs.h.CreateConnector(ctx, n, sourceConfig(testenv.Unique("t-"), 1), ""); err != nil {
			t.Fatal(err)
		}
		hs.awaitRunning(n, 1)
		others = append(others, n)
	}
	if err := rec.AwaitCall(ctx, sampleconn.TaskInstance(stuck, 0)+" Poll blocking", 1); err != nil {
		t.Fatal(err)
	}
	// Well past what three healthy connectors need to stop, well short of
	// the stuck task's 30 s graceful timeout.
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	stuckTask := fmt.Sprintf("task %s-0", stuck)
	if err := hs.h.Close(cctx); err == nil || !strings.Contains(err.Error(), stuckTask) {
		t.Errorf("Close with a stuck task = %v, want an error naming %s", err, stuckTask)
	}
	for _, n := range others {
		for _, inst := range []string{sampleconn.TaskInstance(n, 0), sampleconn.ConnectorInstance(n)} {
			if got := rec.CallsOf(inst); len(got) == 0 || got[len(got)-1] != "Stopped" || !slices.Contains(got, "Stop(false)") {
				t.Errorf("%s at the end of Close = %v, want Stop(false) then Stopped", inst, got)
			}
		}
	}
}

// TestHeldBackTaskStartsWhenStuckInstanceReturns: a task restarted while
// its previous instance is stuck in Poll past the graceful timeout is held
// back (never two instances), and started by the herder itself once the
// stuck instance returns, in the connector's target state (paused too),
// after whatever operations were queued meanwhile; exactly one instance
// runs then. A stop or a deletion in between drops the held-back start.
func TestHeldBackTaskStartsWhenStuckInstanceReturns(t *testing.T) {
	tests := []struct {
		name string
		// meanwhile runs while the stuck instance is still blocked.
		meanwhile func(t *testing.T, h *Standalone, ctx context.Context, name string, cfg connect.Config)
		// wantState is the task's state after the stuck instance returned;
		// "" means the task must not be started again.
		wantState worker.State
	}{
		{name: "nothing", wantState: worker.StateRunning},
		{
			name: "restarted again",
			meanwhile: func(t *testing.T, h *Standalone, ctx context.Context, name string, _ connect.Config) {
				if err := h.RestartTask(ctx, worker.TaskID{Connector: name, Task: 0}); err != nil {
					t.Fatal(err)
				}
			},
			wantState: worker.StateRunning,
		},
		{
			name: "reconfigured",
			meanwhile: func(t *testing.T, h *Standalone, ctx context.Context, name string, cfg connect.Config) {
				cfg = cfg.Clone()
				cfg[sampleconn.KeyRate] = "300"
				if _, _, err := h.PutConnectorConfig(ctx, name, cfg); err != nil {
					t.Fatal(err)
				}
			},
			wantState: worker.StateRunning,
		},
		{
			name: "paused",
			meanwhile: func(t *testing.T, h *Standalone, ctx context.Context, name string, _ connect.Config) {
				if err := h.Pause(ctx, name); err != nil {
					t.Fatal(err)
				}
			},
			wantState: worker.StatePaused,
		},
		{
			name: "stopped",
			meanwhile: func(t *testing.T, h *Standalone, ctx context.Context, name string, _ connect.Config) {
				if err := h.Stop(ctx, name); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "deleted",
			meanwhile: func(t *testing.T, h *Standalone, ctx context.Context, name string, _ connect.Config) {
				var de *DeletionError
				if err := h.DeleteConnector(ctx, name); !errors.As(err, &de) {
					t.Fatalf("DELETE with a stuck task: %v, want a *DeletionError", err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := sampleconn.NewRecorder()
			gone := make(chan string, 8)
			hs := newHarness(t, kindReal, t.TempDir(), rec, nil, withHook(func(point, connector string) {
				if point == hookAbandonedGone {
					gone <- connector
				}
			}))
			t.Cleanup(rec.ReleaseBlocked) // never leave a goroutine blocked
			ctx := testCtx(t)
			name := testenv.Unique("held-")
			id := worker.TaskID{Connector: name, Task: 0}
			task := sampleconn.TaskInstance(name, 0)
			cfg := blockingSource(testenv.Unique("t-"), "200")
			if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
				t.Fatal(err)
			}
			if err := rec.AwaitCall(ctx, task+" Poll blocking", 1); err != nil {
				t.Fatal(err)
			}

			// The restart abandons the stuck instance and holds the new one
			// back, saying it starts by itself.
			if err := hs.h.RestartTask(ctx, id); err != nil {
				t.Fatal(err)
			}
			if n := rec.Count(task + " Start"); n != 1 {
				t.Fatalf("task Start calls after restarting a stuck task = %d, want 1 (no second instance beside it)", n)
			}
			hs.h.statusMu.Lock()
			held := hs.h.statuses[id]
			hs.h.statusMu.Unlock()
			if held.State != worker.StateFailed || !strings.Contains(held.Trace, "starts by itself once that instance returns") {
				t.Errorf("status recorded for the held-back task = %+v, want FAILED saying it starts by itself", held)
			}
			if tt.meanwhile != nil {
				tt.meanwhile(t, hs.h, ctx, name, cfg)
			}
			if n := rec.Count(task + " Start"); n != 1 {
				t.Fatalf("task Start calls while the stuck instance is still blocked = %d, want 1", n)
			}

			rec.ReleaseBlocked()
			select {
			case c := <-gone:
				if c != name {
					t.Fatalf("abandoned task handled for %q, want %q", c, name)
				}
			case <-ctx.Done():
				t.Fatalf("the herder never handled the return of the stuck instance (calls %v)", rec.CallsOf(task))
			}
			// The stuck instance has finished (Stopped, once); the handler has
			// run, so any start it made has been made.
			if n := rec.Count(task + " Stopped"); n != 1 {
				t.Errorf("task Stopped calls after the stuck instance returned = %d, want 1", n)
			}
			starts := rec.Count(task + " Start")
			if tt.wantState == "" {
				if starts != 1 {
					t.Errorf("task Start calls after the stuck instance returned = %d, want 1: the task must not start after %s", starts, tt.name)
				}
			} else {
				if starts != 2 {
					t.Fatalf("task Start calls after the stuck instance returned = %d, want 2 (one held-back start)", starts)
				}
				ws, ok := hs.h.w.TaskStatus(id)
				if !ok || ws.Abandoned {
					t.Errorf("worker status of the task = %+v %v, want one live instance", ws, ok)
				}
				pollUntil(t, "the held-back task to be "+string(tt.wantState), func() bool {
					ts, err := hs.h.TaskStatus(ctx, id)
					return err == nil && ts.State == tt.wantState
				})
			}

			switch tt.name {
			case "stopped":
				// The herder forgot the returned instance: offsets may change
				// without another stop.
				if err := hs.h.ResetOffsets(ctx, name); err != nil {
					t.Errorf("offset reset of the stopped connector after its stuck task returned: %v", err)
				}
			case "deleted":
				if err := hs.h.DeleteConnector(ctx, name); err != nil {
					t.Fatalf("DELETE after the stuck task returned: %v", err)
				}
				if res := rec.Resources(); len(res) != 0 {
					t.Errorf("resources after the deletion: %v", res)
				}
			}
			if n := rec.Count(task + " Start"); n != max(starts, 1) || n-rec.Count(task+" Stopped") > 1 {
				t.Errorf("task calls at the end = %v: more than one instance ran at once", rec.CallsOf(task))
			}
		})
	}
}

// TestHeldBackStartYieldsToAnInterruptingOperation: a stop that arrives
// while the held-back start holds the connector's lock, before it has
// registered its cancel, could neither cancel that start nor go first. The
// start now sees it, yields the lock, and looks again afterwards: the stop
// applies and the task is not started behind its back.
func TestHeldBackStartYieldsToAnInterruptingOperation(t *testing.T) {
	rec := sampleconn.NewRecorder()
	gone := make(chan string, 8)
	// The hook only signals that the held-back start holds the lock and
	// waits (bounded) until the test has seen the stop ask for an
	// interrupt: it never fails the test from the herder's goroutine.
	locked, proceed := make(chan struct{}), make(chan struct{})
	var lockedOnce, proceedOnce sync.Once
	release := func() { proceedOnce.Do(func() { close(proceed) }) }
	name := testenv.Unique("held-")
	ctx := testCtx(t)
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil, withHook(func(point, connector string) {
		switch point {
		case hookAbandonedGone:
			gone <- connector
		case hookHeldBackLocked:
			first := false
			lockedOnce.Do(func() { first = true; close(locked) })
			if first {
				select {
				case <-proceed:
				case <-ctx.Done():
				}
			}
		}
	}))
	// Runs before the herder's Close: a failing test never leaves the
	// hook holding the connector's lock.
	t.Cleanup(release)
	t.Cleanup(rec.ReleaseBlocked)
	id := worker.TaskID{Connector: name, Task: 0}
	task := sampleconn.TaskInstance(name, 0)
	if _, err := hs.h.CreateConnector(ctx, name, blockingSource(testenv.Unique("t-"), "200"), ""); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitCall(ctx, task+" Poll blocking", 1); err != nil {
		t.Fatal(err)
	}
	if err := hs.h.RestartTask(ctx, id); err != nil {
		t.Fatal(err)
	}
	rec.ReleaseBlocked()
	select {
	case <-locked:
	case <-ctx.Done():
		t.Fatalf("the held-back start never took the connector's lock (calls %v)", rec.CallsOf(task))
	}
	// The held-back start holds the lock and has not registered its cancel:
	// a stop arrives now.
	hs.h.mu.Lock()
	before := hs.h.conns[name].interrupts
	hs.h.mu.Unlock()
	stopDone := make(chan error, 1)
	go func() { stopDone <- hs.h.Stop(ctx, name) }()
	pollUntil(t, "the stop to ask for an interrupt", func() bool {
		hs.h.mu.Lock()
		defer hs.h.mu.Unlock()
		return hs.h.conns[name].interrupts != before
	})
	release()
	select {
	case <-gone:
	case <-ctx.Done():
		t.Fatalf("the herder never handled the return of the stuck instance (calls %v)", rec.CallsOf(task))
	}
	select {
	case err := <-stopDone:
		if err != nil {
			t.Fatalf("the stop that arrived meanwhile: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the stop that arrived meanwhile never returned")
	}
	if n := rec.Count(task + " Start"); n != 1 {
		t.Errorf("task Start calls = %d, want 1: the held-back start went ahead of the stop that arrived first (calls %v)", n, rec.CallsOf(task))
	}
	if st, err := hs.h.ConnectorStatus(ctx, name); err != nil || st.Connector.State != "STOPPED" {
		t.Errorf("connector status after the stop = %+v %v, want STOPPED", st, err)
	}
}

// TestDeleteThatCannotStartSaysSo: a DELETE whose context ends while another
// operation still holds the connector did not begin: it answers
// ErrRebalance (409 "retry"), not "it carries on", and the connector is
// untouched: no deletion intent, still running.
func TestDeleteThatCannotStartSaysSo(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	name := testenv.Unique("busy-")
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(testenv.Unique("t-"), 1), ""); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, 1)
	c := hs.h.get(name)
	if err := c.lock(ctx); err != nil { // another operation holds it
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := hs.h.DeleteConnector(short, name)
	cancel()
	c.unlock()
	if !errors.Is(err, ErrRebalance) || !strings.Contains(err.Error(), "did not start") {
		t.Fatalf("DELETE while the connector is held = %v, want ErrRebalance saying the deletion did not start", err)
	}
	if hs.h.deletionOf(c) != nil {
		t.Error("a deletion intent was recorded")
	}
	st, err := hs.h.ConnectorStatus(ctx, name)
	if err != nil || st.Connector.State != "RUNNING" {
		t.Errorf("status after the refused DELETE = %+v %v, want RUNNING", st, err)
	}
}

// TestCloseDoesNotWaitPastItsDeadlineForBackgroundWork: a deletion that a
// DELETE stopped waiting for goes on in the background; when it is stuck
// in something that ignores its context (here a hook standing in for a
// store write that hangs), Close gives up waiting for it at its own
// deadline and says so, instead of hanging the shutdown.
func TestCloseDoesNotWaitPastItsDeadlineForBackgroundWork(t *testing.T) {
	rec := sampleconn.NewRecorder()
	name := testenv.Unique("stuck-bg-")
	stuck, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil, withHook(func(point, connector string) {
		if point == hookIntentWritten && connector == name {
			close(stuck)
			<-release
		}
	}))
	ctx := testCtx(t)
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(testenv.Unique("t-"), 1), ""); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, 1)
	dctx, cancel := context.WithCancel(ctx)
	deleted := make(chan error, 1)
	go func() { deleted <- hs.h.DeleteConnector(dctx, name) }()
	select {
	case <-stuck:
	case <-ctx.Done():
		t.Fatal("the deletion never wrote its intent")
	}
	cancel() // the request gives up; the deletion goes on in the background
	select {
	case err := <-deleted:
		if err == nil {
			t.Fatal("DELETE returned nil while its deletion was stuck")
		}
	case <-ctx.Done():
		t.Fatal("DELETE did not return after its context ended")
	}
	cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer ccancel()
	closed := make(chan error, 1)
	go func() { closed <- hs.h.Close(cctx) }()
	select {
	case err := <-closed:
		if err == nil || !strings.Contains(err.Error(), "background work still running") {
			t.Errorf("Close = %v, want an error naming the background work", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close is still waiting for the stuck deletion long after its deadline")
	}
	// Let the deletion finish, and stop what Close had to leave running,
	// before the test's directory goes.
	once.Do(func() { close(release) })
	bgDone := make(chan struct{})
	go func() { hs.h.bgWG.Wait(); close(bgDone) }()
	select {
	case <-bgDone:
	case <-ctx.Done():
		t.Fatal("the released deletion did not finish")
	}
	if err := hs.h.w.Close(ctx); err != nil {
		t.Errorf("closing the worker after the release: %v", err)
	}
}
