// Package syncworker is test support: an in-memory worker that runs real
// connector and task instances through the lifecycle contract (Start,
// TaskConfigs, Stop, Stopped exactly once and last) synchronously, without
// the Poll/Put data path. It satisfies the herder's Worker interface, so
// the herder's decisions and the REST layer can be tested in isolation from
// runtime/worker; the data path is runtime/worker's to test.
//
// It imports only runtime/worker, runtime/plugins and runtime/connect, so
// that runtime/herder's internal tests can use it without an import cycle.
package syncworker

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// Worker is the synchronous in-memory worker. Create it with New.
type Worker struct {
	reg              *plugins.Registry
	listen           worker.StatusListener
	id               string // WorkerID in every reported status
	reportUnassigned bool   // report UNASSIGNED for each task StopTasks stops

	mu     sync.Mutex
	conns  map[string]*inst
	tasks  map[worker.TaskID]*inst
	target map[string]worker.TargetState
}

type inst struct {
	conn    connect.Connector
	task    connect.Task
	host    *connect.Host
	cfg     connect.Config
	status  worker.Status
	stopped bool // Stopped was called
}

// Option configures a Worker.
type Option func(*Worker)

// WithWorkerID sets the WorkerID of the statuses the worker reports
// (empty by default).
func WithWorkerID(id string) Option { return func(w *Worker) { w.id = id } }

// WithoutUnassignedReports stops StopTasks from reporting UNASSIGNED for
// the tasks it stops (it does by default, as runtime/worker does).
func WithoutUnassignedReports() Option { return func(w *Worker) { w.reportUnassigned = false } }

// New returns a Worker that creates instances from reg's plugins and
// reports their statuses to l.
func New(reg *plugins.Registry, l worker.StatusListener, opts ...Option) *Worker {
	w := &Worker{reg: reg, listen: l, reportUnassigned: true,
		conns: map[string]*inst{}, tasks: map[worker.TaskID]*inst{}, target: map[string]worker.TargetState{}}
	for _, o := range opts {
		o(w)
	}
	return w
}

func stateFor(t worker.TargetState) worker.State {
	if t == worker.TargetPaused {
		return worker.StatePaused
	}
	return worker.StateRunning
}

func (w *Worker) report(name string, task int, in *inst, s worker.Status) {
	s.WorkerID = w.id
	w.mu.Lock()
	in.status = s
	w.mu.Unlock()
	w.listen(name, task, s)
}

func (w *Worker) markStopped(in *inst) {
	w.mu.Lock()
	in.stopped = true
	w.mu.Unlock()
}

// StartConnector creates the connector's instance and starts it; a failed
// Start is followed by Stopped and reported FAILED.
func (w *Worker) StartConnector(ctx context.Context, run worker.ConnectorRun) error {
	p, ok := w.reg.Lookup(run.Config[worker.KeyConnectorClass])
	if !ok {
		return fmt.Errorf("no plugin %q", run.Config[worker.KeyConnectorClass])
	}
	in := &inst{conn: p.NewConnector(), cfg: run.Config,
		host: &connect.Host{Connector: run.Name, Task: -1, Logger: slog.New(slog.DiscardHandler), Ledger: run.Ledger, CleanupOnly: run.CleanupOnly}}
	w.mu.Lock()
	if _, exists := w.conns[run.Name]; exists {
		w.mu.Unlock()
		return fmt.Errorf("connector %s already has an instance", run.Name)
	}
	w.conns[run.Name] = in
	w.target[run.Name] = run.Target
	w.mu.Unlock()
	if err := in.conn.Start(connect.WithHost(ctx, in.host), run.Config); err != nil {
		_ = in.conn.Stopped(connect.WithHost(ctx, in.host))
		w.markStopped(in)
		w.report(run.Name, -1, in, worker.Status{State: worker.StateFailed, Trace: err.Error()})
		return err
	}
	w.report(run.Name, -1, in, worker.Status{State: stateFor(run.Target)})
	return nil
}

// TaskConfigs asks the running connector for up to tasks.max (default 1)
// task configs.
func (w *Worker) TaskConfigs(_ context.Context, name string) ([]map[string]string, error) {
	w.mu.Lock()
	in := w.conns[name]
	stopped := in != nil && in.stopped
	w.mu.Unlock()
	if in == nil || stopped {
		return nil, fmt.Errorf("connector %s is not running", name)
	}
	n := 1
	if v, err := strconv.Atoi(in.cfg[worker.KeyTasksMax]); err == nil {
		n = v
	}
	cfgs, err := in.conn.TaskConfigs(n)
	out := make([]map[string]string, len(cfgs))
	for i, c := range cfgs {
		out[i] = c
	}
	return out, err
}

// StartTask creates the task's instance and starts it; a failed Start is
// followed by Stopped and reported FAILED.
func (w *Worker) StartTask(ctx context.Context, run worker.TaskRun) error {
	p, ok := w.reg.Lookup(run.ConnectorConfig[worker.KeyConnectorClass])
	if !ok {
		return fmt.Errorf("no plugin %q", run.ConnectorConfig[worker.KeyConnectorClass])
	}
	in := &inst{task: p.NewTask(), host: &connect.Host{Connector: run.ID.Connector, Task: run.ID.Task, Logger: slog.New(slog.DiscardHandler), Ledger: run.Ledger}}
	w.mu.Lock()
	if _, exists := w.tasks[run.ID]; exists {
		w.mu.Unlock()
		return fmt.Errorf("task %v already has an instance", run.ID)
	}
	w.tasks[run.ID] = in
	w.mu.Unlock()
	if err := in.task.Start(connect.WithHost(ctx, in.host), run.TaskConfig); err != nil {
		_ = in.task.Stopped(connect.WithHost(ctx, in.host))
		w.markStopped(in)
		w.report(run.ID.Connector, run.ID.Task, in, worker.Status{State: worker.StateFailed, Trace: err.Error()})
		return err
	}
	w.report(run.ID.Connector, run.ID.Task, in, worker.Status{State: stateFor(run.Target)})
	return nil
}

// SetTargetState records the connector's target state and reports it for
// the connector and each of its tasks that have not been stopped.
func (w *Worker) SetTargetState(name string, t worker.TargetState) {
	w.mu.Lock()
	w.target[name] = t
	var insts []*inst
	var ids []int
	if c := w.conns[name]; c != nil && !c.stopped {
		insts, ids = append(insts, c), append(ids, -1)
	}
	for id, in := range w.tasks {
		if id.Connector == name && !in.stopped {
			insts, ids = append(insts, in), append(ids, id.Task)
		}
	}
	w.mu.Unlock()
	for i, in := range insts {
		w.report(name, ids[i], in, worker.Status{State: stateFor(t)})
	}
}

// TargetState is the target state last given for the connector by
// StartConnector or SetTargetState.
func (w *Worker) TargetState(name string) (worker.TargetState, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.target[name]
	return t, ok
}

// StopTasks stops the given tasks (Stop, then Stopped) and forgets them,
// returning Stopped's result for each one it stopped.
func (w *Worker) StopTasks(ctx context.Context, ids []worker.TaskID, deleted bool) map[worker.TaskID]error {
	out := map[worker.TaskID]error{}
	for _, id := range ids {
		w.mu.Lock()
		in := w.tasks[id]
		delete(w.tasks, id)
		stopped := in != nil && in.stopped
		w.mu.Unlock()
		if in == nil || stopped {
			continue
		}
		in.task.Stop(deleted)
		out[id] = in.task.Stopped(connect.WithHost(ctx, in.host))
		w.markStopped(in)
		if w.reportUnassigned {
			w.listen(id.Connector, id.Task, worker.Status{State: worker.StateUnassigned, WorkerID: w.id})
		}
	}
	return out
}

// StopConnector stops the connector (Stop, then Stopped) and forgets it.
func (w *Worker) StopConnector(ctx context.Context, name string, deleted bool) error {
	w.mu.Lock()
	in := w.conns[name]
	delete(w.conns, name)
	stopped := in != nil && in.stopped
	w.mu.Unlock()
	if in == nil || stopped {
		return nil
	}
	in.conn.Stop(deleted)
	w.markStopped(in)
	return in.conn.Stopped(connect.WithHost(ctx, in.host))
}

// ConnectorStatus is the connector's last reported status.
func (w *Worker) ConnectorStatus(name string) (worker.Status, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in, ok := w.conns[name]
	if !ok {
		return worker.Status{}, false
	}
	return in.status, true
}

// TaskStatus is the task's last reported status.
func (w *Worker) TaskStatus(id worker.TaskID) (worker.Status, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in, ok := w.tasks[id]
	if !ok {
		return worker.Status{}, false
	}
	return in.status, true
}

// Topics is always empty: there is no data path.
func (w *Worker) Topics(string) []string { return nil }

// Close stops every task, then every connector, without deleting them.
func (w *Worker) Close(ctx context.Context) error {
	w.mu.Lock()
	var ids []worker.TaskID
	for id := range w.tasks {
		ids = append(ids, id)
	}
	var names []string
	for n := range w.conns {
		names = append(names, n)
	}
	w.mu.Unlock()
	slices.SortFunc(ids, func(a, b worker.TaskID) int { return a.Task - b.Task })
	w.StopTasks(ctx, ids, false)
	for _, n := range names {
		_ = w.StopConnector(ctx, n, false)
	}
	return nil
}
