package herder

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/internal/syncworker"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// A signal during start-up (its context ends) while deletions recorded
// before the last shutdown are being completed must not fail the start:
// tidyconnect then shuts down cleanly (exit 0) and the intents are
// completed later. The per-connector lock was taken with the ended
// context, so with several intents the select picked ctx.Done() at random
// and NewStandalone failed ("connector ... is busy with another
// operation"), exiting 1.
func TestStartupInterruptedDuringBootDeletions(t *testing.T) {
	dir := t.TempDir()
	st, err := store.OpenFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10 // each lock had an even chance to fail: 2^-10 to pass by luck
	for i := range n {
		name := fmt.Sprintf("d%d", i)
		in := store.DeletionIntent{Connector: name, Config: sourceConfig("t-"+name, 1, "name", name),
			Phase: store.PhaseStoppingTasks, Attempts: 1, StartedAt: time.Now().UTC()}
		if err := st.PutIntent(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the signal came before (or while) the deletions ran
	reg, err := plugins.New(sampleconn.Plugins(sampleconn.NewRecorder())...)
	if err != nil {
		t.Fatal(err)
	}
	st, err = store.OpenFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h, err := NewStandalone(ctx, WithStore(st), WithPlugins(reg), WithLogger(testLogger(t)),
		WithWorker(func(l worker.StatusListener) (Worker, error) { return syncworker.New(reg, l), nil }))
	if err != nil {
		t.Fatalf("NewStandalone with its context ended during the boot deletions: %v; want a start that the caller then closes", err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	if err := h.Close(cctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}
