package herder

import (
	"context"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// A connector Start that ignores its context and returns, successfully,
// only after the create request gave up waiting must not leave the
// connector RUNNING without tasks: the herder was told the start failed and
// generated no task configs, so the instance fails (a restart starts it
// with its tasks).
func TestStartReturningAfterTheRequestGaveUpDoesNotRunWithoutTasks(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	t.Cleanup(rec.ReleaseBlocked)
	name := testenv.Unique("late-")
	cfg := sourceConfig(testenv.Unique("t-"), 2, sampleconn.KeyBlockStart, sampleconn.BlockIgnoreCtx)
	cctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := hs.h.CreateConnector(cctx, name, cfg, ""); err != nil {
		t.Fatal(err)
	}
	rec.ReleaseBlocked() // Start returns now, after the request gave up
	ctx := testCtx(t)
	if err := rec.AwaitCall(ctx, sampleconn.ConnectorInstance(name)+" Start", 1); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "the late start to settle", func() bool {
		st, err := hs.h.ConnectorStatus(ctx, name)
		return err == nil && st.Connector.State != worker.StateUnassigned
	})
	time.Sleep(200 * time.Millisecond) // a late RUNNING report would arrive by now
	st, err := hs.h.ConnectorStatus(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Connector.State == worker.StateRunning && len(st.Tasks) != 2 {
		t.Fatalf("connector RUNNING with %d tasks, tasks.max 2: %+v", len(st.Tasks), st)
	}
	if _, err := hs.h.Restart(ctx, name, false, true); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, 2)
}
