package herder

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

// syncWorker is a minimal in-memory Worker that honours the lifecycle
// contract synchronously (no Poll/Put loops): Start, Stop, Stopped exactly
// once and last. It lets the herder's decisions be tested in isolation from
// runtime/worker; the same tests also run against the real worker.
type syncWorker struct {
	reg    *plugins.Registry
	listen worker.StatusListener

	mu     sync.Mutex
	conns  map[string]*fakeInst
	tasks  map[worker.TaskID]*fakeInst
	target map[string]worker.TargetState
}

type fakeInst struct {
	conn    connect.Connector
	task    connect.Task
	host    *connect.Host
	cfg     connect.Config
	status  worker.Status
	stopped bool // Stopped was called
}

func newSyncWorker(reg *plugins.Registry, l worker.StatusListener) *syncWorker {
	return &syncWorker{reg: reg, listen: l, conns: map[string]*fakeInst{}, tasks: map[worker.TaskID]*fakeInst{}, target: map[string]worker.TargetState{}}
}

func (w *syncWorker) report(name string, task int, in *fakeInst, s worker.Status) {
	w.mu.Lock()
	in.status = s
	w.mu.Unlock()
	w.listen(name, task, s)
}

func stateFor(t worker.TargetState) worker.State {
	if t == worker.TargetPaused {
		return worker.StatePaused
	}
	return worker.StateRunning
}

func (w *syncWorker) StartConnector(ctx context.Context, run worker.ConnectorRun) error {
	p, ok := w.reg.Lookup(run.Config[KeyConnectorClass])
	if !ok {
		return fmt.Errorf("no plugin %q", run.Config[KeyConnectorClass])
	}
	w.mu.Lock()
	if _, exists := w.conns[run.Name]; exists {
		w.mu.Unlock()
		return fmt.Errorf("connector %s already has an instance", run.Name)
	}
	in := &fakeInst{conn: p.NewConnector(), host: &connect.Host{Connector: run.Name, Task: -1, Logger: slog.New(slog.DiscardHandler), Ledger: run.Ledger, CleanupOnly: run.CleanupOnly}, cfg: run.Config}
	w.conns[run.Name] = in
	w.target[run.Name] = run.Target
	w.mu.Unlock()
	if err := in.conn.Start(connect.WithHost(ctx, in.host), run.Config); err != nil {
		_ = in.conn.Stopped(connect.WithHost(ctx, in.host))
		in.stopped = true
		w.report(run.Name, -1, in, worker.Status{State: worker.StateFailed, Trace: err.Error()})
		return err
	}
	w.report(run.Name, -1, in, worker.Status{State: stateFor(run.Target)})
	return nil
}

func (w *syncWorker) TaskConfigs(_ context.Context, name string) ([]map[string]string, error) {
	w.mu.Lock()
	in := w.conns[name]
	w.mu.Unlock()
	if in == nil || in.stopped {
		return nil, fmt.Errorf("connector %s is not running", name)
	}
	n := 1
	if v, err := strconv.Atoi(in.cfg[KeyTasksMax]); err == nil {
		n = v
	}
	cfgs, err := in.conn.TaskConfigs(n)
	out := make([]map[string]string, len(cfgs))
	for i, c := range cfgs {
		out[i] = c
	}
	return out, err
}

func (w *syncWorker) StartTask(ctx context.Context, run worker.TaskRun) error {
	p, _ := w.reg.Lookup(run.ConnectorConfig[KeyConnectorClass])
	in := &fakeInst{task: p.NewTask(), host: &connect.Host{Connector: run.ID.Connector, Task: run.ID.Task, Logger: slog.New(slog.DiscardHandler), Ledger: run.Ledger}}
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
		w.report(run.ID.Connector, run.ID.Task, in, worker.Status{State: worker.StateFailed, Trace: err.Error()})
		return err
	}
	w.report(run.ID.Connector, run.ID.Task, in, worker.Status{State: stateFor(run.Target)})
	return nil
}

func (w *syncWorker) SetTargetState(name string, t worker.TargetState) {
	w.mu.Lock()
	w.target[name] = t
	var ids []worker.TaskID
	for id := range w.tasks {
		if id.Connector == name {
			ids = append(ids, id)
		}
	}
	c := w.conns[name]
	w.mu.Unlock()
	if c != nil && !c.stopped {
		w.report(name, -1, c, worker.Status{State: stateFor(t)})
	}
	for _, id := range ids {
		w.mu.Lock()
		in := w.tasks[id]
		w.mu.Unlock()
		if !in.stopped {
			w.report(name, id.Task, in, worker.Status{State: stateFor(t)})
		}
	}
}

func (w *syncWorker) StopTasks(ctx context.Context, ids []worker.TaskID, deleted bool) map[worker.TaskID]error {
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
		w.listen(id.Connector, id.Task, worker.Status{State: worker.StateUnassigned})
	}
	return out
}

func (w *syncWorker) StopConnector(ctx context.Context, name string, deleted bool) error {
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

func (w *syncWorker) ConnectorStatus(name string) (worker.Status, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in, ok := w.conns[name]
	if !ok {
		return worker.Status{}, false
	}
	return in.status, true
}

func (w *syncWorker) TaskStatus(id worker.TaskID) (worker.Status, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in, ok := w.tasks[id]
	if !ok {
		return worker.Status{}, false
	}
	return in.status, true
}

func (w *syncWorker) Topics(string) []string { return nil }

func (w *syncWorker) Close(ctx context.Context) error {
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
