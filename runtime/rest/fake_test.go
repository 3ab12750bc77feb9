package rest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// fakeHerder is an in-memory herder.API for HTTP-level tests: it keeps
// connectors, records every call and returns injected errors.
type fakeHerder struct {
	mu         sync.Mutex
	connectors map[string]*fakeConn
	calls      []string
	// errs makes the named method (e.g. "Pause") return the error.
	errs map[string]error
	// deleteBlock, when set, makes DeleteConnector wait for ctx.
	deleteBlock bool
	plugins     []herder.PluginInfo
	defs        map[string]connect.ConfigDef
}

type fakeConn struct {
	cfg       connect.Config
	typ       connect.ConnectorType
	target    worker.TargetState
	tasks     int
	failed    map[int]string // task -> trace
	offsets   []worker.SourceOffset
	topics    []string
	resources []connect.Resource
	deletion  *herder.Deletion
}

var sourceDef = connect.ConfigDef{
	{Name: "connector.class", Type: connect.TypeString, Required: true, Doc: "The plugin.", Importance: connect.ImportanceHigh, Group: "Common"},
	{Name: "tasks.max", Type: connect.TypeInt, Default: "1", Doc: "Maximum tasks.", Importance: connect.ImportanceHigh, Group: "Common"},
	{Name: "topic", Type: connect.TypeString, Required: true, Doc: "Target topic.", Group: "Source"},
	{Name: "db.password", Type: connect.TypePassword, Doc: "Database password.", Group: "Source"},
	{Name: "db.url", Type: connect.TypeString, Secret: true, Default: "", Doc: "Database URL.", Group: "Source", Recommended: []string{"postgres://localhost/test"}},
}

func newFakeHerder() *fakeHerder {
	return &fakeHerder{
		connectors: map[string]*fakeConn{},
		errs:       map[string]error{},
		plugins: []herder.PluginInfo{
			{Class: "sample.Sink", Type: connect.TypeSink, Version: "1.0.0"},
			{Class: "sample.Source", Type: connect.TypeSource, Version: "1.0.0"},
		},
		defs: map[string]connect.ConfigDef{"sample.Source": sourceDef, "sample.Sink": sourceDef[:2]},
	}
}

func (f *fakeHerder) call(format string, args ...any) error {
	c := fmt.Sprintf(format, args...)
	f.calls = append(f.calls, c)
	method := c
	for i, r := range c {
		if r == ' ' {
			method = c[:i]
			break
		}
	}
	return f.errs[method]
}

// Calls returns the recorded calls.
func (f *fakeHerder) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// add creates a connector directly (test setup; not recorded).
func (f *fakeHerder) add(name string, typ connect.ConnectorType, cfg connect.Config, tasks int) *fakeConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	cfg = cfg.Clone()
	cfg["name"] = name
	c := &fakeConn{cfg: cfg, typ: typ, target: worker.TargetRunning, tasks: tasks, failed: map[int]string{}}
	f.connectors[name] = c
	return c
}

func (f *fakeHerder) get(name string) (*fakeConn, error) {
	c, ok := f.connectors[name]
	if !ok {
		return nil, fmt.Errorf("connector %s: %w", name, herder.ErrNotFound)
	}
	return c, nil
}

func (f *fakeHerder) info(name string, c *fakeConn) herder.ConnectorInfo {
	def := f.defs["sample.Source"]
	info := herder.ConnectorInfo{Name: name, Config: def.Mask(c.cfg), Type: c.typ}
	if c.target != worker.TargetStopped {
		for i := range c.tasks {
			info.Tasks = append(info.Tasks, worker.TaskID{Connector: name, Task: i})
		}
	}
	return info
}

func (f *fakeHerder) status(name string, c *fakeConn) herder.ConnectorStatus {
	st := herder.ConnectorStatus{Name: name, Type: c.typ, Deletion: c.deletion}
	state := map[worker.TargetState]worker.State{
		worker.TargetRunning: worker.StateRunning, worker.TargetPaused: worker.StatePaused, worker.TargetStopped: worker.StateStopped,
	}[c.target]
	st.Connector = worker.Status{State: state, WorkerID: "127.0.0.1:8083"}
	if c.deletion != nil {
		st.Connector.State = worker.StateFailed
		st.Connector.Trace = c.deletion.Error
	}
	if c.target == worker.TargetStopped {
		return st
	}
	for i := range c.tasks {
		ts := herder.TaskStatus{ID: i, Status: worker.Status{State: state, WorkerID: "127.0.0.1:8083"}}
		if tr, ok := c.failed[i]; ok {
			ts.State, ts.Trace = worker.StateFailed, tr
		}
		st.Tasks = append(st.Tasks, ts)
	}
	return st
}

func (f *fakeHerder) ClusterInfo(context.Context) (herder.ClusterInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ClusterInfo"); err != nil {
		return herder.ClusterInfo{}, err
	}
	return herder.ClusterInfo{Version: "0.1.0-test", Commit: "abc123", KafkaClusterID: "cluster-1"}, nil
}

func (f *fakeHerder) Connectors(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Connectors"); err != nil {
		return nil, err
	}
	var out []string
	for n := range f.connectors {
		out = append(out, n)
	}
	return out, nil
}

func (f *fakeHerder) ConnectorInfo(_ context.Context, name string) (herder.ConnectorInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ConnectorInfo %s", name); err != nil {
		return herder.ConnectorInfo{}, err
	}
	c, err := f.get(name)
	if err != nil {
		return herder.ConnectorInfo{}, err
	}
	return f.info(name, c), nil
}

func (f *fakeHerder) ConnectorStatus(_ context.Context, name string) (herder.ConnectorStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ConnectorStatus %s", name); err != nil {
		return herder.ConnectorStatus{}, err
	}
	c, err := f.get(name)
	if err != nil {
		return herder.ConnectorStatus{}, err
	}
	return f.status(name, c), nil
}

func (f *fakeHerder) TaskStatus(_ context.Context, id worker.TaskID) (herder.TaskStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("TaskStatus %s/%d", id.Connector, id.Task); err != nil {
		return herder.TaskStatus{}, err
	}
	c, err := f.get(id.Connector)
	if err != nil {
		return herder.TaskStatus{}, err
	}
	for _, t := range f.status(id.Connector, c).Tasks {
		if t.ID == id.Task {
			return t, nil
		}
	}
	return herder.TaskStatus{}, herder.ErrTaskNotFound
}

func (f *fakeHerder) TaskConfigs(_ context.Context, name string) ([]herder.TaskInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("TaskConfigs %s", name); err != nil {
		return nil, err
	}
	c, err := f.get(name)
	if err != nil {
		return nil, err
	}
	var out []herder.TaskInfo
	for i := range c.tasks {
		out = append(out, herder.TaskInfo{ID: worker.TaskID{Connector: name, Task: i}, Config: connect.Config{"task.id": fmt.Sprint(i), "db.password": connect.HiddenValue}})
	}
	return out, nil
}

func (f *fakeHerder) validateCfg(cfg connect.Config) error {
	class := cfg["connector.class"]
	def, ok := f.defs[class]
	if !ok {
		return &herder.ConfigError{Fields: map[string][]string{"connector.class": {fmt.Sprintf("Class %q could not be found", class)}}}
	}
	if errs := def.Validate(cfg); len(errs) > 0 {
		return &herder.ConfigError{Fields: errs}
	}
	return nil
}

func (f *fakeHerder) CreateConnector(_ context.Context, name string, cfg connect.Config, initial worker.TargetState) (herder.ConnectorInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("CreateConnector %s %s", name, initial); err != nil {
		return herder.ConnectorInfo{}, err
	}
	if _, ok := f.connectors[name]; ok {
		return herder.ConnectorInfo{}, fmt.Errorf("connector %s already exists: %w", name, herder.ErrAlreadyExists)
	}
	if err := f.validateCfg(cfg); err != nil {
		return herder.ConnectorInfo{}, err
	}
	typ := connect.TypeSource
	if cfg["connector.class"] == "sample.Sink" {
		typ = connect.TypeSink
	}
	c := &fakeConn{cfg: cfg.Clone(), typ: typ, target: initial, tasks: 1, failed: map[int]string{}}
	f.connectors[name] = c
	return f.info(name, c), nil
}

func (f *fakeHerder) PutConnectorConfig(_ context.Context, name string, cfg connect.Config) (herder.ConnectorInfo, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("PutConnectorConfig %s", name); err != nil {
		return herder.ConnectorInfo{}, false, err
	}
	if err := f.validateCfg(cfg); err != nil {
		return herder.ConnectorInfo{}, false, err
	}
	c, exists := f.connectors[name]
	if !exists {
		c = &fakeConn{typ: connect.TypeSource, target: worker.TargetRunning, tasks: 1, failed: map[int]string{}}
		f.connectors[name] = c
	}
	c.cfg = cfg.Clone()
	return f.info(name, c), !exists, nil
}

func (f *fakeHerder) PatchConnectorConfig(_ context.Context, name string, patch map[string]*string) (herder.ConnectorInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, 0, len(patch))
	for k := range patch {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if err := f.call("PatchConnectorConfig %s %v", name, keys); err != nil {
		return herder.ConnectorInfo{}, err
	}
	c, err := f.get(name)
	if err != nil {
		return herder.ConnectorInfo{}, err
	}
	next := c.cfg.Clone()
	for k, v := range patch {
		if v == nil {
			delete(next, k)
		} else {
			next[k] = *v
		}
	}
	if err := f.validateCfg(next); err != nil {
		return herder.ConnectorInfo{}, err
	}
	c.cfg = next
	return f.info(name, c), nil
}

func (f *fakeHerder) DeleteConnector(ctx context.Context, name string) error {
	f.mu.Lock()
	if err := f.call("DeleteConnector %s", name); err != nil {
		f.mu.Unlock()
		return err
	}
	if _, err := f.get(name); err != nil {
		f.mu.Unlock()
		return err
	}
	if f.deleteBlock {
		f.mu.Unlock()
		<-ctx.Done()
		return fmt.Errorf("waiting for the deletion of %s: %w", name, ctx.Err())
	}
	defer f.mu.Unlock()
	delete(f.connectors, name)
	return nil
}

func (f *fakeHerder) targetCall(method, name string, t worker.TargetState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("%s %s", method, name); err != nil {
		return err
	}
	c, err := f.get(name)
	if err != nil {
		return err
	}
	c.target = t
	return nil
}

func (f *fakeHerder) Pause(_ context.Context, name string) error {
	return f.targetCall("Pause", name, worker.TargetPaused)
}

func (f *fakeHerder) Resume(_ context.Context, name string) error {
	return f.targetCall("Resume", name, worker.TargetRunning)
}

func (f *fakeHerder) Stop(_ context.Context, name string) error {
	return f.targetCall("Stop", name, worker.TargetStopped)
}

func (f *fakeHerder) Restart(_ context.Context, name string, includeTasks, onlyFailed bool) (herder.ConnectorStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Restart %s includeTasks=%t onlyFailed=%t", name, includeTasks, onlyFailed); err != nil {
		return herder.ConnectorStatus{}, err
	}
	c, err := f.get(name)
	if err != nil {
		return herder.ConnectorStatus{}, err
	}
	st := f.status(name, c)
	if !onlyFailed || st.Connector.State == worker.StateFailed {
		st.Connector.State = worker.StateRestarting
	}
	if includeTasks {
		for i := range st.Tasks {
			if !onlyFailed || st.Tasks[i].State == worker.StateFailed {
				st.Tasks[i].State, st.Tasks[i].Trace = worker.StateRestarting, ""
			}
		}
	}
	return st, nil
}

func (f *fakeHerder) RestartTask(_ context.Context, id worker.TaskID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("RestartTask %s/%d", id.Connector, id.Task); err != nil {
		return err
	}
	c, err := f.get(id.Connector)
	if err != nil {
		return err
	}
	if id.Task >= c.tasks {
		return herder.ErrTaskNotFound
	}
	delete(c.failed, id.Task)
	return nil
}

func (f *fakeHerder) Offsets(_ context.Context, name string) (herder.ConnectorOffsets, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Offsets %s", name); err != nil {
		return herder.ConnectorOffsets{}, err
	}
	c, err := f.get(name)
	if err != nil {
		return herder.ConnectorOffsets{}, err
	}
	return herder.ConnectorOffsets{Offsets: slices.Clone(c.offsets)}, nil
}

func (f *fakeHerder) AlterOffsets(_ context.Context, name string, offs herder.ConnectorOffsets) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("AlterOffsets %s %d", name, len(offs.Offsets)); err != nil {
		return err
	}
	c, err := f.get(name)
	if err != nil {
		return err
	}
	if c.target != worker.TargetStopped {
		return fmt.Errorf("altering offsets of %s: %w", name, herder.ErrNotStopped)
	}
	c.offsets = offs.Offsets
	return nil
}

func (f *fakeHerder) ResetOffsets(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ResetOffsets %s", name); err != nil {
		return err
	}
	c, err := f.get(name)
	if err != nil {
		return err
	}
	if c.target != worker.TargetStopped {
		return herder.ErrNotStopped
	}
	c.offsets = nil
	return nil
}

func (f *fakeHerder) Topics(_ context.Context, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Topics %s", name); err != nil {
		return nil, err
	}
	c, err := f.get(name)
	if err != nil {
		return nil, err
	}
	return slices.Clone(c.topics), nil
}

func (f *fakeHerder) ResetTopics(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ResetTopics %s", name); err != nil {
		return err
	}
	c, err := f.get(name)
	if err != nil {
		return err
	}
	c.topics = nil
	return nil
}

func (f *fakeHerder) Resources(_ context.Context, name string) ([]connect.Resource, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Resources %s", name); err != nil {
		return nil, err
	}
	c, err := f.get(name)
	if err != nil {
		return nil, err
	}
	return slices.Clone(c.resources), nil
}

func (f *fakeHerder) Plugins(context.Context) ([]herder.PluginInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Plugins"); err != nil {
		return nil, err
	}
	return slices.Clone(f.plugins), nil
}

func (f *fakeHerder) PluginConfig(_ context.Context, class string) (connect.ConfigDef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("PluginConfig %s", class); err != nil {
		return nil, err
	}
	def, ok := f.defs[class]
	if !ok {
		return nil, herder.ErrNotFound
	}
	return def, nil
}

func (f *fakeHerder) Validate(_ context.Context, class string, cfg connect.Config) (herder.Validation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("Validate %s", class); err != nil {
		return herder.Validation{}, err
	}
	def, ok := f.defs[class]
	if !ok {
		return herder.Validation{}, herder.ErrNotFound
	}
	errs := def.Validate(cfg)
	masked := def.Mask(cfg)
	v := herder.Validation{Name: class, Groups: []string{"Common", "Source"}}
	for _, k := range def {
		vk := herder.ValidatedKey{Definition: k, Errors: errs[k.Name], Visible: true}
		if val, ok := masked[k.Name]; ok {
			vk.Value = &val
		} else if !k.Required {
			d := k.Default
			vk.Value = &d
		}
		v.ErrorCount += len(errs[k.Name])
		v.Configs = append(v.Configs, vk)
	}
	return v, nil
}

var _ herder.API = (*fakeHerder)(nil)

// A fixed time for deletion reports.
var deletionStart = time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
