package worker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
)

func TestSourceProducesCommitsAndStoresOffsets(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("src-"), testenv.Unique("src-topic-")
	cfg := sourceConfig(name, topic, sampleconn.KeyCount, "50", sampleconn.KeyBatch, "7", KeyTopicCreationPartition, "3")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.await("50 committed records", func() bool { return len(e.rec.Committed(name)) >= 50 })
	if got := positions(e.rec.Committed(name)); !slices.Equal(got, seq(0, 50)) {
		t.Errorf("Commit got positions %v, want 0..49 in Poll order", got)
	}
	e.await("offset 49 stored", func() bool {
		for _, o := range e.store.All(name) {
			if p, _ := sampleconn.Position(o.Offset); p == 49 {
				return true
			}
		}
		return false
	})
	recs := consume(t, e.brokers, topic, 50)
	if len(recs) != 50 {
		t.Errorf("topic has %d records, want 50", len(recs))
	}
	parts := map[int32]bool{}
	for _, r := range recs {
		parts[r.Partition] = true
	}
	if len(parts) < 2 {
		t.Errorf("records went to partitions %v of a 3-partition topic: the key partitioner was not used", parts)
	}
	if got := e.w.Topics(name); !slices.Equal(got, []string{topic}) {
		t.Errorf("Topics = %v, want [%s]", got, topic)
	}
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Fatal(errs[id])
	}
	e.checkStoppedLast(inst)
	if e.rec.Count(inst+" Stop(false)") != 1 {
		t.Errorf("calls %v", e.rec.CallsOf(inst))
	}
	if s, _ := e.lastEvent(name, 0); s.State != StateUnassigned {
		t.Errorf("last status after stop: %+v, want UNASSIGNED", s)
	}
}

func TestSourceRestoresOffsetsAfterRestart(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("restore-"), testenv.Unique("restore-topic-")
	cfg := sourceConfig(name, topic, sampleconn.KeyCount, "30", sampleconn.KeyPartitions, "2", sampleconn.KeyBatch, "4")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.await("60 committed records", func() bool { return len(e.rec.Committed(name)) >= 60 })
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Fatal(errs[id])
	}
	// The final write on stop has the last positions.
	if n := len(e.store.All(name)); n != 2 {
		t.Fatalf("stored offsets for %d source partitions, want 2: %v", n, e.store.All(name))
	}
	for _, o := range e.store.All(name) {
		if p, _ := sampleconn.Position(o.Offset); p != 29 {
			t.Errorf("stored offset %v, want position 29", o)
		}
	}

	// Restart with more records: the fresh instance continues after 29.
	cfg[sampleconn.KeyCount] = "40"
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	e.await("80 committed records", func() bool { return len(e.rec.Committed(name)) >= 80 })
	after := positions(e.rec.Committed(name)[60:])
	slices.Sort(after)
	want := append(seq(30, 40), seq(30, 40)...)
	slices.Sort(want)
	if !slices.Equal(after, want) {
		t.Errorf("after restart committed positions %v, want 30..39 for each source partition", after)
	}
	if n := e.rec.Count(sampleconn.TaskInstance(name, 0) + " Start"); n != 2 {
		t.Errorf("Start called %d times, want 2 (one per instance)", n)
	}
	if got := len(consume(t, e.brokers, topic, 80)); got != 80 {
		t.Errorf("topic has %d records, want 80 (no duplicates)", got)
	}
}

func TestSourceBackpressureBoundsInFlight(t *testing.T) {
	e := newEnv(t, WithMaxInFlightRecords(5))
	name, topic := testenv.Unique("bp-"), testenv.Unique("bp-topic-")
	cfg := sourceConfig(name, topic, sampleconn.KeyCount, "200", sampleconn.KeyBatch, "5")
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	e.await("200 committed records", func() bool { return len(e.rec.Committed(name)) >= 200 })
	// Poll is called only while fewer than 5 records are in flight
	// (polled but not committed).
	calls := e.rec.CallsOf(sampleconn.TaskInstance(name, 0))
	inFlight := 0
	for _, c := range calls {
		var n int
		if _, err := fmt.Sscanf(c, "Poll(%d)", &n); err == nil {
			if inFlight >= 5 {
				t.Fatalf("Poll called with %d records in flight, bound 5: %v", inFlight, calls)
			}
			inFlight += n
		} else if _, err := fmt.Sscanf(c, "Commit(%d)", &n); err == nil {
			inFlight -= n
		}
	}
}

func TestSourceRecordPartitionHonoured(t *testing.T) {
	// Partition -1 goes to the key partitioner; the sample source always
	// uses -1, so check the partitioner directly for explicit partitions.
	tp := &sourceTopicPartitioner{def: stickyForTest()}
	for _, want := range []int32{0, 2, 1} {
		r := recordWithPartition(want)
		if !tp.RequiresConsistency(r) {
			t.Errorf("explicit partition %d not treated as consistent", want)
		}
		if got := tp.Partition(r, 3); got != int(want) {
			t.Errorf("Partition = %d, want %d", got, want)
		}
	}
	r := recordWithPartition(-1)
	r.Key = []byte("k")
	first := tp.Partition(r, 3)
	for range 10 {
		if got := tp.Partition(r, 3); got != first {
			t.Fatalf("a keyed record moved from partition %d to %d", first, got)
		}
	}
}

// orderStore checks, at every Put, that the task's Stopped has not run yet.
type orderStore struct {
	*MemoryOffsetStore
	rec      *sampleconn.Recorder
	instance string
	late     atomic.Int32
}

func (s *orderStore) Put(ctx context.Context, connector string, offs []SourceOffset) error {
	if s.rec.Count(s.instance+" Stopped") > 0 {
		s.late.Add(1)
	}
	return s.MemoryOffsetStore.Put(ctx, connector, offs)
}

func TestSourceFinalOffsetWriteBeforeStopped(t *testing.T) {
	name, topic := testenv.Unique("final-"), testenv.Unique("final-topic-")
	inst := sampleconn.TaskInstance(name, 0)
	store := &orderStore{MemoryOffsetStore: NewMemoryOffsetStore(), instance: inst}
	e := newEnv(t, WithOffsetStore(store))
	store.rec = e.rec
	// The periodic write is an hour away: only the write on stop can store.
	cfg := sourceConfig(name, topic, sampleconn.KeyCount, "20", KeyOffsetFlushInterval, "3600000")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.await("20 committed", func() bool { return len(e.rec.Committed(name)) >= 20 })
	if n := len(store.All(name)); n != 0 {
		t.Fatalf("offsets written before the flush interval: %v", store.All(name))
	}
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Fatal(errs[id])
	}
	all := store.All(name)
	if len(all) != 1 {
		t.Fatalf("stored %v, want one partition", all)
	}
	if p, _ := sampleconn.Position(all[0].Offset); p != 19 {
		t.Errorf("stored position %d, want 19", p)
	}
	if store.late.Load() != 0 {
		t.Error("offsets written after Stopped")
	}
}

// TestTopicHandler: WithTopicHandler is told once per connector and topic
// when a task first uses it (the herder persists the active topics then),
// not for every record, and again after ResetTopics.
func TestTopicHandler(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	e := newEnv(t, WithTopicHandler(func(connector, topic string) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, connector+" "+topic)
	}))
	got := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
	name, topic := testenv.Unique("src-"), testenv.Unique("src-topic-")
	id, err := e.startTask(sourceConfig(name, topic, sampleconn.KeyCount, "50", sampleconn.KeyBatch, "7"), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.await("50 committed records", func() bool { return len(e.rec.Committed(name)) >= 50 })
	if want := []string{name + " " + topic}; !slices.Equal(got(), want) {
		t.Errorf("handler calls after 50 records = %v, want %v", got(), want)
	}
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Fatal(errs[id])
	}
	e.w.ResetTopics(name)
	if _, err := e.startTask(sourceConfig(name, topic, sampleconn.KeyCount, "55"), 0); err != nil { // resumes at 50
		t.Fatal(err)
	}
	e.await("the topic told again after ResetTopics", func() bool { return len(got()) == 2 })
	if want := []string{name + " " + topic, name + " " + topic}; !slices.Equal(got(), want) {
		t.Errorf("handler calls = %v, want %v", got(), want)
	}
}

// TestTopicsComeBackAfterResetWhileRunning: Topics lists the topics used
// since the last ResetTopics (KIP-558: a reset topic a running task keeps
// using is active again), and the topic handler is told again, so the
// herder persists it. A running task's cache of the topics it had used
// hid them until the task restarted.
func TestTopicsComeBackAfterResetWhileRunning(t *testing.T) {
	var told atomic.Int32
	e := newEnv(t, WithTopicHandler(func(string, string) { told.Add(1) }))
	name, topic := testenv.Unique("src-"), testenv.Unique("src-topic-")
	if _, err := e.startTask(sourceConfig(name, topic, sampleconn.KeyCount, "-1", sampleconn.KeyRate, "200"), 0); err != nil {
		t.Fatal(err)
	}
	e.await("the topic used", func() bool { return slices.Equal(e.w.Topics(name), []string{topic}) })
	e.w.ResetTopics(name)
	n := len(e.rec.Committed(name))
	e.await("20 more committed records", func() bool { return len(e.rec.Committed(name)) >= n+20 })
	if got := e.w.Topics(name); !slices.Equal(got, []string{topic}) {
		t.Errorf("Topics after a reset while the task kept producing to %s = %v, want [%s]", topic, got, topic)
	}
	if got := told.Load(); got != 2 {
		t.Errorf("topic handler told %d times, want 2 (first use, and first use after the reset)", got)
	}
}
