package herder

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// An operation that asked for an interrupt (interruptStart) and has not
// reached the connector's lock yet must go before a background start that
// yielded to it: the start's retry used to take the lock again at once
// (nothing was waiting on it yet), register its cancel (the interrupt count
// had not moved since the retry noted it) and block in Start, and the
// operation then waited behind that Start until its context ended. Each
// operation that interrupts starts is checked, paused by a hook right after
// interruptStart while the resumed start of a refused change yields and
// comes back.
func TestYieldedStartWaitsForTheInterruptingOperation(t *testing.T) {
	type check func(t *testing.T, h *Standalone, ctx context.Context)
	status := func(want worker.State) check {
		return func(t *testing.T, h *Standalone, ctx context.Context) {
			if s, err := h.ConnectorStatus(ctx, "x"); err != nil || s.Connector.State != want {
				t.Errorf("status afterwards = %+v (%v), want %s", s.Connector, err, want)
			}
		}
	}
	cases := []struct {
		name  string
		op    func(ctx context.Context, h *Standalone) error
		check check
	}{
		{"stop", func(ctx context.Context, h *Standalone) error { return h.Stop(ctx, "x") }, status(worker.StateStopped)},
		{"delete", func(ctx context.Context, h *Standalone) error { return h.DeleteConnector(ctx, "x") },
			func(t *testing.T, h *Standalone, ctx context.Context) {
				if _, err := h.ConnectorStatus(ctx, "x"); !errors.Is(err, ErrNotFound) {
					t.Errorf("status after the deletion: %v, want ErrNotFound", err)
				}
			}},
		{"restart", func(ctx context.Context, h *Standalone) error {
			_, err := h.Restart(ctx, "x", true, false)
			return err
		}, status(worker.StateRunning)},
		{"put", func(ctx context.Context, h *Standalone) error {
			_, _, err := h.PutConnectorConfig(ctx, "x", connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1", "slow.v": "2"})
			return err
		}, func(t *testing.T, h *Standalone, ctx context.Context) {
			status(worker.StateRunning)(t, h, ctx)
			if info, err := h.ConnectorInfo(ctx, "x"); err != nil || info.Config["slow.v"] != "2" {
				t.Errorf("config afterwards = %v (%v), want the PUT's", info.Config, err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			slow := newSlowStarts()
			resume, op, yield := newPausePoint(ctx), newPausePoint(ctx), signalPoint(ctx)
			resumeLocked, asked, yieldWait := resume.reached, op.reached, yield.reached
			releaseResume, releaseOp := resume.release, op.release
			var armed atomic.Bool
			hook := interruptHooks(resume, op, yield, &armed)
			// The start at boot blocks (an unreachable system) until its ctx
			// ends; so does the next one, the resumed start.
			gate := make(chan struct{})
			var gateOnce sync.Once
			h := bootBlocked(t, ctx, sampleconn.NewRecorder(), slow, gate, hook)
			t.Cleanup(releaseResume)
			t.Cleanup(releaseOp)
			t.Cleanup(func() { gateOnce.Do(func() { close(gate) }) })
			cfg := connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}
			slow.mu.Lock()
			slow.gate, slow.entered, slow.interrupted = gate, make(chan struct{}), make(chan struct{})
			slow.mu.Unlock()
			changed := cfg.Clone()
			changed["slow.validate"] = "once"
			var ce *ConfigError
			if _, _, err := h.PutConnectorConfig(ctx, "x", changed); !errors.As(err, &ce) {
				t.Fatalf("PUT refused on the second look: %v, want a ConfigError", err)
			}
			select {
			case <-resumeLocked:
			case <-ctx.Done():
				t.Fatal("the start after the refused change never took the lock")
			}
			// The operation asks for an interrupt while the resumed start
			// holds the lock, and pauses before it waits for the lock.
			armed.Store(true)
			// Normally applied at once; the bug waits for the blocked Start
			// until this context ends.
			octx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			opDone := make(chan error, 1)
			go func() { opDone <- tc.op(octx, h) }()
			select {
			case <-asked:
			case <-ctx.Done():
				t.Fatal("the operation never asked for an interrupt")
			}
			releaseResume()
			// The resumed start yields; its retry either waits for the
			// operation (fixed) or starts again at once and blocks (the bug).
			started := false
			select {
			case <-yieldWait:
			case <-slow.entered:
				started = true
			case <-ctx.Done():
				t.Fatal("the resumed start neither yielded nor started")
			}
			slow.mu.Lock()
			slow.gate = nil // later starts (the operation's own) do not block
			slow.mu.Unlock()
			releaseOp()
			if err := <-opDone; err != nil {
				t.Fatalf("the operation: %v, want it applied (resumed start began ahead of it: %v)", err, started)
			}
			if started {
				t.Error("the resumed start began while the operation that asked for an interrupt first was on its way to the lock")
			}
			tc.check(t, h, ctx)
		})
	}
}

// gatedTaskConfigs is the sample source whose connector's TaskConfigs waits
// for the test while gate is set (a connector that looks its tasks up in
// an external system).
type gatedTaskConfigs struct {
	connect.Connector
	gate    *atomic.Pointer[chan struct{}]
	entered chan struct{}
	once    *sync.Once
}

func (c *gatedTaskConfigs) TaskConfigs(n int) ([]connect.Config, error) {
	if g := c.gate.Load(); g != nil {
		c.once.Do(func() { close(c.entered) })
		<-*g
	}
	return c.Connector.TaskConfigs(n)
}

// A stop that interrupts a start at boot while the connector generates its
// task configs leaves the connector STOPPED, not FAILED with the interrupted
// start's "generating task configs: context canceled".
func TestStopInterruptingTaskConfigsAtBootEndsStopped(t *testing.T) {
	rec := sampleconn.NewRecorder()
	var gate atomic.Pointer[chan struct{}]
	entered := make(chan struct{})
	var once sync.Once
	src := sampleconn.Plugins(rec)[0]
	reg, err := plugins.New(append(sampleconn.Plugins(rec), connect.Plugin{
		Class: "gated-source",
		NewConnector: func() connect.Connector {
			return &gatedTaskConfigs{Connector: src.NewConnector(), gate: &gate, entered: entered, once: &once}
		},
		NewTask: src.NewTask,
	})...)
	if err != nil {
		t.Fatal(err)
	}
	asked := make(chan struct{}, 1)
	var armed atomic.Bool
	hs := &harness{t: t, kind: kindReal, dir: t.TempDir(), rec: rec, reg: reg, seeds: testenv.KafkaBrokers(t),
		extra: []Option{withHook(func(point, _ string) {
			if point == hookInterruptAsked && armed.Load() {
				select {
				case asked <- struct{}{}:
				default:
				}
			}
		})}}
	hs.dropKafkaObjectsAtCleanup()
	hs.start()
	ctx := testCtx(t)
	name := testenv.Unique("gated-")
	cfg := sourceConfig(testenv.Unique("t-"), 1)
	cfg[KeyConnectorClass] = "gated-source"
	if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, 1)
	g := make(chan struct{})
	var gOnce sync.Once
	release := func() { gOnce.Do(func() { close(g) }) }
	gate.Store(&g)
	hs.restart()
	t.Cleanup(release)
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the start at boot never asked for task configs")
	}
	armed.Store(true)
	stopDone := make(chan error, 1)
	go func() { stopDone <- hs.h.Stop(ctx, name) }()
	select {
	case <-asked: // the start's context is cancelled
	case <-ctx.Done():
		t.Fatal("the stop never asked for an interrupt")
	}
	release()
	if err := <-stopDone; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if st, err := hs.h.ConnectorStatus(ctx, name); err != nil || st.Connector.State != worker.StateStopped {
		t.Errorf("status after the stop = %+v (%v), want STOPPED", st.Connector, err)
	}
}

// A STOPPED connector whose class was not installed, given a config with an
// installed class, reads STOPPED, not FAILED with "Class ... could not be
// found".
func TestPutInstalledClassOnStoppedConnectorWithUnknownClass(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	slow := newSlowStarts()
	h, _, closeSync := openSync(t, dir, slow.plugin())
	if _, err := h.CreateConnector(ctx, "x", connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}, worker.TargetStopped); err != nil {
		t.Fatal(err)
	}
	closeSync()
	h, _, _ = openSync(t, dir) // "slow" is no longer installed
	if s, err := h.ConnectorStatus(ctx, "x"); err != nil || s.Connector.State != worker.StateFailed {
		t.Fatalf("status with the class missing = %+v (%v), want FAILED", s.Connector, err)
	}
	cfg := sourceConfig("t", 1)
	if _, _, err := h.PutConnectorConfig(ctx, "x", cfg); err != nil {
		t.Fatal(err)
	}
	if s, err := h.ConnectorStatus(ctx, "x"); err != nil || s.Connector.State != worker.StateStopped {
		t.Errorf("status after the PUT = %+v (%v), want STOPPED", s.Connector, err)
	}
}

// A PUT of a config that waited for the connector's lock while a DELETE
// held it creates the connector anew once the deletion completed (PUT is
// create-or-update: 201 or 200, never 404), as Kafka Connect's herder,
// which applies the two in order, does.
func TestPutQueuedBehindADeletionCreatesTheConnector(t *testing.T) {
	rec := sampleconn.NewRecorder()
	asked := make(chan struct{}, 1)
	var armed atomic.Bool
	tasksStopped := make(chan struct{}, 1)
	hs := newHarness(t, kindSync, t.TempDir(), rec, nil, withHook(func(point, _ string) {
		switch {
		case point == hookInterruptAsked && armed.Load():
			select {
			case asked <- struct{}{}:
			default:
			}
		case point == hookTasksStopped:
			select {
			case tasksStopped <- struct{}{}:
			default:
			}
		}
	}))
	ctx := testCtx(t)
	name := testenv.Unique("del-put-")
	cfg := sourceConfig("t", 1)
	cfg[KeyConnectorClass] = flakyClass
	if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	blockCleanup.Store(&release)
	t.Cleanup(func() {
		unblock()
		blockCleanup.Store(nil)
	})
	delDone := make(chan error, 1)
	go func() { delDone <- hs.h.DeleteConnector(ctx, name) }()
	select {
	case <-tasksStopped: // the deletion holds the lock; the cleanup is held
	case <-ctx.Done():
		t.Fatal("the deletion never stopped the tasks")
	}
	next := sourceConfig("t2", 1)
	armed.Store(true)
	type putResult struct {
		created bool
		err     error
	}
	putDone := make(chan putResult, 1)
	go func() {
		_, created, err := hs.h.PutConnectorConfig(ctx, name, next)
		putDone <- putResult{created, err}
	}()
	select {
	case <-asked:
	case <-ctx.Done():
		t.Fatal("the PUT never reached the connector")
	}
	unblock()
	if err := <-delDone; err != nil {
		t.Fatalf("DELETE: %v", err)
	}
	r := <-putDone
	if r.err != nil || !r.created {
		t.Fatalf("PUT queued behind the DELETE: created=%v, %v; want the connector created", r.created, r.err)
	}
	info, err := hs.h.ConnectorInfo(ctx, name)
	if err != nil || info.Config[sampleconn.KeyTopic] != "t2" {
		t.Errorf("connector after the PUT: %+v (%v), want the PUT's config", info, err)
	}
}

// A background start that begins after an operation asked for an
// interrupt, and before that operation waits for the lock, does not start:
// here the connector asks for a task reconfiguration (whose new task Start
// blocks) while a stop is on its way to the lock. The reconfiguration noted
// the interrupt count after the stop had moved it, so the count alone did
// not tell it the stop was coming.
func TestReconfigurationAfterAnInterruptWaitsForTheOperation(t *testing.T) {
	rec := sampleconn.NewRecorder()
	var host atomic.Pointer[connect.Host]
	var blockTasks, armed atomic.Bool
	src := sampleconn.Plugins(rec)[0]
	reg, err := plugins.New(append(sampleconn.Plugins(rec), connect.Plugin{
		Class: "reconf-source",
		NewConnector: func() connect.Connector {
			return &reconfConn{Connector: src.NewConnector(), host: &host, blockTasks: &blockTasks}
		},
		NewTask: src.NewTask,
	})...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	op, yield := newPausePoint(ctx), signalPoint(ctx)
	asked, yieldWait, release := op.reached, yield.reached, op.release
	hs := &harness{t: t, kind: kindReal, dir: t.TempDir(), rec: rec, reg: reg, seeds: testenv.KafkaBrokers(t),
		extra: []Option{withHook(func(point, _ string) {
			switch point {
			case hookInterruptAsked:
				if armed.Load() {
					op.hold()
				}
			case hookYieldWait:
				yield.hold()
			}
		})}}
	hs.dropKafkaObjectsAtCleanup()
	hs.start()
	t.Cleanup(release)
	name := testenv.Unique("reconf-")
	cfg := sourceConfig(testenv.Unique("t-"), 1)
	cfg[KeyConnectorClass] = "reconf-source"
	if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, 1)
	armed.Store(true)
	// Normally applied at once; the bug waits for the blocked task Start
	// until this context ends.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stopDone := make(chan error, 1)
	go func() { stopDone <- hs.h.Stop(sctx, name) }()
	select {
	case <-asked:
	case <-ctx.Done():
		t.Fatal("the stop never asked for an interrupt")
	}
	blockTasks.Store(true)
	host.Load().RequestTaskReconfiguration()
	task := sampleconn.TaskInstance(name, 0)
	blocking := make(chan struct{})
	go func() {
		if rec.AwaitCall(ctx, task+" Start blocking", 1) == nil {
			close(blocking)
		}
	}()
	started := false
	select {
	case <-yieldWait:
	case <-blocking:
		started = true
	case <-ctx.Done():
		t.Fatal("the reconfiguration neither yielded nor started its tasks")
	}
	release()
	if err := <-stopDone; err != nil {
		t.Fatalf("Stop: %v, want it applied (reconfiguration began ahead of it: %v)", err, started)
	}
	if started {
		t.Error("the reconfiguration started a task while a stop that asked for an interrupt first was on its way to the lock")
	}
	if st, err := hs.h.ConnectorStatus(ctx, name); err != nil || st.Connector.State != worker.StateStopped {
		t.Errorf("status after the stop = %+v (%v), want STOPPED", st.Connector, err)
	}
}

// While a connector's or a task's Start has not returned (a start at boot
// blocked on an unreachable system), its status reads UNASSIGNED (decision
// 0022), not an empty state.
func TestStatusWhileStartBlocksIsUnassigned(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	name := testenv.Unique("starting-")
	cfg := sourceConfig(testenv.Unique("t-"), 1, sampleconn.KeyBlockStart, sampleconn.BlockUntilCtx)
	if _, err := hs.h.CreateConnector(ctx, name, cfg, worker.TargetStopped); err != nil {
		t.Fatal(err)
	}
	hs.restart() // stopped: nothing starts at boot
	resumed, changed := make(chan error, 1), make(chan error, 1)
	go func() { resumed <- hs.h.Resume(ctx, name) }()
	if err := rec.AwaitCall(ctx, sampleconn.ConnectorInstance(name)+" Start blocking", 1); err != nil {
		t.Fatal(err)
	}
	if st, err := hs.h.ConnectorStatus(ctx, name); err != nil || st.Connector.State != worker.StateUnassigned {
		t.Errorf("status during the connector's Start = %+v (%v), want UNASSIGNED", st.Connector, err)
	}
	// A config change interrupts the blocked Start; now only the task's
	// Start blocks.
	cfg[sampleconn.KeyFailTask] = "0"
	go func() { _, _, err := hs.h.PutConnectorConfig(ctx, name, cfg); changed <- err }()
	if err := <-resumed; err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitCall(ctx, sampleconn.TaskInstance(name, 0)+" Start blocking", 1); err != nil {
		t.Fatal(err)
	}
	st, err := hs.h.ConnectorStatus(ctx, name)
	if err != nil || len(st.Tasks) != 1 || st.Tasks[0].State != worker.StateUnassigned {
		t.Errorf("status during the task's Start = %+v (%v), want the task UNASSIGNED", st, err)
	}
	if ts, err := hs.h.TaskStatus(ctx, worker.TaskID{Connector: name, Task: 0}); err != nil || ts.State != worker.StateUnassigned {
		t.Errorf("task status during its Start = %+v (%v), want UNASSIGNED", ts, err)
	}
	if err := hs.h.Stop(ctx, name); err != nil { // interrupts the task's Start
		t.Fatal(err)
	}
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
}
