package worker

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
)

func values(recs []connect.SinkRecord) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	return out
}

func TestSinkCommitsOnlyFlushedAndRedeliversAfterRestart(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("sink-"), testenv.Unique("sink-topic-")
	produce(t, e.brokers, topic, 20, func(i int) string { return fmt.Sprint(i) })

	// Flush reports only offsets below 12: records 12..19 are put but never
	// reported durable.
	cfg := sinkConfig(name, topic, sampleconn.KeyFlushUpTo, "12")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.await("20 records put", func() bool { return len(e.rec.Sunk(name)) >= 20 })
	e.await("offset 12 committed", func() bool { return groupOffset(t, e.brokers, groupID(name), topic, 0) == 12 })
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Fatal(errs[id])
	}
	e.checkStoppedLast(inst)
	if got := groupOffset(t, e.brokers, groupID(name), topic, 0); got != 12 {
		t.Fatalf("committed offset after stop = %d, want 12 (only what Flush reported)", got)
	}
	calls := e.rec.CallsOf(inst)
	if !slices.Contains(calls, "Open(1)") || !slices.Contains(calls, "Close(1)") {
		t.Errorf("PartitionAware Open/Close not called: %v", calls)
	}
	// The stop reaches the task first; its partitions are closed before
	// Stopped.
	if closed, stop, stopped := slices.Index(calls, "Close(1)"), slices.Index(calls, "Stop(false)"), slices.Index(calls, "Stopped"); stop < 0 || closed < stop || stopped < closed {
		t.Errorf("calls %v: want Stop(false), then Close(1), then Stopped", calls)
	}

	// A fresh instance gets 12..19 again.
	cfg[sampleconn.KeyFlushUpTo] = "-1"
	id, err = e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.await("28 records put", func() bool { return len(e.rec.Sunk(name)) >= 28 })
	redelivered := values(e.rec.Sunk(name)[20:])
	want := strings.Fields("12 13 14 15 16 17 18 19")
	if !slices.Equal(redelivered, want) {
		t.Errorf("after restart got %v, want %v", redelivered, want)
	}
	e.await("offset 20 committed", func() bool { return groupOffset(t, e.brokers, groupID(name), topic, 0) == 20 })
	if got := e.w.Topics(name); !slices.Equal(got, []string{topic}) {
		t.Errorf("Topics = %v", got)
	}
}

// TestSinkCommitsNoFurtherThanPut: a task whose Flush reports offsets past
// the records it was given (a bug) gets only what it was given committed,
// as Kafka Connect ignores offsets not yet consumed: otherwise records
// produced later would be skipped.
func TestSinkCommitsNoFurtherThanPut(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("sink-"), testenv.Unique("sink-topic-")
	produce(t, e.brokers, topic, 10, func(i int) string { return fmt.Sprint(i) })
	id, err := e.startTask(sinkConfig(name, topic, sampleconn.KeyFlushAhead, "5"), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.await("10 records put", func() bool { return len(e.rec.Sunk(name)) >= 10 })
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Fatal(errs[id])
	}
	if got := groupOffset(t, e.brokers, groupID(name), topic, 0); got != 10 {
		t.Fatalf("committed offset %d, want 10: no further than the records Put took", got)
	}
}

func TestSinkTopicsRegex(t *testing.T) {
	e := newEnv(t)
	name := testenv.Unique("regex-")
	prefix := testenv.Unique("rx")
	produce(t, e.brokers, prefix+"-a", 3, func(i int) string { return "a" + fmt.Sprint(i) })
	produce(t, e.brokers, prefix+"-b", 2, func(i int) string { return "b" + fmt.Sprint(i) })
	cfg := sinkConfig(name, "")
	delete(cfg, KeyTopics)
	cfg[KeyTopicsRegex] = prefix + "-.*"
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	e.await("5 records put", func() bool { return len(e.rec.Sunk(name)) >= 5 })
	if got := e.w.Topics(name); !slices.Equal(got, []string{prefix + "-a", prefix + "-b"}) {
		t.Errorf("Topics = %v", got)
	}
}

func TestSinkErrantRecords(t *testing.T) {
	tests := []struct {
		name       string
		tolerance  string
		dlq        bool
		headers    bool
		wantFailed bool
	}{
		{name: "tolerance none fails the task", tolerance: "none", wantFailed: true},
		{name: "tolerance all skips", tolerance: "all"},
		{name: "tolerance all to dead letter queue with headers", tolerance: "all", dlq: true, headers: true},
		{name: "tolerance all to dead letter queue without headers", tolerance: "all", dlq: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			name, topic := testenv.Unique("errant-"), testenv.Unique("errant-topic-")
			dlq := testenv.Unique("dlq-")
			e.dropTopic(dlq)
			produce(t, e.brokers, topic, 5, func(i int) string {
				if i == 2 {
					return "bad"
				}
				return fmt.Sprint(i)
			})
			cfg := sinkConfig(name, topic, sampleconn.KeyErrant, "bad", KeyErrorsTolerance, tc.tolerance)
			if tc.dlq {
				cfg[KeyDLQTopic] = dlq
				cfg[KeyDLQContextHeaders] = fmt.Sprint(tc.headers)
			}
			id, err := e.startTask(cfg, 0)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantFailed {
				s := e.awaitTaskState(id, StateFailed)
				if !strings.Contains(s.Trace, "errors.tolerance is none") {
					t.Errorf("trace %q does not explain the failure", s.Trace)
				}
				e.awaitCall(sampleconn.TaskInstance(name, 0)+" Stopped", 1)
				e.checkStoppedLast(sampleconn.TaskInstance(name, 0))
				if st, ok := e.w.TaskStatus(id); !ok || st.State != StateFailed {
					t.Errorf("TaskStatus = %+v, %v; want FAILED", st, ok)
				}
				return
			}
			e.await("4 good records put", func() bool { return len(e.rec.Sunk(name)) >= 4 })
			if got := values(e.rec.Sunk(name)); !slices.Equal(got, []string{"0", "1", "3", "4"}) {
				t.Errorf("sunk %v", got)
			}
			if !tc.dlq {
				return
			}
			recs := consume(t, e.brokers, dlq, 1)
			if string(recs[0].Value) != "bad" {
				t.Errorf("dead letter record value %q", recs[0].Value)
			}
			hdr := map[string]string{}
			for _, h := range recs[0].Headers {
				hdr[h.Key] = string(h.Value)
			}
			if !tc.headers {
				if len(hdr) != 0 {
					t.Errorf("headers %v, want none", hdr)
				}
				return
			}
			want := map[string]string{
				HeaderErrTopic: topic, HeaderErrPartition: "0", HeaderErrOffset: "2",
				HeaderErrConnector: name, HeaderErrTask: "0", HeaderErrStage: "TASK_PUT",
				HeaderErrClass: sampleconn.SinkClass,
			}
			for k, v := range want {
				if hdr[k] != v {
					t.Errorf("header %s = %q, want %q", k, hdr[k], v)
				}
			}
			if !strings.Contains(hdr[HeaderErrExcMessage], "errant") {
				t.Errorf("header %s = %q", HeaderErrExcMessage, hdr[HeaderErrExcMessage])
			}
		})
	}
}

// TestSinkRebalanceFlushesAndCommitsRevoked runs two tasks of one sink in
// one group: when the second joins, the first loses a partition, and that
// partition is flushed and committed at once (the periodic flush is an hour
// away) and closed.
func TestSinkRebalanceFlushesAndCommitsRevoked(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("rebalance-"), testenv.Unique("rebalance-topic-")
	producePartitions(t, e.brokers, topic, 2, 0, nil)
	// Two partitions with 5 records each.
	cl := newProducer(t, e.brokers)
	for p := range int32(2) {
		for i := range 5 {
			produceTo(t, cl, topic, p, fmt.Sprintf("p%d-%d", p, i))
		}
	}
	cfg := sinkConfig(name, topic, KeyOffsetFlushInterval, "3600000")
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	first := sampleconn.TaskInstance(name, 0)
	e.await("10 records put by task 0", func() bool { return len(e.rec.Sunk(name)) >= 10 })
	if got0, got1 := groupOffset(t, e.brokers, groupID(name), topic, 0), groupOffset(t, e.brokers, groupID(name), topic, 1); got0 != -1 || got1 != -1 {
		t.Fatalf("offsets committed before any flush: %d, %d", got0, got1)
	}
	if _, err := e.startTask(cfg, 1); err != nil {
		t.Fatal(err)
	}
	e.await("a partition revoked from task 0", func() bool {
		return e.rec.CountPrefix(first+" Close(") > 0
	})
	calls := e.rec.CallsOf(first)
	flush, closeIdx := slices.Index(calls, "Flush"), slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "Close(") })
	if flush < 0 || flush > closeIdx {
		t.Errorf("no Flush before Close on revoke: %v", calls)
	}
	committed := 0
	for p := range int32(2) {
		if groupOffset(t, e.brokers, groupID(name), topic, p) == 5 {
			committed++
		}
	}
	if committed == 0 {
		t.Errorf("the revoked partition's flushed offset (5) was not committed on revoke")
	}
	e.await("task 1 opened a partition", func() bool {
		return e.rec.CountPrefix(sampleconn.TaskInstance(name, 1)+" Open(") > 0
	})
}

// TestSinkFlushesWhilePaused: records put before a pause are flushed and
// committed at the next flush interval even though the task stays paused.
func TestSinkFlushesWhilePaused(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("pflush-"), testenv.Unique("pflush-topic-")
	produce(t, e.brokers, topic, 5, func(i int) string { return fmt.Sprint(i) })
	id, err := e.startTask(sinkConfig(name, topic, KeyOffsetFlushInterval, "1000"), 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.await("5 records put", func() bool { return len(e.rec.Sunk(name)) >= 5 })
	e.w.SetTargetState(name, TargetPaused)
	e.awaitTaskState(id, StatePaused)
	puts := e.rec.CountPrefix(inst + " Put(")
	e.await("offset 5 committed while paused", func() bool { return groupOffset(t, e.brokers, groupID(name), topic, 0) == 5 })
	if n := e.rec.CountPrefix(inst + " Put("); n != puts {
		t.Errorf("Put called while paused")
	}
	if s, _ := e.w.TaskStatus(id); s.State != StatePaused {
		t.Errorf("status %+v", s)
	}
}

// TestSinkOpenFailureFailsTask: a PartitionAware sink whose Open returns an
// error on assignment ends FAILED with a trace naming Open, the partitions
// and the task's own error, and gets Stop(false) and then Stopped exactly
// once, last; the fetched records never reach Put.
func TestSinkOpenFailureFailsTask(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("open-"), testenv.Unique("open-topic-")
	produce(t, e.brokers, topic, 5, func(i int) string { return fmt.Sprint(i) })
	id, err := e.startTask(sinkConfig(name, topic, sampleconn.KeyFailOpen, "true"), 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	s := e.awaitTaskState(id, StateFailed)
	for _, want := range []string{"Open(", topic, "Open failed as " + sampleconn.KeyFailOpen + " asked"} {
		if !strings.Contains(s.Trace, want) {
			t.Errorf("trace %q does not contain %q", s.Trace, want)
		}
	}
	e.awaitCall(inst+" Stopped", 1)
	e.checkStoppedLast(inst)
	if i, j := slices.Index(e.rec.CallsOf(inst), "Open(1)"), slices.Index(e.rec.CallsOf(inst), "Stop(false)"); i < 0 || j < i {
		t.Errorf("calls %v: want the failed Open, then Stop(false)", e.rec.CallsOf(inst))
	}
	// The records of partitions whose Open failed never reach Put.
	for _, c := range e.rec.CallsOf(inst) {
		if strings.HasPrefix(c, "Put(") {
			t.Errorf("calls %v: a Put after the failed Open", e.rec.CallsOf(inst))
			break
		}
	}
	// Stopping a failed task calls nothing more on it.
	if errs := e.w.StopTasks(e.ctx(), []TaskID{id}, false); errs[id] != nil {
		t.Errorf("StopTasks of the failed task: %v", errs[id])
	}
	e.checkStoppedLast(inst)
}
