package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
)

// lateFailingSink blocks its first Put past the graceful timeout, ignoring
// cancellation, then fails it with an errant record; its Stopped blocks
// until released.
type lateFailingSink struct {
	*sampleconn.SinkTask
	once                             sync.Once
	blocking, release, releaseStoped chan struct{}
}

func (s *lateFailingSink) Put(ctx context.Context, recs []connect.SinkRecord) error {
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return s.SinkTask.Put(ctx, recs)
	}
	close(s.blocking)
	<-s.release
	// A failure that counts even though the task was stopping: an errant
	// record under errors.tolerance=none.
	_ = connect.HostFrom(ctx).Errors.Report(ctx, recs[0], errors.New("bad record"))
	return errors.New("put failed after returning late")
}

func (s *lateFailingSink) Stopped(ctx context.Context) error {
	<-s.releaseStoped
	return s.SinkTask.Stopped(ctx)
}

// TestAbandonedStaysAbandonedAfterLateFailure: an abandoned task whose
// blocked Put returns late and fails is still reported Abandoned while it
// finishes (final commit, Stopped). The herder refuses a second instance
// only while the flag shows; losing it let one start beside the old one.
func TestAbandonedStaysAbandonedAfterLateFailure(t *testing.T) {
	rec := sampleconn.NewRecorder()
	ps := sampleconn.Plugins(rec)
	var sink connect.Plugin
	for _, p := range ps {
		if p.Class == sampleconn.SinkClass {
			sink = p
		}
	}
	stuck := &lateFailingSink{blocking: make(chan struct{}), release: make(chan struct{}), releaseStoped: make(chan struct{})}
	var made atomic.Int32
	custom := connect.Plugin{Class: "late-failing-sink", NewConnector: sink.NewConnector, NewTask: func() connect.Task {
		st := sink.NewTask().(*sampleconn.SinkTask)
		if made.Add(1) > 1 {
			return st
		}
		stuck.SinkTask = st
		return stuck
	}}
	reg, err := plugins.New(append(ps, custom)...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, WithPlugins(reg))
	e.rec = rec
	// Registered after newEnv, so they run before the worker's Close: a
	// failing test never leaves the plugin calls blocked.
	var releasePut, releaseStopped sync.Once
	unblockPut := func() { releasePut.Do(func() { close(stuck.release) }) }
	t.Cleanup(func() {
		unblockPut()
		releaseStopped.Do(func() { close(stuck.releaseStoped) })
	})

	name, topic := testenv.Unique("late-"), testenv.Unique("late-topic-")
	produce(t, e.brokers, topic, 3, func(i int) string { return fmt.Sprint(i) })
	cfg := sinkConfig(name, topic, KeyGracefulTimeout, "200")
	cfg[KeyConnectorClass] = "late-failing-sink"
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-stuck.blocking:
	case <-e.ctx().Done():
		t.Fatal("the first Put never began")
	}
	if err := e.w.StopTasks(e.ctx(), []TaskID{id}, false)[id]; !errors.Is(err, errAbandoned) {
		t.Fatalf("StopTasks = %v, want the task abandoned", err)
	}
	unblockPut()
	e.awaitTaskState(id, StateFailed) // the late Put failed the loop; Stopped is still blocked
	s, listed := e.w.TaskStatus(id)
	if !listed || !s.Abandoned {
		t.Fatalf("after the late failure: listed %v, status %+v; want it listed and still Abandoned", listed, s)
	}
}
