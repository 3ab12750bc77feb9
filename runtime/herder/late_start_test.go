package herder

import (
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// A connector Start that ignores its context and returns, successfully,
// only after an operation interrupted it (the herder gave up on it and
// generated no task configs) must not leave the connector RUNNING without
// tasks: the late instance fails, and the interrupting restart starts the
// connector with its tasks. (Since decision 0025 a request's client going
// away no longer makes the herder give up on a start.)
func TestStartReturningAfterTheHerderGaveUpDoesNotRunWithoutTasks(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	t.Cleanup(rec.ReleaseBlocked)
	ctx := testCtx(t)
	name := testenv.Unique("late-")
	cfg := sourceConfig(testenv.Unique("t-"), 2, sampleconn.KeyBlockStart, sampleconn.BlockIgnoreCtx)
	created := make(chan error, 1)
	go func() { _, err := hs.h.CreateConnector(ctx, name, cfg, ""); created <- err }()
	inst := sampleconn.ConnectorInstance(name)
	if err := rec.AwaitCall(ctx, inst+" Start blocking", 1); err != nil {
		t.Fatal(err)
	}
	restarted := make(chan error, 1)
	go func() { _, err := hs.h.Restart(ctx, name, false, false); restarted <- err }()
	if err := <-created; err != nil { // interrupted: the herder gave up on the Start
		t.Fatal(err)
	}
	if st, err := hs.h.ConnectorStatus(ctx, name); err != nil || st.Connector.State == worker.StateRunning {
		t.Fatalf("status once the herder gave up on the start = %+v (%v), want not RUNNING", st, err)
	}
	// The restart waits for the blocked instance to stop; its Start
	// returns now, successfully, after the herder gave up on it.
	rec.ReleaseBlocked()
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, 2)
	if got := rec.Count(inst + " Start"); got != 2 {
		t.Errorf("successful connector Starts = %d, want 2 (the late one and the restart's)", got)
	}
}
