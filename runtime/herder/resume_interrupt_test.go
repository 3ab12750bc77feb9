package herder

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// A stop that asks for an interrupt after a refused change handed the
// connector to resumeInterruptedStart, but before that start registered its
// cancel, is not left waiting behind the resumed Start (which blocks on an
// unreachable system): the resumed start yields to it, as a held-back task
// start does (TestHeldBackStartYieldsToAnInterruptingOperation).
func TestResumedStartYieldsToAnInterruptingOperation(t *testing.T) {
	ctx := testCtx(t)
	slow, gate := newSlowStarts(), make(chan struct{})
	var gateOnce sync.Once
	resume := newPausePoint(ctx)
	locked, release := resume.reached, resume.release
	hook := withHook(func(point, _ string) {
		if point == hookResumeLocked {
			resume.hold()
		}
	})
	// Every later Start blocks (the system is unreachable) until its ctx ends.
	h := bootBlocked(t, ctx, sampleconn.NewRecorder(), slow, gate, hook)
	// Registered after the herder's cleanup, so they run first.
	t.Cleanup(release)
	t.Cleanup(func() { gateOnce.Do(func() { close(gate) }) })
	cfg := connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}
	slow.mu.Lock()
	slow.gate, slow.entered, slow.interrupted = gate, make(chan struct{}), make(chan struct{})
	slow.mu.Unlock()
	changed := cfg.Clone()
	changed["slow.validate"] = "once"
	_, _, err := h.PutConnectorConfig(ctx, "x", changed)
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("PUT refused on the second look: %v, want a ConfigError", err)
	}
	select {
	case <-locked:
	case <-ctx.Done():
		t.Fatal("the start after the refused change never took the lock")
	}
	h.mu.Lock()
	before := h.conns["x"].interrupts
	h.mu.Unlock()
	// Normally applied within 0.1 s; the bug waits for the blocked Start
	// until this context ends. 10 s leaves room for a loaded CI machine.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stopDone := make(chan error, 1)
	go func() { stopDone <- h.Stop(sctx, "x") }()
	pollUntil(t, "the stop to ask for an interrupt", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.conns["x"].interrupts != before
	})
	release()
	if err := <-stopDone; err != nil {
		t.Fatalf("the stop sent meanwhile: %v, want it applied", err)
	}
	if s, err := h.ConnectorStatus(ctx, "x"); err != nil || s.Connector.State != worker.StateStopped {
		t.Fatalf("status after the stop = %+v (%v), want STOPPED", s.Connector, err)
	}
}
