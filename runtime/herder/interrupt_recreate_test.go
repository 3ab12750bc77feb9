package herder

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// A start the herder gave up on (an operation interrupted it while a Start
// that ignores its context still runs) is a failed start: the herder
// recorded FAILED and treats the connector as not running. Its status must
// not read UNASSIGNED ("not started yet") only because the worker still
// lists the instance whose Start has not returned: a restart of failed
// instances (onlyFailed), itself the interrupting operation here, would
// skip it.
func TestStatusOfAStartTheHerderGaveUpOnIsFailed(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	t.Cleanup(rec.ReleaseBlocked)
	ctx := testCtx(t)
	name := testenv.Unique("gaveup-")
	cfg := sourceConfig(testenv.Unique("t-"), 1, sampleconn.KeyBlockStart, sampleconn.BlockIgnoreCtx)
	if _, err := hs.h.CreateConnector(ctx, name, cfg, worker.TargetStopped); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan error, 1)
	go func() { resumed <- hs.h.Resume(ctx, name) }()
	if err := rec.AwaitCall(ctx, sampleconn.ConnectorInstance(name)+" Start blocking", 1); err != nil {
		t.Fatal(err)
	}
	type restartResult struct {
		st  ConnectorStatus
		err error
	}
	restarted := make(chan restartResult, 1)
	go func() {
		st, err := hs.h.Restart(ctx, name, false, true)
		restarted <- restartResult{st, err}
	}()
	if err := <-resumed; err != nil {
		t.Fatalf("Resume: %v", err)
	}
	// The restart read the connector FAILED, so it stops the instance
	// (whose Stopped waits for the Start) to start it again.
	if err := rec.AwaitCall(ctx, sampleconn.ConnectorInstance(name)+" Stop(false)", 1); err != nil {
		t.Fatalf("the restart of failed instances did not restart the connector: %v", err)
	}
	rec.ReleaseBlocked()
	var r restartResult
	select {
	case r = <-restarted:
	case <-ctx.Done():
		t.Fatal("the restart never returned")
	}
	if r.err != nil || r.st.Connector.State != worker.StateRestarting {
		t.Errorf("restart of failed instances after the herder gave up on the start = %+v (%v), want the connector RESTARTING", r.st.Connector, r.err)
	}
}

// A start that yielded to an operation and waits for it (awaitApproaching)
// belongs to the connector it was made for: when that operation deletes the
// connector and another one is created under the same name before the
// start looks again, the start must not run on the new connector. Here the
// resumed start of a refused change yields to a DELETE; the connector
// created anew afterwards failed to start, and the old connector's resumed
// start used to start it again ("its start was interrupted for a config
// change that was then refused"), which nobody asked for.
func TestYieldedStartDoesNotRunOnAConnectorCreatedAnew(t *testing.T) {
	ctx := testCtx(t)
	rec := sampleconn.NewRecorder()
	slow := newSlowStarts()
	resume, op, yield := newPausePoint(ctx), newPausePoint(ctx), newPausePoint(ctx)
	resumeLocked, asked, yieldWait := resume.reached, op.reached, yield.reached
	releaseResume, releaseOp, releaseYield := resume.release, op.release, yield.release
	var armed atomic.Bool
	hook := interruptHooks(resume, op, yield, &armed)
	gate := make(chan struct{})
	h := bootBlocked(t, ctx, rec, slow, gate, hook)
	t.Cleanup(releaseResume)
	t.Cleanup(releaseOp)
	t.Cleanup(releaseYield)
	t.Cleanup(func() { close(gate) })
	cfg := connect.Config{KeyConnectorClass: "slow", KeyTasksMax: "1"}
	changed := cfg.Clone()
	changed["slow.validate"] = "once"
	var ce *ConfigError
	if _, _, err := h.PutConnectorConfig(ctx, "x", changed); !errors.As(err, &ce) {
		t.Fatalf("PUT refused on the second look: %v, want a ConfigError", err)
	}
	select {
	case <-resumeLocked:
	case <-ctx.Done():
		t.Fatal("the start after the refused change never took the lock")
	}
	armed.Store(true)
	delDone := make(chan error, 1)
	go func() { delDone <- h.DeleteConnector(ctx, "x") }()
	select {
	case <-asked:
	case <-ctx.Done():
		t.Fatal("the DELETE never asked for an interrupt")
	}
	releaseResume()
	select {
	case <-yieldWait: // the resumed start yielded and waits for the DELETE
	case <-ctx.Done():
		t.Fatal("the resumed start never yielded to the DELETE")
	}
	releaseOp()
	if err := <-delDone; err != nil {
		t.Fatalf("DELETE: %v", err)
	}
	// Another connector under the same name, whose start fails.
	if _, err := h.CreateConnector(ctx, "x", sourceConfig("t", 1, sampleconn.KeyFailStart, "true"), ""); err != nil {
		t.Fatal(err)
	}
	starts := rec.CountPrefix(sampleconn.ConnectorInstance("x") + " Start")
	releaseYield()
	h.bgWG.Wait() // the yielded start's goroutines, its retry included
	if n := rec.CountPrefix(sampleconn.ConnectorInstance("x") + " Start"); n != starts {
		t.Errorf("the new connector x was started %d more time(s) by the old connector's yielded start, want none", n-starts)
	}
}
