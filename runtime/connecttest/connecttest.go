// Package connecttest is a conformance kit for connector authors. Run checks
// a connector against real services for the lifecycle contract of
// runtime/connect, driving it exactly as the runtime does:
//
//   - Start twice (a restart) gives the same owned resources;
//   - resources are kept after Stop(false) and Stopped;
//   - resources are gone, and the ledger empty, after Stop(true) and Stopped;
//   - a resource that existed before the connector started is never owned and
//     never dropped;
//   - Stop may repeat and run concurrently; it interrupts a blocking Poll;
//   - Stopped releases every connection and goroutine, also after a failed
//     Start;
//   - (with Subject.SourceChanges) a source task delivers again after a
//     restart what Poll returned but nobody committed, and never what was
//     committed.
package connecttest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Subject describes the connector under test and how to look at the external
// system it provisions.
type Subject struct {
	Plugin connect.Plugin
	// Config returns a fresh connector configuration whose resource names
	// are unique to t, and registers any cleanup of the test's own objects
	// with t.Cleanup.
	Config func(t testing.TB) connect.Config
	// Exists reports whether r exists in the external system.
	Exists func(ctx context.Context, r connect.Resource) (bool, error)
	// PreExisting creates, outside the connector, a resource that the
	// connector would otherwise create and own for cfg, and returns it. The
	// test's own cleanup drops it. Optional.
	PreExisting func(t testing.TB, cfg connect.Config) connect.Resource
	// BrokenConfig returns a config with which Start fails (an unreachable
	// service, say). Optional.
	BrokenConfig func(t testing.TB) connect.Config
	// Connections returns how many connections of the connector named name
	// the external system currently has. Optional; when set the kit checks
	// it drops to zero after Stopped.
	Connections func(ctx context.Context, name string) (int, error)
	// SinkRecords returns records a sink connector's task can deliver with
	// cfg (at most a few per partition, offsets increasing). Optional; when
	// set the kit checks that Put and Flush report exactly the delivered
	// offsets and that Stop makes a Put with a cancelled context return.
	SinkRecords func(t testing.TB, cfg connect.Config) []connect.SinkRecord
	// SourceChanges makes the external system produce n changes that a
	// source connector started with cfg captures (rows written, messages
	// sent). Optional; when set the kit checks that records Poll returned
	// but nobody committed are delivered again after a restart, and that
	// committed ones are not.
	SourceChanges func(t testing.TB, cfg connect.Config, n int)
	// Timeout bounds each step; default 30s.
	Timeout time.Duration
}

// Run runs every conformance check as a subtest of t.
func Run(t *testing.T, s Subject) {
	if s.Timeout == 0 {
		s.Timeout = 30 * time.Second
	}
	t.Run("RestartKeepsSameResources", func(t *testing.T) { restartKeepsSameResources(t, s) })
	t.Run("DeleteDropsOwnedResources", func(t *testing.T) { deleteDropsOwned(t, s) })
	t.Run("StopIsRepeatableAndConcurrent", func(t *testing.T) { stopRepeatable(t, s) })
	t.Run("StopInterruptsPoll", func(t *testing.T) { stopInterruptsPoll(t, s) })
	if s.SinkRecords != nil {
		t.Run("SinkFlushReportsDelivered", func(t *testing.T) { sinkFlushReportsDelivered(t, s) })
	}
	if s.SourceChanges != nil {
		t.Run("SourceRedeliversUncommitted", func(t *testing.T) { sourceRedeliversUncommitted(t, s) })
	}
	if s.PreExisting != nil {
		t.Run("PreExistingNeverDropped", func(t *testing.T) { preExistingNeverDropped(t, s) })
	}
	if s.BrokenConfig != nil {
		t.Run("StoppedAfterFailedStart", func(t *testing.T) { stoppedAfterFailedStart(t, s) })
	}
}

// instance is a connector (and its tasks) run as the runtime runs them.
type instance struct {
	t      testing.TB
	s      Subject
	name   string
	cfg    connect.Config
	ledger connect.Ledger
	conn   connect.Connector
	tasks  []connect.Task
}

func (s Subject) ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.Timeout)
	t.Cleanup(cancel)
	return ctx
}

func host(name string, task int, l connect.Ledger) *connect.Host {
	lg := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return &connect.Host{Connector: name, Task: task, Logger: lg.With("connector", name, "task", task), Ledger: l, RequestTaskReconfiguration: func() {}}
}

// start starts the connector and its tasks with a shared ledger.
func start(t testing.TB, s Subject, cfg connect.Config, l connect.Ledger) *instance {
	t.Helper()
	name := cfg["name"]
	in := &instance{t: t, s: s, name: name, cfg: cfg, ledger: l, conn: s.Plugin.NewConnector()}
	ctx := connect.WithHost(s.ctx(t), host(name, -1, l))
	if err := in.conn.Start(ctx, cfg); err != nil {
		in.conn.Stop(true)
		_ = in.conn.Stopped(ctx)
		t.Fatalf("connector Start: %v", err)
	}
	maxTasks, err := cfg.Int("tasks.max", 1)
	if err != nil {
		t.Fatal(err)
	}
	taskCfgs, err := in.conn.TaskConfigs(maxTasks)
	if err != nil {
		t.Fatalf("TaskConfigs: %v", err)
	}
	if len(taskCfgs) > maxTasks {
		t.Fatalf("TaskConfigs(%d) returned %d configs", maxTasks, len(taskCfgs))
	}
	for i, tc := range taskCfgs {
		task := s.Plugin.NewTask()
		tctx := connect.WithHost(s.ctx(t), host(name, i, l))
		if err := task.Start(tctx, tc); err != nil {
			task.Stop(false)
			_ = task.Stopped(tctx)
			t.Fatalf("task %d Start: %v", i, err)
		}
		in.tasks = append(in.tasks, task)
	}
	return in
}

// stop stops tasks first, then the connector, as the runtime does, and
// returns the first Stopped error.
func (in *instance) stop(deleted bool) error {
	var first error
	for i, task := range in.tasks {
		task.Stop(deleted)
		ctx := connect.WithHost(in.s.ctx(in.t), host(in.name, i, in.ledger))
		if err := task.Stopped(ctx); err != nil && first == nil {
			first = fmt.Errorf("task %d Stopped: %w", i, err)
		}
	}
	in.conn.Stop(deleted)
	ctx := connect.WithHost(in.s.ctx(in.t), host(in.name, -1, in.ledger))
	if err := in.conn.Stopped(ctx); err != nil && first == nil {
		first = fmt.Errorf("connector Stopped: %w", err)
	}
	return first
}

func owned(t testing.TB, s Subject, l connect.Ledger) []connect.Resource {
	t.Helper()
	rs, err := l.List(s.ctx(t))
	if err != nil {
		t.Fatalf("ledger List: %v", err)
	}
	return rs
}

func exists(t testing.TB, s Subject, r connect.Resource) bool {
	t.Helper()
	ok, err := s.Exists(s.ctx(t), r)
	if err != nil {
		t.Fatalf("Exists(%v): %v", r, err)
	}
	return ok
}

// awaitReleased waits until goroutines and connections are back to what they
// were before the connector started.
func awaitReleased(t testing.TB, s Subject, name string, goroutinesBefore int) {
	t.Helper()
	deadline := time.Now().Add(s.Timeout)
	for {
		conns := 0
		if s.Connections != nil {
			n, err := s.Connections(s.ctx(t), name)
			if err != nil {
				t.Fatalf("Connections: %v", err)
			}
			conns = n
		}
		g := runtime.NumGoroutine()
		if conns == 0 && g <= goroutinesBefore {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("after Stopped: %d connection(s) of %s still open, %d goroutines (was %d):\n%s", conns, name, g, goroutinesBefore, buf)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func restartKeepsSameResources(t *testing.T, s Subject) {
	cfg := s.Config(t)
	ledger := connect.NewMemoryLedger()
	before := runtime.NumGoroutine()

	first := start(t, s, cfg, ledger)
	got1 := owned(t, s, ledger)
	if len(got1) == 0 {
		t.Fatal("the connector owns no resources after Start: nothing was recorded in the ledger")
	}
	for _, r := range got1 {
		if !exists(t, s, r) {
			t.Errorf("owned resource %v does not exist after Start", r)
		}
	}
	if err := first.stop(false); err != nil {
		t.Fatalf("plain stop: %v", err)
	}
	awaitReleased(t, s, cfg["name"], before)
	for _, r := range got1 {
		if !exists(t, s, r) {
			t.Errorf("resource %v was dropped by a plain stop (Stop(false))", r)
		}
	}
	if after := owned(t, s, ledger); !sameSet(got1, after) {
		t.Errorf("a plain stop (Stop(false)) changed the ledger:\nbefore: %v\nafter:  %v", got1, after)
	}

	second := start(t, s, cfg, ledger)
	got2 := owned(t, s, ledger)
	if !sameSet(got1, got2) {
		t.Errorf("second Start changed the owned resources:\nfirst:  %v\nsecond: %v", got1, got2)
	}
	if err := second.stop(true); err != nil {
		t.Fatalf("delete: %v", err)
	}
	awaitReleased(t, s, cfg["name"], before)
}

func deleteDropsOwned(t *testing.T, s Subject) {
	cfg := s.Config(t)
	ledger := connect.NewMemoryLedger()
	before := runtime.NumGoroutine()
	in := start(t, s, cfg, ledger)
	rs := owned(t, s, ledger)
	if len(rs) == 0 {
		t.Fatal("the connector owns no resources after Start")
	}
	if err := in.stop(true); err != nil {
		t.Fatalf("delete: %v", err)
	}
	awaitReleased(t, s, cfg["name"], before)
	for _, r := range rs {
		if exists(t, s, r) {
			t.Errorf("owned resource %v still exists after Stop(true)+Stopped", r)
		}
	}
	if left := owned(t, s, ledger); len(left) != 0 {
		t.Errorf("ledger still lists %v after deletion", left)
	}
	// Cleanup is idempotent: a second deletion run (as after a crash) finds
	// nothing to drop and succeeds.
	for _, r := range rs {
		if err := ledger.Own(s.ctx(t), r); err != nil {
			t.Fatal(err)
		}
	}
	again := s.Plugin.NewConnector()
	h := host(cfg["name"], -1, ledger)
	h.CleanupOnly = true
	ctx := connect.WithHost(s.ctx(t), h)
	startErr := again.Start(ctx, cfg)
	again.Stop(true)
	if err := again.Stopped(ctx); err != nil {
		t.Fatalf("repeated cleanup of already-dropped resources failed (start error: %v): %v", startErr, err)
	}
	if left := owned(t, s, ledger); len(left) != 0 {
		t.Errorf("repeated cleanup left ledger entries %v", left)
	}
}

func stopRepeatable(t *testing.T, s Subject) {
	cfg := s.Config(t)
	ledger := connect.NewMemoryLedger()
	in := start(t, s, cfg, ledger)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			in.conn.Stop(false)
			for _, task := range in.tasks {
				task.Stop(false)
			}
		})
	}
	wg.Wait()
	if err := in.stop(true); err != nil {
		t.Fatalf("delete after repeated Stop: %v", err)
	}
}

func stopInterruptsPoll(t *testing.T, s Subject) {
	cfg := s.Config(t)
	ledger := connect.NewMemoryLedger()
	in := start(t, s, cfg, ledger)
	defer func() {
		if err := in.stop(true); err != nil {
			t.Errorf("delete: %v", err)
		}
	}()
	for i, task := range in.tasks {
		src, ok := task.(connect.SourceTask)
		if !ok {
			continue
		}
		// Drain whatever is there, then block in Poll and stop from outside,
		// cancelling the context as the runtime does.
		ctx, cancel := context.WithCancel(s.ctx(t))
		done := make(chan error, 1)
		go func() {
			for {
				recs, err := src.Poll(ctx)
				if err != nil || ctx.Err() != nil {
					done <- err
					return
				}
				_ = recs
			}
		}()
		time.Sleep(100 * time.Millisecond) // let Poll block; a wait, not an assertion
		cancel()
		src.Stop(false)
		select {
		case <-done:
		case <-time.After(s.Timeout):
			t.Fatalf("task %d: Poll did not return after its context was cancelled and Stop was called", i)
		}
	}
}

func preExistingNeverDropped(t *testing.T, s Subject) {
	cfg := s.Config(t)
	pre := s.PreExisting(t, cfg)
	if !exists(t, s, pre) {
		t.Fatalf("PreExisting returned %v, which does not exist", pre)
	}
	ledger := connect.NewMemoryLedger()
	in := start(t, s, cfg, ledger)
	if slices.Contains(owned(t, s, ledger), pre) {
		t.Errorf("the connector recorded pre-existing %v as owned", pre)
	}
	if err := in.stop(true); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if !exists(t, s, pre) {
		t.Errorf("pre-existing %v was dropped on deletion", pre)
	}
}

func stoppedAfterFailedStart(t *testing.T, s Subject) {
	cfg := s.BrokenConfig(t)
	before := runtime.NumGoroutine()
	ledger := connect.NewMemoryLedger()
	c := s.Plugin.NewConnector()
	ctx := connect.WithHost(s.ctx(t), host(cfg["name"], -1, ledger))
	if err := c.Start(ctx, cfg); err == nil {
		c.Stop(true)
		_ = c.Stopped(ctx)
		t.Fatal("Start succeeded with BrokenConfig")
	}
	c.Stop(false)
	if err := c.Stopped(ctx); err != nil {
		t.Errorf("Stopped after a failed Start and a plain stop returned %v", err)
	}
	awaitReleased(t, s, cfg["name"], before)
	if left := owned(t, s, ledger); len(left) != 0 {
		t.Errorf("a failed Start left owned resources %v", left)
	}
}

func sameSet(a, b []connect.Resource) bool {
	if len(a) != len(b) {
		return false
	}
	for _, r := range a {
		if !slices.Contains(b, r) {
			return false
		}
	}
	return true
}

// sinkFlushReportsDelivered puts records into every sink task, flushes, and
// expects each partition's next offset after the last record; then a Put
// whose context is cancelled, with Stop called concurrently, must return.
func sinkFlushReportsDelivered(t *testing.T, s Subject) {
	cfg := s.Config(t)
	ledger := connect.NewMemoryLedger()
	in := start(t, s, cfg, ledger)
	defer func() {
		if err := in.stop(true); err != nil {
			t.Errorf("delete: %v", err)
		}
	}()
	recs := s.SinkRecords(t, cfg)
	want := map[connect.TopicPartition]int64{}
	for _, r := range recs {
		want[r.TopicPartition()] = max(want[r.TopicPartition()], r.Offset+1)
	}
	for i, task := range in.tasks {
		sink, ok := task.(connect.SinkTask)
		if !ok {
			continue
		}
		if err := sink.Put(s.ctx(t), recs); err != nil {
			t.Fatalf("task %d Put: %v", i, err)
		}
		got, err := sink.Flush(s.ctx(t))
		if err != nil {
			t.Fatalf("task %d Flush: %v", i, err)
		}
		for tp, o := range want {
			if got[tp] != o {
				t.Errorf("task %d: Flush reported offset %d for %v, want %d (the next offset after the delivered records)", i, got[tp], tp, o)
			}
		}
		ctx, cancel := context.WithCancel(s.ctx(t))
		done := make(chan error, 1)
		go func() { done <- sink.Put(ctx, recs) }()
		cancel()
		sink.Stop(false)
		select {
		case <-done:
		case <-time.After(s.Timeout):
			t.Fatalf("task %d: Put did not return after its context was cancelled and Stop was called", i)
		}
	}
}

// pollSources polls every source task (no Commit) until at least want
// records arrived or, with want == 0, for quiet; it returns the records per
// task.
func pollSources(t testing.TB, s Subject, in *instance, want int, quiet time.Duration) [][]connect.SourceRecord {
	t.Helper()
	out := make([][]connect.SourceRecord, len(in.tasks))
	total := 0
	deadline := time.Now().Add(s.Timeout)
	if want == 0 {
		deadline = time.Now().Add(quiet)
	}
	for total < want || want == 0 {
		if time.Now().After(deadline) {
			if want == 0 {
				break
			}
			t.Fatalf("Poll returned %d records, want at least %d", total, want)
		}
		for i, task := range in.tasks {
			src, ok := task.(connect.SourceTask)
			if !ok {
				continue
			}
			ctx, cancel := context.WithTimeout(s.ctx(t), 200*time.Millisecond)
			recs, err := src.Poll(ctx)
			cancelled := ctx.Err() != nil
			cancel()
			if err != nil && !cancelled {
				t.Fatalf("task %d Poll: %v", i, err)
			}
			out[i] = append(out[i], recs...)
			total += len(recs)
		}
	}
	return out
}

func sourceRedeliversUncommitted(t *testing.T, s Subject) {
	const n = 10
	cfg := s.Config(t)
	ledger := connect.NewMemoryLedger()
	first := start(t, s, cfg, ledger)
	s.SourceChanges(t, cfg, n)
	pollSources(t, s, first, n, 0)
	// Nothing was committed (Kafka never acknowledged): a restart delivers
	// every record again.
	if err := first.stop(false); err != nil {
		t.Fatalf("plain stop: %v", err)
	}
	second := start(t, s, cfg, ledger)
	again := pollSources(t, s, second, n, 0)
	for i, task := range second.tasks {
		if src, ok := task.(connect.SourceTask); ok && len(again[i]) > 0 {
			if err := src.Commit(s.ctx(t), again[i]); err != nil {
				t.Fatalf("task %d Commit: %v", i, err)
			}
		}
	}
	if err := second.stop(false); err != nil {
		t.Fatalf("plain stop: %v", err)
	}
	// Committed records are not delivered again.
	third := start(t, s, cfg, ledger)
	defer func() {
		if err := third.stop(true); err != nil {
			t.Errorf("delete: %v", err)
		}
	}()
	for i, recs := range pollSources(t, s, third, 0, time.Second) {
		if len(recs) > 0 {
			t.Errorf("task %d delivered %d committed record(s) again after a restart", i, len(recs))
		}
	}
}
