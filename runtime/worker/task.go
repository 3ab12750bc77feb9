package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// taskInstance is one task instance and the goroutine that runs it: Start,
// the source or sink loop, the final commit, Stopped.
type taskInstance struct {
	w      *Worker
	id     TaskID
	run    TaskRun
	class  string
	set    settings
	task   connect.Task
	typ    connect.ConnectorType
	host   *connect.Host
	log    *slog.Logger
	base   context.Context // carries the Host; never cancelled
	hctx   context.Context // given to Start: cancelled on Stop
	cancel context.CancelFunc

	mu         sync.Mutex
	status     Status
	target     TargetState
	changed    chan struct{} // closed and replaced on every target or stop change
	stopping   bool
	deleted    bool
	stopCalled bool // Stop was called at least once
	final      bool // Stopped is about to be called: no more Stop calls
	abandoned  bool // the graceful timeout passed while Poll/Put ran
	startBegan bool // Start was called: Stop may be delivered from now on
	loopCancel context.CancelFunc
	stopAt     time.Time
	// Each Stop call runs in its own goroutine, so that a Stop that
	// blocks holds up neither its caller nor status reads (t.mu); stopMu
	// keeps them from overlapping each other. stopsInFlight counts them,
	// and stopsIdle is closed when the count drops to zero: runTask waits
	// for them (awaitStops) before the final flush and before Stopped, and
	// then closes stopsReturned.
	stopMu        sync.Mutex
	stopsInFlight int
	stopsIdle     chan struct{}
	stopsReturned chan struct{}

	started   chan struct{} // closed once Start returned
	startErr  error
	loopDone  chan struct{} // closed when Poll/Put have returned for good
	finalDone chan struct{} // closed after the final flush, commit and client close
	done      chan struct{} // closed after Stopped returned
	stopErr   error         // Stopped's error, read after done
	// stoppedDeleted is the connectorDeleted Stopped ran with, read after
	// done: a deletion that arrives after a plain Stopped must be told.
	stoppedDeleted bool
}

func (t *taskInstance) getStatus() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.status
	s.WorkerID = t.w.id
	return s
}

func (t *taskInstance) setStatus(s Status) {
	t.mu.Lock()
	// Once abandoned, always abandoned: a late failure of the blocked
	// call must not hide it, or the herder would start a second instance
	// beside one that may still commit and run Stopped.
	s.Abandoned = s.Abandoned || t.abandoned
	t.status = s
	t.mu.Unlock()
	t.reportIfCurrent(s)
}

// reportIfCurrent reports s unless another instance has replaced t under
// its id: an abandoned instance that fails later must not overwrite the
// status of its successor. statusMu orders the check and the report against
// the successor's own reports.
func (t *taskInstance) reportIfCurrent(s Status) {
	w := t.w
	w.statusMu.Lock()
	defer w.statusMu.Unlock()
	w.mu.Lock()
	cur, ok := w.tasks[t.id]
	w.mu.Unlock()
	if ok && cur != t {
		t.log.Debug("status of a replaced instance not reported", "state", string(s.State))
		return
	}
	w.report(t.id.Connector, t.id.Task, s)
}

// notify wakes the loop; callers hold t.mu.
func (t *taskInstance) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// state returns the loop's view: whether to stop, whether paused, and a
// channel closed on the next change.
func (t *taskInstance) state() (stopping, paused bool, changed <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopping, t.target != TargetRunning, t.changed
}

// loopContext returns a context for one Poll/Put call, cancelled on pause or
// stop.
func (t *taskInstance) loopContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.base)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopping || t.target != TargetRunning {
		cancel()
	}
	t.loopCancel = cancel
	return ctx, cancel
}

func (t *taskInstance) setTarget(target TargetState) {
	t.mu.Lock()
	if t.target == target {
		t.mu.Unlock()
		return
	}
	t.target = target
	if target != TargetRunning && t.loopCancel != nil {
		t.loopCancel()
	}
	t.notify()
	failed := t.status.State == StateFailed
	stopping := t.stopping
	t.mu.Unlock()
	if !failed && !stopping {
		state := StateRunning
		if target != TargetRunning {
			state = StatePaused
		}
		t.setStatus(Status{State: state})
		t.log.Info("task target state changed", "target", string(target))
	}
}

// requestStop cancels the in-flight Poll/Put and calls Stop(deleted), unless
// Stopped has begun. It may be called more than once.
func (t *taskInstance) requestStop(deleted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.final {
		return
	}
	if !t.stopping {
		t.stopping = true
		t.stopAt = time.Now()
		t.notify()
	}
	if deleted {
		t.deleted = true
	}
	if t.loopCancel != nil {
		t.loopCancel()
	}
	t.cancel()
	if !t.startBegan {
		return // runTask sees stopping and never starts the instance
	}
	// Added under t.mu, before final: runTask's wait for the Stop calls
	// sees it, so no Stop call follows or overlaps Stopped.
	t.stopCalled = true
	if t.stopsInFlight == 0 {
		t.stopsIdle = make(chan struct{})
	}
	t.stopsInFlight++
	go func() {
		defer t.stopReturned()
		t.stopMu.Lock()
		defer t.stopMu.Unlock()
		// What is asked by now: the calls may run in another order than
		// requested, and a deletion must not be followed by a plain Stop.
		t.mu.Lock()
		deleted := t.deleted
		t.mu.Unlock()
		if err := guard("Stop", func() error { t.task.Stop(deleted); return nil }); err != nil {
			t.log.Error("task Stop failed", "error", err, "deleted", deleted)
		}
	}()
}

func (t *taskInstance) stopReturned() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopsInFlight--
	if t.stopsInFlight == 0 {
		close(t.stopsIdle)
	}
}

// awaitStops waits until no Stop call runs.
func (t *taskInstance) awaitStops() {
	for {
		t.mu.Lock()
		n, idle := t.stopsInFlight, t.stopsIdle
		t.mu.Unlock()
		if n == 0 {
			return
		}
		<-idle
	}
}

// StartTask creates a task instance and runs it in its own goroutine: Start,
// then the source or sink loop. It returns once Start has been attempted,
// with Start's error (the task is then FAILED and its Stop(false) and
// Stopped have run). A task id whose previous instance failed or stopped is
// started as a fresh instance.
func (w *Worker) StartTask(ctx context.Context, run TaskRun) error {
	class := run.ConnectorConfig[KeyConnectorClass]
	p, ok := w.plugins.Lookup(class)
	if !ok {
		return fmt.Errorf("worker: task %s-%d: %w %q: install the plugin or fix connector.class", run.ID.Connector, run.ID.Task, ErrUnknownPlugin, class)
	}
	var typ connect.ConnectorType
	if err := guard("NewConnector/Spec", func() error { typ = p.NewConnector().Spec().Type; return nil }); err != nil {
		return fmt.Errorf("worker: task %s-%d: %w", run.ID.Connector, run.ID.Task, err)
	}
	set, err := w.parseSettings(typ, run.ConnectorConfig)
	if err != nil {
		return fmt.Errorf("worker: task %s-%d: %w", run.ID.Connector, run.ID.Task, err)
	}
	var missing []string
	if len(w.seeds) == 0 {
		missing = append(missing, "Kafka brokers (WithKafka)")
	}
	if typ == connect.TypeSource && w.offsets == nil {
		missing = append(missing, "an offset store (WithOffsetStore)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("worker: task %s-%d: the worker has no %v: configure it", run.ID.Connector, run.ID.Task, missing)
	}
	var task connect.Task
	if err := guard("NewTask", func() error { task = p.NewTask(); return nil }); err != nil {
		return fmt.Errorf("worker: task %s-%d: %w", run.ID.Connector, run.ID.Task, err)
	}
	switch typ {
	case connect.TypeSource:
		if _, ok := task.(connect.SourceTask); !ok {
			return fmt.Errorf("worker: plugin %s: source connector's NewTask returned %T, not a connect.SourceTask", p.Class, task)
		}
	case connect.TypeSink:
		if _, ok := task.(connect.SinkTask); !ok {
			return fmt.Errorf("worker: plugin %s: sink connector's NewTask returned %T, not a connect.SinkTask", p.Class, task)
		}
	default:
		return fmt.Errorf("worker: plugin %s has connector type %q: want source or sink", p.Class, typ)
	}
	host := w.host(run.ID.Connector, run.ID.Task, run.Ledger, run.CleanupOnly, typ)
	target := run.Target
	if target == "" {
		target = TargetRunning
	}
	base := connect.WithHost(context.WithoutCancel(ctx), host)
	hctx, cancel := context.WithCancel(base)
	t := &taskInstance{
		w: w, id: run.ID, run: run, class: class, set: set, task: task, typ: typ, host: host, log: host.Logger,
		base: base, hctx: hctx, cancel: cancel, target: target, changed: make(chan struct{}),
		started: make(chan struct{}), loopDone: make(chan struct{}), finalDone: make(chan struct{}), stopsReturned: make(chan struct{}), done: make(chan struct{}),
	}
	if typ == connect.TypeSink {
		host.Errors = &errantReporter{t: t}
	}
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			cancel()
			return fmt.Errorf("worker: starting task %s-%d: %w", run.ID.Connector, run.ID.Task, ErrClosed)
		}
		old := w.tasks[run.ID]
		if old == nil {
			break
		}
		old.mu.Lock()
		abandoned := old.abandoned
		old.mu.Unlock()
		if abandoned {
			break // still blocked; it finishes on its own
		}
		select {
		case <-old.done:
		case <-old.loopDone:
			// Its final commit is still running: a fresh instance now would
			// read (and send again) what that commit is about to confirm.
			w.mu.Unlock()
			select {
			case <-old.done:
			case <-ctx.Done():
				cancel()
				return fmt.Errorf("worker: task %s-%d: the previous instance was still finishing its final commit when the caller gave up: %w", run.ID.Connector, run.ID.Task, ctx.Err())
			}
			continue
		default:
			w.mu.Unlock()
			cancel()
			return fmt.Errorf("worker: task %s-%d: %w; stop it first", run.ID.Connector, run.ID.Task, ErrAlreadyExists)
		}
		break
	}
	// w.mu is held here.
	w.tasks[run.ID] = t
	w.wg.Add(1)
	w.mu.Unlock()

	go func() {
		defer w.wg.Done()
		t.runTask()
	}()
	select {
	case <-t.started:
	case <-ctx.Done():
		return fmt.Errorf("worker: task %s-%d: still starting when the caller gave up: %w", run.ID.Connector, run.ID.Task, ctx.Err())
	}
	if t.startErr != nil {
		// Wait for Stop and Stopped, so the caller sees a finished instance.
		select {
		case <-t.done:
		case <-ctx.Done():
		}
		return fmt.Errorf("worker: task %s-%d failed to start: %w", run.ID.Connector, run.ID.Task, t.startErr)
	}
	return nil
}

// runTask is the task goroutine.
func (t *taskInstance) runTask() {
	t.mu.Lock()
	if t.stopping {
		// Stopped before Start was attempted: nothing is ever called.
		t.mu.Unlock()
		close(t.started)
		close(t.loopDone)
		close(t.finalDone)
		close(t.stopsReturned)
		close(t.done)
		return
	}
	t.startBegan = true
	t.mu.Unlock()
	t.log.Info("starting task", "class", t.class, "cleanup_only", t.run.CleanupOnly)
	err := guard("Start", func() error { return t.task.Start(t.hctx, t.run.TaskConfig.Clone()) })
	t.startErr = err
	if err == nil {
		t.mu.Lock()
		paused := t.target != TargetRunning
		t.mu.Unlock()
		state := StateRunning
		if paused {
			state = StatePaused
		}
		t.setStatus(Status{State: state})
	}
	close(t.started)

	var final func()
	if err != nil {
		t.log.Error("task failed to start", "error", err)
		t.setStatus(Status{State: StateFailed, Trace: err.Error()})
		close(t.loopDone)
	} else if t.run.CleanupOnly {
		// Started only so Stop(true) and Stopped can clean up: no data moves.
		for {
			stopping, _, changed := t.state()
			if stopping {
				break
			}
			<-changed
		}
		close(t.loopDone)
	} else {
		switch task := t.task.(type) {
		case connect.SourceTask:
			final, err = t.runSource(task)
		case connect.SinkTask:
			final, err = t.runSink(task)
		}
		close(t.loopDone)
		if err != nil {
			t.log.Error("task failed", "error", err)
			t.setStatus(Status{State: StateFailed, Trace: err.Error()})
		}
	}
	if final != nil {
		t.mu.Lock()
		stopped := t.stopCalled
		t.mu.Unlock()
		if stopped {
			// The task has its Stop before the final flush and commit,
			// as it had when Stop was called under t.mu (a Stop that
			// never returns: the stop is abandoned meanwhile).
			t.awaitStops()
		}
		final() // final offset commit, close Kafka clients
	}
	// The dead letter queue producer goes with the instance however it
	// ended: a task may Report from Start, and a Start that then failed (or
	// a cleanup-only task) runs no sink loop whose final step closes it.
	if r, ok := t.host.Errors.(*errantReporter); ok {
		r.close()
	}
	close(t.finalDone)
	t.mu.Lock()
	needStop := !t.stopCalled
	t.mu.Unlock()
	if needStop {
		// A failure, not a stop request: the task still gets its Stop.
		t.requestStop(false)
	}
	// final is set only once no Stop call runs, under the lock requestStop
	// adds one under: a deletion asked for while a Stop(false) still ran
	// gets its Stop(true) and a Stopped that cleans up. A Stop that never
	// returns keeps Stopped from being called: the instance is then
	// abandoned (stopTask's graceful timeout covers this wait too).
	var deleted bool
	for {
		t.mu.Lock()
		if t.stopsInFlight == 0 {
			t.final = true
			deleted = t.deleted
			t.mu.Unlock()
			break
		}
		idle := t.stopsIdle
		t.mu.Unlock()
		<-idle
	}
	close(t.stopsReturned)
	t.stoppedDeleted = deleted
	sctx, cancel := context.WithTimeout(t.base, t.w.stoppedTimeout)
	t.stopErr = guard("Stopped", func() error { return t.task.Stopped(sctx) })
	cancel()
	if t.stopErr != nil {
		t.log.Error("task Stopped failed", "error", t.stopErr, "deleted", deleted)
	} else {
		t.log.Info("task stopped", "deleted", deleted)
	}
	close(t.done)
	t.mu.Lock()
	abandoned := t.abandoned
	t.mu.Unlock()
	if abandoned {
		t.w.mu.Lock()
		cur, ok := t.w.tasks[t.id]
		if cur == t {
			delete(t.w.tasks, t.id)
		}
		t.w.mu.Unlock()
		if !ok || cur == t {
			// Forgotten (here, or by a StopTasks that saw it finish): the
			// caller may start the task again.
			t.w.abandonedGone(t.id)
		}
	}
}

// finalDeadline is when the final phase's waits on Kafka (producer flush,
// sink commit and group leave) give up: 9/10 of the graceful timeout after
// the stop request (or now, after a failure), leaving the rest for Commit,
// the offset write and closing, so the stop ends within the graceful
// timeout.
func (t *taskInstance) finalDeadline() time.Time {
	t.mu.Lock()
	stopAt := t.stopAt
	t.mu.Unlock()
	if stopAt.IsZero() {
		stopAt = time.Now() // a failure, not a stop request
	}
	return stopAt.Add(t.set.grace * 9 / 10)
}

// errAbandoned is returned by StopTasks for a task that did not finish
// within the graceful timeout.
var errAbandoned = errors.New("task did not finish Poll/Put and its final flush and commit within the graceful timeout and was abandoned; its Stopped runs once it does")

// ErrAlreadyStopped is returned (wrapped) by StopTasks with
// connectorDeleted=true for a task instance whose Stopped had already run
// with connectorDeleted=false (it failed, or a plain stop got there first),
// and by StopConnector likewise: the deletion never reached the instance,
// so its owned resources are still there. Complete the deletion with a
// CleanupOnly instance.
var ErrAlreadyStopped = errors.New("instance had already stopped without deletion")

// StopTasks stops tasks concurrently: Stop(connectorDeleted), wait for the
// loop to end and for the final flush, commit and offset write, all within
// the graceful timeout, then Stopped (bounded by WithStoppedTimeout and ctx).
// Per task it returns:
//   - nil when the instance stopped (and, for a deletion, its Stopped ran
//     with connectorDeleted=true and succeeded);
//   - Stopped's error (a failed cleanup);
//   - an error wrapping errAbandoned when the graceful timeout passed
//     (the status shows Abandoned; Stopped runs later, exactly once);
//   - with connectorDeleted=true, an error wrapping ErrAlreadyStopped when
//     the instance's Stopped had already run with connectorDeleted=false
//     (e.g. it failed earlier): nothing was cleaned up.
//
// Unknown ids are ignored; a task that already finished is only forgotten.
func (w *Worker) StopTasks(ctx context.Context, ids []TaskID, connectorDeleted bool) map[TaskID]error {
	out := make(map[TaskID]error, len(ids))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range ids {
		w.mu.Lock()
		t := w.tasks[id]
		w.mu.Unlock()
		if t == nil {
			continue
		}
		wg.Go(func() {
			err := w.stopTask(ctx, t, connectorDeleted)
			mu.Lock()
			out[id] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// stoppedResult is the result of a stop whose Stopped has returned.
func (t *taskInstance) stoppedResult(deleted bool) error {
	if deleted && !t.stoppedDeleted {
		return fmt.Errorf("worker: task %s-%d: Stopped already ran with connectorDeleted=false, so the deletion did not reach it: %w", t.id.Connector, t.id.Task, ErrAlreadyStopped)
	}
	if t.stopErr != nil {
		return fmt.Errorf("worker: task %s-%d: Stopped: %w", t.id.Connector, t.id.Task, t.stopErr)
	}
	return nil
}

func (w *Worker) stopTask(ctx context.Context, t *taskInstance, deleted bool) error {
	select {
	case <-t.done:
		// Already finished (failed): nothing more is called on it.
		w.forgetTask(t)
		if deleted && !t.stoppedDeleted {
			return t.stoppedResult(deleted)
		}
		return nil
	default:
	}
	t.log.Info("stopping task", "deleted", deleted)
	// An already abandoned task gets the new Stop and another graceful
	// period too: it may have returned meanwhile.
	t.requestStop(deleted)
	grace := time.NewTimer(t.set.grace)
	defer grace.Stop()
	// The graceful timeout covers the final flush and commit too (contract
	// rule 7); only Stopped, which may drop resources, has its own bound.
	for _, ch := range []chan struct{}{t.loopDone, t.finalDone, t.stopsReturned} {
		select {
		case <-ch:
		case <-grace.C:
			return w.abandon(t, deleted)
		case <-ctx.Done():
			return w.abandon(t, deleted)
		}
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		return fmt.Errorf("worker: task %s-%d: Stopped still running when the caller gave up (it runs on, bounded by the Stopped timeout): %w", t.id.Connector, t.id.Task, ctx.Err())
	}
	w.forgetTask(t)
	return t.stoppedResult(deleted)
}

func (w *Worker) abandon(t *taskInstance, deleted bool) error {
	select {
	case <-t.done: // returned just now after all
		w.forgetTask(t)
		return t.stoppedResult(deleted)
	default:
	}
	t.mu.Lock()
	t.abandoned = true
	t.status.Abandoned = true
	s := t.status
	t.mu.Unlock()
	t.log.Error("task did not stop within the graceful timeout; abandoning it", "graceful_timeout", t.set.grace)
	t.reportIfCurrent(s)
	select {
	case <-t.done:
		w.forgetTask(t)
	default:
		// Kept in w.tasks (its status shows Abandoned) until its goroutine
		// ends; a restart may replace it.
	}
	return fmt.Errorf("worker: task %s-%d: %w", t.id.Connector, t.id.Task, errAbandoned)
}

// forgetTask removes a finished t from the running set and reports it
// UNASSIGNED, unless it failed or another instance already replaced it.
func (w *Worker) forgetTask(t *taskInstance) {
	w.statusMu.Lock()
	defer w.statusMu.Unlock()
	w.mu.Lock()
	cur, ok := w.tasks[t.id]
	if cur == t {
		delete(w.tasks, t.id)
	}
	w.mu.Unlock()
	if ok && cur != t {
		return
	}
	t.mu.Lock()
	failed := t.status.State == StateFailed
	t.mu.Unlock()
	if !failed {
		w.report(t.id.Connector, t.id.Task, Status{State: StateUnassigned})
	}
}
