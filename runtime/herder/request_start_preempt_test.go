package herder

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// heldValidations is the class "slow" (slowStarts) whose Validate, for a
// config with slow.hold set, waits until release is closed: a check that
// reaches a slow system. held is closed when the first such Validate
// begins waiting.
type heldValidations struct {
	s             *slowStarts
	held, release chan struct{}
	once          sync.Once
}

func (hv *heldValidations) plugin() connect.Plugin {
	return connect.Plugin{Class: "slow", NewConnector: func() connect.Connector {
		return &heldValidationConn{slowConn: slowConn{s: hv.s}, hv: hv}
	}, NewTask: func() connect.Task { return nil }}
}

type heldValidationConn struct {
	slowConn
	hv *heldValidations
}

func (c *heldValidationConn) Validate(ctx context.Context, cfg connect.Config) map[string][]string {
	if cfg["slow.hold"] == "" {
		return nil
	}
	c.hv.once.Do(func() { close(c.hv.held) })
	select {
	case <-c.hv.release:
	case <-ctx.Done():
	}
	return nil
}

// A delete, stop or restart that asked for an interrupt while a config
// change held the connector's lock, before the change's start registered
// its cancel (here: while the change was validated under the lock), found
// nothing to cancel. The change's Start, which no longer ends with its
// client (decision 0025), must not then hold that operation until
// shutdown: like a background start (interruptible), it gives way to an
// operation already on its way, and the operation goes on.
func TestInterruptAskedBeforeARequestStartRegisteredEndsIt(t *testing.T) {
	cfg := connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}
	tests := []struct {
		name string
		op   func(ctx context.Context, h *Standalone) error
		// want is the connector's state once the operation returned ("":
		// deleted).
		want worker.State
	}{
		{"delete", func(ctx context.Context, h *Standalone) error { return h.DeleteConnector(ctx, "x") }, ""},
		{"stop", func(ctx context.Context, h *Standalone) error { return h.Stop(ctx, "x") }, worker.StateStopped},
		{"restart", func(ctx context.Context, h *Standalone) error {
			_, err := h.Restart(ctx, "x", false, false)
			return err
		}, worker.StateRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			slow := newSlowStarts()
			hv := &heldValidations{s: slow, held: make(chan struct{}), release: make(chan struct{})}
			var armed atomic.Bool
			asked := newPausePoint(ctx)
			asked.release() // signals only
			h, _, _ := openSyncWith(t, ctx, t.TempDir(), sampleconn.NewRecorder(), []Option{withHook(func(point, _ string) {
				if point == hookInterruptAsked && armed.Load() {
					asked.hold()
				}
			})}, hv.plugin())
			if _, err := h.CreateConnector(ctx, "x", cfg, ""); err != nil {
				t.Fatal(err)
			}
			gate := make(chan struct{})
			var closeGate sync.Once
			t.Cleanup(func() { closeGate.Do(func() { close(gate) }) })
			slow.mu.Lock()
			slow.gate = gate // the change's Start blocks (an unreachable system) until its ctx ends
			slow.mu.Unlock()

			changed := cfg.Clone()
			changed["slow.hold"] = "1"
			putDone := make(chan error, 1)
			go func() { _, _, err := h.PutConnectorConfig(ctx, "x", changed); putDone <- err }()
			select {
			case <-hv.held: // the change holds the lock, its start not registered yet
			case <-ctx.Done():
				t.Fatal("the change was never validated under the lock")
			}
			armed.Store(true)
			opDone := make(chan error, 1)
			go func() { opDone <- tt.op(ctx, h) }()
			select {
			case <-asked.reached:
			case <-ctx.Done():
				t.Fatal("the operation never asked for an interrupt")
			}
			close(hv.release)

			var opErr error
			select {
			case opErr = <-opDone:
			case <-time.After(10 * time.Second):
				// Let everything end before failing.
				closeGate.Do(func() { close(gate) })
				<-putDone
				<-opDone
				t.Fatalf("the %s waited behind the change's blocked Start (it asked for an interrupt before the start registered its cancel)", tt.name)
			}
			if opErr != nil {
				t.Fatalf("the %s: %v", tt.name, opErr)
			}
			if err := <-putDone; err != nil {
				t.Fatalf("the change whose start gave way: %v", err)
			}
			st, err := h.ConnectorStatus(ctx, "x")
			if tt.want == "" {
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("status after the delete = %+v (%v), want not found", st, err)
				}
				return
			}
			if err != nil || st.Connector.State != tt.want {
				t.Errorf("status after the %s = %+v (%v), want %s", tt.name, st.Connector, err, tt.want)
			}
		})
	}
}
