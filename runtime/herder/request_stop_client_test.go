package herder

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
)

// stoppedWatch is the class "stopwatch": a source connector without tasks
// whose Stopped waits (a final flush to a slow system) until release is
// closed or its ctx ends, and records how its ctx ended.
type stoppedWatch struct {
	entered, release chan struct{}
	once             sync.Once
	mu               sync.Mutex
	err              error
	errs             []error // of every Stopped, in order
	calls            int
}

func (s *stoppedWatch) plugin() connect.Plugin {
	return connect.Plugin{Class: "stopwatch", NewConnector: func() connect.Connector { return &stoppedWatchConn{s: s} }, NewTask: func() connect.Task { return nil }}
}

type stoppedWatchConn struct{ s *stoppedWatch }

func (c *stoppedWatchConn) Spec() connect.Spec {
	return connect.Spec{Type: connect.TypeSource, Version: "1"}
}
func (c *stoppedWatchConn) Start(context.Context, connect.Config) error { return nil }
func (c *stoppedWatchConn) Validate(context.Context, connect.Config) map[string][]string {
	return nil
}
func (c *stoppedWatchConn) TaskConfigs(int) ([]connect.Config, error) { return nil, nil }
func (c *stoppedWatchConn) Stop(bool)                                 {}
func (c *stoppedWatchConn) Stopped(ctx context.Context) error {
	s := c.s
	s.once.Do(func() { close(s.entered) })
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.calls++
	s.err = ctx.Err()
	s.errs = append(s.errs, ctx.Err())
	s.mu.Unlock()
	return ctx.Err()
}

// A stop asked for by a request (PUT /connectors/x/stop) is not cut short
// when its client stops waiting (decision 0025: a request's stops run under
// the request's context without its cancel, as reconfigurations' and
// restarts' do): the worker would otherwise abandon tasks still in Poll or
// Put and cut the connector's Stopped.
func TestStopIsNotCutByItsClientGoingAway(t *testing.T) {
	ctx := testCtx(t)
	sw := &stoppedWatch{entered: make(chan struct{}), release: make(chan struct{})}
	h, _, _ := openSyncWith(t, ctx, t.TempDir(), sampleconn.NewRecorder(), nil, sw.plugin())
	if _, err := h.CreateConnector(ctx, "x", connect.Config{KeyConnectorClass: "stopwatch", KeyTasksMax: "1"}, ""); err != nil {
		t.Fatal(err)
	}
	rctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	stopped := make(chan error, 1)
	go func() { stopped <- h.Stop(rctx, "x") }()
	select {
	case <-sw.entered:
	case <-ctx.Done():
		t.Fatal("the stop never reached the connector's Stopped")
	}
	giveUp() // curl --max-time
	time.Sleep(100 * time.Millisecond)
	close(sw.release)
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.err != nil {
		t.Errorf("the connector's Stopped was cut short by the stop request's client going away: %v", sw.err)
	}
}

// genConn is the class "gentasks": a source connector with one task whose
// config changes at every TaskConfigs call (a table list that moved), and
// whose task's Stopped is watched by tasks (stoppedWatch).
type genConn struct {
	stoppedWatchConn
	g *genTasks
}

type genTasks struct {
	mu    sync.Mutex
	n     int
	tasks *stoppedWatch
}

func (g *genTasks) plugin() connect.Plugin {
	return connect.Plugin{Class: "gentasks", NewConnector: func() connect.Connector {
		return &genConn{stoppedWatchConn: stoppedWatchConn{s: &stoppedWatch{entered: make(chan struct{}), release: closedChan()}}, g: g}
	}, NewTask: func() connect.Task { return &watchedTask{s: g.tasks} }}
}

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

func (c *genConn) TaskConfigs(int) ([]connect.Config, error) {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	c.g.n++
	return []connect.Config{{"gen": itoa(c.g.n)}}, nil
}

type watchedTask struct{ s *stoppedWatch }

func (t *watchedTask) Start(context.Context, connect.Config) error { return nil }
func (t *watchedTask) Stop(bool)                                   {}
func (t *watchedTask) Stopped(ctx context.Context) error {
	return (&stoppedWatchConn{s: t.s}).Stopped(ctx)
}
func (t *watchedTask) Poll(ctx context.Context) ([]connect.SourceRecord, error) {
	<-ctx.Done()
	return nil, nil
}
func (t *watchedTask) Commit(context.Context, []connect.SourceRecord) error { return nil }

// A task reconfiguration the connector asked for (in the background)
// stops the old tasks under a context no interrupt cuts: a stop sent
// meanwhile interrupts the reconfiguration's task starts, never its stops
// (the worker would abandon tasks still in Poll or Put; decision 0025).
func TestStopDoesNotCutAReconfigurationsTaskStop(t *testing.T) {
	ctx := testCtx(t)
	g := &genTasks{tasks: &stoppedWatch{entered: make(chan struct{}), release: make(chan struct{})}}
	h, _, _ := openSyncWith(t, ctx, t.TempDir(), sampleconn.NewRecorder(), nil, g.plugin())
	if _, err := h.CreateConnector(ctx, "x", connect.Config{KeyConnectorClass: "gentasks", KeyTasksMax: "1"}, ""); err != nil {
		t.Fatal(err)
	}
	h.requestReconfiguration("x")
	select {
	case <-g.tasks.entered: // the reconfiguration stops the old task
	case <-ctx.Done():
		t.Fatal("the reconfiguration never stopped the old task")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- h.Stop(ctx, "x") }()
	time.Sleep(100 * time.Millisecond) // the stop asked for its interrupt
	close(g.tasks.release)
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	g.tasks.mu.Lock()
	defer g.tasks.mu.Unlock()
	if len(g.tasks.errs) == 0 || g.tasks.errs[0] != nil {
		t.Errorf("the reconfiguration's stop of the old task was cut short by the stop's interrupt: %v", g.tasks.errs)
	}
}
