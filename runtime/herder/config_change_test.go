package herder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/internal/syncworker"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// strictConn is a source connector that owns nothing and, when deleted,
// drops only the resource kind it would create, as amqpsink and pgaudit
// refuse resources of another plugin ("unknown resource kind").
type strictConn struct {
	deleted bool
	ledger  connect.Ledger
}

func (s *strictConn) Spec() connect.Spec {
	return connect.Spec{Type: connect.TypeSource, Version: "1"}
}

func (s *strictConn) Start(ctx context.Context, _ connect.Config) error {
	s.ledger = connect.HostFrom(ctx).Ledger
	return nil
}

func (s *strictConn) TaskConfigs(int) ([]connect.Config, error) { return nil, nil }
func (s *strictConn) Stop(deleted bool)                         { s.deleted = s.deleted || deleted }

func (s *strictConn) Stopped(ctx context.Context) error {
	if !s.deleted {
		return nil
	}
	owned, err := s.ledger.List(ctx)
	if err != nil {
		return err
	}
	for _, r := range owned {
		if r.Kind != "strict.queue" {
			return fmt.Errorf("unknown resource kind %q", r.Kind)
		}
		if err := s.ledger.Release(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// openSync starts a herder with the sync worker on dir, with the sample
// plugins and extra ones. closeSync closes both, reporting failures.
func openSync(t *testing.T, dir string, extra ...connect.Plugin) (h *Standalone, st *store.File, closeSync func()) {
	t.Helper()
	return openSyncWith(t, context.Background(), dir, sampleconn.NewRecorder(), nil, extra...)
}

// openSyncWith is openSync with the herder's context, the sample plugins'
// recorder and more options (test hooks).
func openSyncWith(t *testing.T, ctx context.Context, dir string, rec *sampleconn.Recorder, opts []Option, extra ...connect.Plugin) (h *Standalone, st *store.File, closeSync func()) {
	t.Helper()
	reg, err := plugins.New(append(sampleconn.Plugins(rec), extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	st, err = store.OpenFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	h, err = NewStandalone(ctx, append([]Option{WithStore(st), WithPlugins(reg), WithLogger(testLogger(t)),
		WithWorker(func(l worker.StatusListener) (Worker, error) { return syncworker.New(reg, l), nil })}, opts...)...)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	var once sync.Once
	closeSync = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := h.Close(ctx); err != nil {
				t.Errorf("closing the herder: %v", err)
			}
			if err := st.Close(); err != nil {
				t.Errorf("closing the store: %v", err)
			}
		})
	}
	t.Cleanup(closeSync)
	return h, st, closeSync
}

// bootBlocked creates connector "x" of class slow (tasks.max 1) in a
// herder on a fresh directory, closes it, makes every later Start of x
// wait for gate, and opens the herder again with opts: when it returns,
// that herder's start of x at boot has begun and blocks. Everything is
// closed when the test ends.
func bootBlocked(t *testing.T, ctx context.Context, rec *sampleconn.Recorder, slow *slowStarts, gate chan struct{}, opts ...Option) *Standalone {
	t.Helper()
	dir := t.TempDir()
	h, _, closeFirst := openSyncWith(t, ctx, dir, rec, opts, slow.plugin())
	if _, err := h.CreateConnector(ctx, "x", connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}, ""); err != nil {
		t.Fatal(err)
	}
	closeFirst()
	slow.mu.Lock()
	slow.gate = gate
	slow.mu.Unlock()
	h, _, _ = openSyncWith(t, ctx, dir, rec, opts, slow.plugin())
	select {
	case <-slow.entered:
	case <-ctx.Done():
		t.Fatal("the start of x at boot never began")
	}
	return h
}

// slowStarts is the connector class "slow", whose Start waits for a gate
// (a slow database) until the gate is closed or Start's ctx ends.
type slowStarts struct {
	mu sync.Mutex
	// gate is taken by the next Start, which then waits for it; nil: Start
	// returns at once.
	gate chan struct{}
	// entered is closed when a Start begins waiting for the gate;
	// interrupted when such a Start returns because its ctx ended.
	entered, interrupted chan struct{}
	// started holds the configs of the Starts that succeeded.
	started []connect.Config
	// validated counts Validate calls for configs with slow.validate=once,
	// which pass the first time and are refused after.
	validated int
}

func newSlowStarts() *slowStarts {
	return &slowStarts{entered: make(chan struct{}), interrupted: make(chan struct{})}
}

func (s *slowStarts) plugin() connect.Plugin {
	return connect.Plugin{Class: "slow", NewConnector: func() connect.Connector { return &slowConn{s: s} }, NewTask: func() connect.Task { return nil }}
}

// lastStarted is the config of the last successful Start, or nil.
func (s *slowStarts) lastStarted() connect.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.started) == 0 {
		return nil
	}
	return s.started[len(s.started)-1]
}

type slowConn struct{ s *slowStarts }

func (c *slowConn) Spec() connect.Spec {
	return connect.Spec{Type: connect.TypeSource, Version: "1"}
}

func (c *slowConn) Start(ctx context.Context, cfg connect.Config) error {
	s := c.s
	s.mu.Lock()
	gate := s.gate
	s.gate = nil
	s.mu.Unlock()
	if gate != nil {
		close(s.entered)
		select {
		case <-gate:
		case <-ctx.Done():
			close(s.interrupted)
			return ctx.Err()
		}
	}
	s.mu.Lock()
	s.started = append(s.started, cfg.Clone())
	s.mu.Unlock()
	return nil
}

// Validate refuses a config with slow.validate=once from its second check
// on: an external system that changed between two checks of one request.
func (c *slowConn) Validate(_ context.Context, cfg connect.Config) map[string][]string {
	if cfg["slow.validate"] != "once" {
		return nil
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.s.validated++
	if c.s.validated > 1 {
		return map[string][]string{"slow.validate": {"refused on a second look"}}
	}
	return nil
}

func (c *slowConn) TaskConfigs(int) ([]connect.Config, error) { return nil, nil }
func (c *slowConn) Stop(bool)                                 {}
func (c *slowConn) Stopped(context.Context) error             { return nil }

// bootWithBlockedStart creates connector "x" of class slow, restarts the
// herder and waits until the boot's Start of x waits for gate. The herder
// is closed at cleanup.
func bootWithBlockedStart(t *testing.T, ctx context.Context, slow *slowStarts, gate chan struct{}) (*Standalone, connect.Config) {
	t.Helper()
	dir := t.TempDir()
	h, _, closeSync := openSync(t, dir, slow.plugin())
	cfg := connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}
	if _, err := h.CreateConnector(ctx, "x", cfg, ""); err != nil { // not gated
		t.Fatal(err)
	}
	closeSync()

	slow.mu.Lock()
	slow.gate = gate
	slow.mu.Unlock()
	h, _, _ = openSync(t, dir, slow.plugin())
	select {
	case <-slow.entered:
	case <-ctx.Done():
		t.Fatal("the start of x at boot never began")
	}
	return h, cfg
}

// A connector that owns resources keeps its class: another plugin could not
// drop them, so the deletion would fail for ever (and changing the class
// back is refused while it is being deleted). One that owns nothing may
// change it.
func TestClassChangeRefusedWhileTheConnectorOwnsResources(t *testing.T) {
	strict := connect.Plugin{Class: "strict", NewConnector: func() connect.Connector { return &strictConn{} }, NewTask: func() connect.Task { return nil }}
	h, st, _ := openSync(t, t.TempDir(), strict)
	ctx := testCtx(t)

	if _, err := h.CreateConnector(ctx, "owner", sourceConfig("t", 1), ""); err != nil {
		t.Fatal(err)
	}
	owned, err := st.Ledger("owner").List(ctx)
	if err != nil || len(owned) == 0 {
		t.Fatalf("the sample source should own resources: %v, %v", owned, err)
	}
	_, _, err = h.PutConnectorConfig(ctx, "owner", connect.Config{KeyConnectorClass: "strict", KeyTasksMax: "1"})
	var ce *ConfigError
	if !errors.As(err, &ce) || len(ce.Fields[KeyConnectorClass]) == 0 {
		t.Fatalf("PUT changing connector.class of a connector owning %d resources: %v, want a ConfigError naming %s", len(owned), err, KeyConnectorClass)
	}
	if msg := ce.Fields[KeyConnectorClass][0]; !strings.Contains(msg, "owns") {
		t.Errorf("the error should say why: %q", msg)
	}
	// Named also when the new plugin finds other problems (the sink lacks
	// topics): fixing those would not make the change possible.
	if _, err := h.PatchConnectorConfig(ctx, "owner", map[string]*string{KeyConnectorClass: new(sampleconn.SinkClass)}); !errors.As(err, &ce) || len(ce.Fields[KeyConnectorClass]) == 0 {
		t.Errorf("PATCH changing connector.class to a sink, without its topics: %v, want a ConfigError naming %s", err, KeyConnectorClass)
	}
	if _, err := h.PatchConnectorConfig(ctx, "owner", map[string]*string{KeyConnectorClass: new("strict")}); !errors.As(err, &ce) {
		t.Errorf("PATCH changing connector.class: %v, want a ConfigError", err)
	}
	if err := h.DeleteConnector(ctx, "owner"); err != nil {
		t.Fatalf("DELETE: %v", err)
	}
	if left, err := st.Ledger("owner").List(ctx); err != nil || len(left) != 0 {
		t.Errorf("after DELETE the ledger holds %v (%v)", left, err)
	}

	if _, err := h.CreateConnector(ctx, "empty", connect.Config{KeyConnectorClass: "strict", KeyTasksMax: "1"}, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.PutConnectorConfig(ctx, "empty", sourceConfig("t", 1)); err != nil {
		t.Errorf("a connector that owns nothing should be able to change its class: %v", err)
	}
}

// A config change refused by validation changes nothing: it must not cut
// short a Start still running from boot (which would leave the connector
// FAILED with "context canceled"). A valid change does interrupt it
// (TestValidConfigChangeInterruptsAStart).
func TestRefusedConfigChangeDoesNotInterruptAStart(t *testing.T) {
	ctx := testCtx(t)
	slow, gate := newSlowStarts(), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(gate) }) }) // before the herder's Close
	h, cfg := bootWithBlockedStart(t, ctx, slow, gate)
	bad := cfg.Clone()
	bad[KeyTasksMax] = "not-a-number"
	var ce *ConfigError
	if _, _, err := h.PutConnectorConfig(ctx, "x", bad); !errors.As(err, &ce) || len(ce.Fields[KeyTasksMax]) == 0 {
		t.Fatalf("PUT with a bad tasks.max: %v, want a ConfigError naming %s", err, KeyTasksMax)
	}
	if _, err := h.PatchConnectorConfig(ctx, "x", map[string]*string{KeyTasksMax: new("-1")}); !errors.As(err, &ce) {
		t.Fatalf("PATCH with a bad tasks.max: %v, want a ConfigError", err)
	}
	once.Do(func() { close(gate) })
	if err := h.AwaitStarted(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-slow.interrupted:
		t.Error("a refused config change interrupted the start at boot")
	default:
	}
	s, err := h.ConnectorStatus(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if s.Connector.State != worker.StateRunning {
		t.Errorf("after refused changes the connector is %s (%s), want RUNNING", s.Connector.State, s.Connector.Trace)
	}
}

// A valid config change while a Start from boot still runs interrupts
// that Start (its ctx ends) instead of waiting for it, and the connector
// ends RUNNING under the new config.
func TestValidConfigChangeInterruptsAStart(t *testing.T) {
	ctx := testCtx(t)
	slow, gate := newSlowStarts(), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(gate) }) }) // before the herder's Close
	h, cfg := bootWithBlockedStart(t, ctx, slow, gate)
	changed := cfg.Clone()
	changed["slow.note"] = "changed"
	if _, created, err := h.PutConnectorConfig(ctx, "x", changed); err != nil || created {
		t.Fatalf("a valid PUT while the start at boot waits: created=%v %v", created, err)
	}
	select {
	case <-slow.interrupted:
	case <-ctx.Done():
		t.Fatal("the PUT returned, but the start at boot was never interrupted")
	}
	if err := h.AwaitStarted(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := h.ConnectorStatus(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if s.Connector.State != worker.StateRunning {
		t.Errorf("after the change the connector is %s (%s), want RUNNING", s.Connector.State, s.Connector.Trace)
	}
	if got := slow.lastStarted(); got["slow.note"] != "changed" {
		t.Errorf("the running instance was started with %v, want the new config", got)
	}
	info, err := h.ConnectorInfo(ctx, "x")
	if err != nil || info.Config["slow.note"] != "changed" {
		t.Errorf("config after the change = %v (%v), want the new one", info.Config, err)
	}
}

// A change that passed validation and so interrupted a Start from boot, but
// was refused when validated again under the connector's lock, leaves the
// connector as it would have been without the request: started again with
// its old config, not FAILED with the interrupted Start's "context canceled".
func TestChangeRefusedAfterInterruptingAStartStartsItAgain(t *testing.T) {
	for _, method := range []string{"PUT", "PATCH"} {
		t.Run(method, func(t *testing.T) {
			ctx := testCtx(t)
			slow, gate := newSlowStarts(), make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(gate) }) }) // before the herder's Close
			h, cfg := bootWithBlockedStart(t, ctx, slow, gate)
			var err error
			if method == "PUT" {
				changed := cfg.Clone()
				changed["slow.validate"] = "once"
				_, _, err = h.PutConnectorConfig(ctx, "x", changed)
			} else {
				_, err = h.PatchConnectorConfig(ctx, "x", map[string]*string{"slow.validate": new("once")})
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || len(ce.Fields["slow.validate"]) == 0 {
				t.Fatalf("%s refused on the second look: %v, want a ConfigError naming slow.validate", method, err)
			}
			select {
			case <-slow.interrupted:
			case <-ctx.Done():
				t.Fatal("the change passed its first validation but never interrupted the start at boot")
			}
			var s ConnectorStatus
			for {
				if s, err = h.ConnectorStatus(ctx, "x"); err != nil {
					t.Fatal(err)
				}
				if s.Connector.State == worker.StateRunning || ctx.Err() != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if s.Connector.State != worker.StateRunning {
				t.Fatalf("after the refused change the connector is %s (%s), want RUNNING again", s.Connector.State, s.Connector.Trace)
			}
			if got := slow.lastStarted(); got == nil || got["slow.validate"] != "" {
				t.Errorf("the connector was started again with %v, want its old config", got)
			}
			info, err := h.ConnectorInfo(ctx, "x")
			if err != nil || info.Config["slow.validate"] != "" {
				t.Errorf("config after the refused change = %v (%v), want the old one", info.Config, err)
			}
		})
	}
}

// Deleting a connector forgets its active topics in the worker too
// (KIP-558): a connector created later under the same name starts with
// none, also after a restart.
func TestDeletionResetsTheWorkersTopics(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	name, old, fresh := testenv.Unique("topics-"), testenv.Unique("old-"), testenv.Unique("new-")
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(old, 1), ""); err != nil {
		t.Fatal(err)
	}
	awaitCommitted(t, rec, name, 5)
	if got, err := hs.h.Topics(ctx, name); err != nil || !slices.Contains(got, old) {
		t.Fatalf("topics of the running connector: %v (%v), want %s among them", got, err, old)
	}
	if err := hs.h.DeleteConnector(ctx, name); err != nil {
		t.Fatal(err)
	}
	// Re-created STOPPED: it produces nothing.
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(fresh, 1), "STOPPED"); err != nil {
		t.Fatal(err)
	}
	if got, err := hs.h.Topics(ctx, name); err != nil || len(got) != 0 {
		t.Errorf("topics of the re-created connector: %v (%v), want none", got, err)
	}
	hs.restart()
	if got, err := hs.h.Topics(ctx, name); err != nil || len(got) != 0 {
		t.Errorf("after a restart: %v (%v), want none", got, err)
	}
}

// A connector paused while STOPPED is not started (no Start, which may
// provision, no tasks) until it is resumed: neither by a restart of the
// worker, nor by a config change, nor by a restart request.
func TestPausedWhileStoppedStaysUnstarted(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindSync, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	if _, err := hs.h.CreateConnector(ctx, "p", sourceConfig("t", 2), worker.TargetStopped); err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.ConnectorInstance("p")
	check := func(when string) {
		t.Helper()
		if calls := rec.CallsOf(inst); len(calls) != 0 {
			t.Errorf("%s: connector calls %v, want none", when, calls)
		}
		st, err := hs.h.ConnectorStatus(ctx, "p")
		if err != nil || st.Connector.State != worker.StatePaused || len(st.Tasks) != 0 {
			t.Errorf("%s: status %+v (%v), want PAUSED without tasks", when, st, err)
		}
	}
	if err := hs.h.Pause(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	check("paused while STOPPED")
	hs.restart()
	if err := hs.h.AwaitStarted(ctx); err != nil {
		t.Fatal(err)
	}
	check("after a restart of the worker")
	if _, _, err := hs.h.PutConnectorConfig(ctx, "p", sourceConfig("t2", 2)); err != nil {
		t.Fatal(err)
	}
	check("after a config change")
	if _, err := hs.h.Restart(ctx, "p", true, false); err != nil {
		t.Fatal(err)
	}
	check("after a restart request")
	if err := hs.h.Resume(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	st, err := hs.h.ConnectorStatus(ctx, "p")
	if err != nil || st.Connector.State != worker.StateRunning || len(st.Tasks) != 2 {
		t.Errorf("resumed: %+v (%v), want RUNNING with 2 tasks", st, err)
	}
}

// declaringConn declares tasks.max itself, with a check of its own, as a
// plugin may.
type declaringConn struct{ strictConn }

func (declaringConn) Spec() connect.Spec {
	return connect.Spec{Type: connect.TypeSource, Version: "1", Config: connect.ConfigDef{
		{Name: KeyTasksMax, Type: connect.TypeInt, Default: "1", Validate: func(v string) error {
			if v == "0" {
				return errors.New("must be a positive integer")
			}
			return nil
		}},
	}}
}

// One problem, one message: a plugin that declares a common key does not
// repeat, in its own words, what the runtime already says of it.
func TestValidationReportsACommonKeyOnce(t *testing.T) {
	p := connect.Plugin{Class: "declaring", NewConnector: func() connect.Connector { return &declaringConn{} }, NewTask: func() connect.Task { return nil }}
	h, _, _ := openSync(t, t.TempDir(), p) // closed by its cleanup
	v, err := h.Validate(testCtx(t), "declaring", connect.Config{KeyName: "d", KeyConnectorClass: "declaring", KeyTasksMax: "0"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range v.Configs {
		if k.Definition.Name == KeyTasksMax && len(k.Errors) != 1 {
			t.Errorf("tasks.max=0: errors %q, want one", k.Errors)
		}
	}
	if v.ErrorCount != 1 {
		t.Errorf("error_count %d, want 1", v.ErrorCount)
	}
}

// pausePoint holds the first goroutine that reaches a test hook point until
// release is called (or ctx ends); reached is closed when it arrives. Later
// arrivals pass through.
type pausePoint struct {
	ctx              context.Context
	reached, proceed chan struct{}
	arrive, let      sync.Once
}

func newPausePoint(ctx context.Context) *pausePoint {
	return &pausePoint{ctx: ctx, reached: make(chan struct{}), proceed: make(chan struct{})}
}

// hold is called at the hook point.
func (p *pausePoint) hold() {
	first := false
	p.arrive.Do(func() { first = true; close(p.reached) })
	if first {
		select {
		case <-p.proceed:
		case <-p.ctx.Done():
		}
	}
}

// release lets the held goroutine (and any to come) go on.
func (p *pausePoint) release() { p.let.Do(func() { close(p.proceed) }) }

// signalPoint is a pausePoint that holds nobody: reached only says that
// the point was reached.
func signalPoint(ctx context.Context) *pausePoint {
	p := newPausePoint(ctx)
	p.release()
	return p
}

// interruptHooks holds resume at hookResumeLocked, op at hookInterruptAsked
// once armed says so, and yield at hookYieldWait.
func interruptHooks(resume, op, yield *pausePoint, armed *atomic.Bool) Option {
	return withHook(func(point, _ string) {
		switch point {
		case hookResumeLocked:
			resume.hold()
		case hookInterruptAsked:
			if armed.Load() {
				op.hold()
			}
		case hookYieldWait:
			yield.hold()
		}
	})
}
