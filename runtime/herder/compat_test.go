package herder

import (
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// A connector created PAUSED stays dormant, also across a restart of the
// worker (as Kafka Connect's WorkerConnector goes from INIT to PAUSED
// without start()), until it is resumed.
func TestCompatCreatedPausedStaysDormant(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindSync, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	name := testenv.Unique("paused-")
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(testenv.Unique("t-"), 2), worker.TargetPaused); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		st, err := hs.h.ConnectorStatus(ctx, name)
		if err != nil || st.Connector.State != worker.StatePaused || len(st.Tasks) != 0 {
			t.Errorf("%s: status %+v (%v), want PAUSED without tasks", when, st, err)
		}
		if calls := rec.CallsOf(sampleconn.ConnectorInstance(name)); len(calls) != 0 {
			t.Errorf("%s: the connector was called: %v", when, calls)
		}
	}
	check("created")
	hs.restart()
	check("after a restart")
	if err := hs.h.Resume(ctx, name); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, 2)
}
