package rest_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// lifecycleWorker is a herder.Worker that runs real connector and task
// instances through the lifecycle calls (Start, TaskConfigs, Stop, Stopped)
// synchronously, without the Poll/Put data path. It lets the REST layer be
// tested end to end over the real standalone herder and file store while
// runtime/worker is being built; the data path is runtime/worker's to test.
type lifecycleWorker struct {
	reg    *plugins.Registry
	listen worker.StatusListener

	mu    sync.Mutex
	conns map[string]*liveInst
	tasks map[worker.TaskID]*liveInst
}

type liveInst struct {
	conn    connect.Connector
	task    connect.Task
	host    *connect.Host
	cfg     connect.Config
	status  worker.Status
	stopped bool
}

func newLifecycleWorker(reg *plugins.Registry, l worker.StatusListener) *lifecycleWorker {
	return &lifecycleWorker{reg: reg, listen: l, conns: map[string]*liveInst{}, tasks: map[worker.TaskID]*liveInst{}}
}

var _ herder.Worker = (*lifecycleWorker)(nil)

func stateOf(t worker.TargetState) worker.State {
	if t == worker.TargetPaused {
		return worker.StatePaused
	}
	return worker.StateRunning
}

func (w *lifecycleWorker) report(name string, task int, in *liveInst, s worker.Status) {
	w.mu.Lock()
	in.status = s
	w.mu.Unlock()
	w.listen(name, task, s)
}

func (w *lifecycleWorker) StartConnector(ctx context.Context, run worker.ConnectorRun) error {
	p, ok := w.reg.Lookup(run.Config[herder.KeyConnectorClass])
	if !ok {
		return fmt.Errorf("no plugin %q", run.Config[herder.KeyConnectorClass])
	}
	in := &liveInst{conn: p.NewConnector(), cfg: run.Config,
		host: &connect.Host{Connector: run.Name, Task: -1, Logger: slog.New(slog.DiscardHandler), Ledger: run.Ledger, CleanupOnly: run.CleanupOnly}}
	w.mu.Lock()
	if _, exists := w.conns[run.Name]; exists {
		w.mu.Unlock()
		return fmt.Errorf("connector %s already has an instance", run.Name)
	}
	w.conns[run.Name] = in
	w.mu.Unlock()
	if err := in.conn.Start(connect.WithHost(ctx, in.host), run.Config); err != nil {
		_ = in.conn.Stopped(connect.WithHost(ctx, in.host))
		in.stopped = true
		w.report(run.Name, -1, in, worker.Status{State: worker.StateFailed, Trace: err.Error(), WorkerID: "e2e"})
		return err
	}
	w.report(run.Name, -1, in, worker.Status{State: stateOf(run.Target), WorkerID: "e2e"})
	return nil
}

func (w *lifecycleWorker) TaskConfigs(_ context.Context, name string) ([]map[string]string, error) {
	w.mu.Lock()
	in := w.conns[name]
	w.mu.Unlock()
	if in == nil || in.stopped {
		return nil, fmt.Errorf("connector %s is not running", name)
	}
	n, err := strconv.Atoi(in.cfg[herder.KeyTasksMax])
	if err != nil {
		n = 1
	}
	cfgs, err := in.conn.TaskConfigs(n)
	out := make([]map[string]string, len(cfgs))
	for i, c := range cfgs {
		out[i] = c
	}
	return out, err
}

func (w *lifecycleWorker) StartTask(ctx context.Context, run worker.TaskRun) error {
	p, ok := w.reg.Lookup(run.ConnectorConfig[herder.KeyConnectorClass])
	if !ok {
		return fmt.Errorf("no plugin %q", run.ConnectorConfig[herder.KeyConnectorClass])
	}
	in := &liveInst{task: p.NewTask(), host: &connect.Host{Connector: run.ID.Connector, Task: run.ID.Task, Logger: slog.New(slog.DiscardHandler), Ledger: run.Ledger}}
	w.mu.Lock()
	if _, exists := w.tasks[run.ID]; exists {
		w.mu.Unlock()
		return fmt.Errorf("task %v already has an instance", run.ID)
	}
	w.tasks[run.ID] = in
	w.mu.Unlock()
	if err := in.task.Start(connect.WithHost(ctx, in.host), run.TaskConfig); err != nil {
		_ = in.task.Stopped(connect.WithHost(ctx, in.host))
		in.stopped = true
		w.report(run.ID.Connector, run.ID.Task, in, worker.Status{State: worker.StateFailed, Trace: err.Error(), WorkerID: "e2e"})
		return err
	}
	w.report(run.ID.Connector, run.ID.Task, in, worker.Status{State: stateOf(run.Target), WorkerID: "e2e"})
	return nil
}

func (w *lifecycleWorker) SetTargetState(name string, t worker.TargetState) {
	w.mu.Lock()
	var insts []*liveInst
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
		w.report(name, ids[i], in, worker.Status{State: stateOf(t), WorkerID: "e2e"})
	}
}

func (w *lifecycleWorker) StopTasks(ctx context.Context, ids []worker.TaskID, deleted bool) map[worker.TaskID]error {
	out := map[worker.TaskID]error{}
	for _, id := range ids {
		w.mu.Lock()
		in := w.tasks[id]
		delete(w.tasks, id)
		w.mu.Unlock()
		if in == nil || in.stopped {
			continue
		}
		in.task.Stop(deleted)
		out[id] = in.task.Stopped(connect.WithHost(ctx, in.host))
		in.stopped = true
	}
	return out
}

func (w *lifecycleWorker) StopConnector(ctx context.Context, name string, deleted bool) error {
	w.mu.Lock()
	in := w.conns[name]
	delete(w.conns, name)
	w.mu.Unlock()
	if in == nil || in.stopped {
		return nil
	}
	in.conn.Stop(deleted)
	in.stopped = true
	return in.conn.Stopped(connect.WithHost(ctx, in.host))
}

func (w *lifecycleWorker) ConnectorStatus(name string) (worker.Status, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in, ok := w.conns[name]
	if !ok {
		return worker.Status{}, false
	}
	return in.status, true
}

func (w *lifecycleWorker) TaskStatus(id worker.TaskID) (worker.Status, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in, ok := w.tasks[id]
	if !ok {
		return worker.Status{}, false
	}
	return in.status, true
}

func (w *lifecycleWorker) Topics(string) []string { return nil }

func (w *lifecycleWorker) Close(ctx context.Context) error {
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
