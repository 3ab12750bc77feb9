package herder

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// reconfConn is the sample source whose connector keeps its Host (to call
// RequestTaskReconfiguration) and, once blockTasks is set, hands out task
// configs whose Start blocks until its context ends (an unreachable
// system).
type reconfConn struct {
	connect.Connector
	host       *atomic.Pointer[connect.Host]
	blockTasks *atomic.Bool
}

func (c *reconfConn) Start(ctx context.Context, cfg connect.Config) error {
	c.host.Store(connect.HostFrom(ctx))
	return c.Connector.Start(ctx, cfg)
}

func (c *reconfConn) TaskConfigs(n int) ([]connect.Config, error) {
	cfgs, err := c.Connector.TaskConfigs(n)
	if c.blockTasks.Load() {
		for _, tc := range cfgs {
			tc[sampleconn.KeyBlockStart] = sampleconn.BlockUntilCtx
		}
	}
	return cfgs, err
}

// A stop must not wait behind a task reconfiguration (asked for by the
// connector) whose new task Start blocks: the reconfiguration's task
// starts are interrupted like a start at boot.
func TestStopInterruptsAReconfigurationsBlockedTaskStart(t *testing.T) {
	rec := sampleconn.NewRecorder()
	var host atomic.Pointer[connect.Host]
	var blockTasks atomic.Bool
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
	hs := &harness{t: t, kind: kindReal, dir: t.TempDir(), rec: rec, reg: reg, seeds: testenv.KafkaBrokers(t)}
	hs.dropKafkaObjectsAtCleanup()
	hs.start()
	ctx := testCtx(t)
	name := testenv.Unique("reconf-")
	cfg := sourceConfig(testenv.Unique("t-"), 1)
	cfg[KeyConnectorClass] = "reconf-source"
	if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, 1)
	blockTasks.Store(true)
	host.Load().RequestTaskReconfiguration()
	task := sampleconn.TaskInstance(name, 0)
	if err := rec.AwaitCall(ctx, task+" Start blocking", 1); err != nil {
		t.Fatal(err)
	}
	// Normally applied within 0.1 s; the bug waits for the blocked Start
	// until this context ends. 10 s leaves room for a loaded CI machine.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := hs.h.Stop(sctx, name); err != nil {
		t.Fatalf("Stop while the reconfigured task's Start blocks: %v, want it applied", err)
	}
	if st, err := hs.h.ConnectorStatus(ctx, name); err != nil || st.Connector.State != worker.StateStopped {
		t.Errorf("status after the stop = %+v (%v), want STOPPED", st.Connector, err)
	}
}
