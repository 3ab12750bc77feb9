package herder

import (
	"context"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// A request's Start is not cancelled when its client goes away (a curl
// that timed out during a long provisioning): the Start goes on and the
// connector comes up as if the client had waited (decision 0025).
func TestRequestStartOutlivesItsClient(t *testing.T) {
	cfg := connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}
	tests := []struct {
		name string
		// target is the state the connector is created in before the gate
		// is set (none: the operation creates it).
		target worker.TargetState
		op     func(ctx context.Context, h *Standalone) error
	}{
		{"create", "", func(ctx context.Context, h *Standalone) error {
			_, err := h.CreateConnector(ctx, "x", cfg, "")
			return err
		}},
		{"config change", worker.TargetRunning, func(ctx context.Context, h *Standalone) error {
			changed := cfg.Clone()
			changed["slow.note"] = "changed"
			_, _, err := h.PutConnectorConfig(ctx, "x", changed)
			return err
		}},
		{"resume", worker.TargetStopped, func(ctx context.Context, h *Standalone) error {
			return h.Resume(ctx, "x")
		}},
		{"restart", worker.TargetRunning, func(ctx context.Context, h *Standalone) error {
			_, err := h.Restart(ctx, "x", false, false)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			slow := newSlowStarts()
			h, _, _ := openSync(t, t.TempDir(), slow.plugin())
			if tt.target != "" {
				if _, err := h.CreateConnector(ctx, "x", cfg, tt.target); err != nil {
					t.Fatal(err)
				}
			}
			gate := make(chan struct{})
			slow.mu.Lock()
			slow.gate = gate
			slow.mu.Unlock()
			clientCtx, clientGone := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- tt.op(clientCtx, h) }()
			select {
			case <-slow.entered:
			case <-ctx.Done():
				t.Fatal("the operation's Start never began")
			}
			clientGone()
			// A cancel that reached Start ends it within microseconds; this
			// only gives one that would the time to show.
			select {
			case <-slow.interrupted:
				t.Fatal("the client going away cancelled the Start")
			case <-time.After(300 * time.Millisecond):
			}
			close(gate)
			if err := <-done; err != nil {
				t.Fatalf("the operation: %v", err)
			}
			st, err := h.ConnectorStatus(ctx, "x")
			if err != nil || st.Connector.State != worker.StateRunning {
				t.Fatalf("status after the Start the client stopped waiting for = %+v (%v), want RUNNING", st.Connector, err)
			}
		})
	}
}

// A request's Start that blocks (an unreachable system) no longer ends
// with its client; a DELETE interrupts it, as it interrupts a start at
// boot, instead of waiting behind it (decision 0025).
func TestDeleteInterruptsARequestsBlockedStart(t *testing.T) {
	ctx := testCtx(t)
	slow := newSlowStarts()
	h, _, _ := openSync(t, t.TempDir(), slow.plugin())
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	slow.mu.Lock()
	slow.gate = gate
	slow.mu.Unlock()
	created := make(chan error, 1)
	go func() {
		_, err := h.CreateConnector(ctx, "x", connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}, "")
		created <- err
	}()
	select {
	case <-slow.entered:
	case <-ctx.Done():
		t.Fatal("the create's Start never began")
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := h.DeleteConnector(dctx, "x"); err != nil {
		t.Fatalf("DELETE while the create's Start blocks: %v", err)
	}
	select {
	case <-slow.interrupted:
	default:
		t.Error("the delete did not interrupt the blocked Start")
	}
	if err := <-created; err != nil {
		t.Fatalf("the interrupted create: %v", err)
	}
	if _, err := h.ConnectorInfo(ctx, "x"); err == nil {
		t.Error("the connector still exists after the DELETE")
	}
}
