package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
)

// topicRecords reads every record the topic holds (up to its end offsets).
func topicRecords(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	ends.Each(func(o kadm.ListedOffset) { total += int(o.Offset) })
	if total == 0 {
		return nil
	}
	return consume(t, brokers, topic, total)
}

// Every record Kafka holds after a stop mid-stream reached Commit before
// Stopped: a consume-and-delete source (pgaudit) otherwise sends it again.
func TestSourceStopCommitsEverythingKafkaHolds(t *testing.T) {
	tests := []struct {
		name    string
		deleted bool
		extra   []string
	}{
		{"plain stop", false, nil},
		{"deletion", true, nil},
		{"three partitions, small batches", false, []string{sampleconn.KeyPartitions, "3", sampleconn.KeyBatch, "3", KeyTopicCreationPartition, "3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			name, topic := testenv.Unique("srcstop-"), testenv.Unique("srcstop-topic-")
			cfg := sourceConfig(name, topic, append([]string{sampleconn.KeyCount, "-1", sampleconn.KeyRate, "3000"}, tc.extra...)...)
			id, err := e.startTask(cfg, 0)
			if err != nil {
				t.Fatal(err)
			}
			e.await("200 committed records", func() bool { return len(e.rec.Committed(name)) >= 200 })
			if err := e.w.StopTasks(e.ctx(), []TaskID{id}, tc.deleted)[id]; err != nil {
				t.Fatal(err)
			}
			inst := sampleconn.TaskInstance(name, 0)
			e.checkStoppedLast(inst) // so every Commit came before Stopped
			committed := map[string]bool{}
			for _, r := range e.rec.Committed(name) {
				committed[string(r.Key)] = true
			}
			var missing []string
			for _, r := range topicRecords(t, e.brokers, topic) {
				if !committed[string(r.Key)] {
					missing = append(missing, string(r.Key))
				}
			}
			if len(missing) > 0 {
				t.Errorf("%d records are in Kafka but never reached Commit before Stopped (first: %v)", len(missing), missing[:min(5, len(missing))])
			}
		})
	}
}

// commitRecorder is a SourceTask whose only used method is Commit.
type commitRecorder struct {
	connect.SourceTask
	got [][]connect.SourceRecord
}

func (c *commitRecorder) Commit(_ context.Context, acked []connect.SourceRecord) error {
	c.got = append(c.got, acked)
	return nil
}

// The final commit passes every acknowledged record to Commit, also those
// behind one that failed on another Kafka partition (acked independently),
// but none behind a failed or unacknowledged record of the same Kafka
// partition: that one is sent again after a restart, and a later change of
// its key committed (deleted, by a consume-and-delete source) now would
// leave Kafka with the older change last. While the loop runs only the
// acknowledged prefix is committed, in Poll order.
func TestCommitAckedFinalCommitsPastAFailure(t *testing.T) {
	failed := errors.New("broker said no")
	tests := []struct {
		name  string
		final bool
		state []error // per record: nil acked, failed, or errPendingMark (not yet acked)
		parts []int32 // per record: its Kafka partition (default: its index)
		want  []string
		pos   int // stored offset position
	}{
		{"prefix while running", false, []error{nil, nil, failed, nil, errPendingMark}, nil, []string{"0", "1"}, 1},
		{"final: past the failure", true, []error{nil, nil, failed, nil, errPendingMark, nil}, nil, []string{"0", "1", "3", "5"}, 1},
		{"final: all acked", true, []error{nil, nil, nil}, nil, []string{"0", "1", "2"}, 2},
		{"final: not past a failure on the same partition", true, []error{nil, failed, nil, nil}, []int32{0, 0, 1, 0}, []string{"0", "2"}, 0},
		{"final: not past an unacknowledged record on the same partition", true, []error{nil, errPendingMark, nil, nil}, []int32{0, 0, 1, 0}, []string{"0", "2"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			task := &commitRecorder{}
			ti := &taskInstance{base: context.Background(), log: slog.New(slog.DiscardHandler)}
			s := &sourceLoop{t: ti, task: task, acked: make(chan struct{}, 1), byPart: map[string][]*pending{},
				offsets: map[string]SourceOffset{}, dirty: map[string]bool{}}
			for i, st := range tc.state {
				part := int32(i)
				if tc.parts != nil {
					part = tc.parts[i]
				}
				r := connect.SourceRecord{Topic: "t", Partition: part, Key: []byte(fmt.Sprint(i)),
					SourcePartition: map[string]any{"p": "0"}, SourceOffset: map[string]any{"position": i}}
				p := &pending{rec: r, pkey: "k", part: part}
				if st != errPendingMark {
					p.done, p.err = true, st
				}
				s.queue = append(s.queue, p)
				s.byPart["k"] = append(s.byPart["k"], p)
			}
			s.acked <- struct{}{}
			// A failed record is reported as the loop's error; it is not
			// committed (nor anything behind it, while the loop runs).
			wantErr := slices.Contains(tc.state, failed)
			if err := s.commitAcked(tc.final); (err != nil) != wantErr || (wantErr && !errors.Is(err, failed)) {
				t.Errorf("commitAcked = %v, want an error wrapping %v: %v", err, failed, wantErr)
			}
			var got []string
			for _, batch := range task.got {
				for _, r := range batch {
					got = append(got, string(r.Key))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("committed %v, want %v", got, tc.want)
			}
			// Offsets only cover the acknowledged prefix of the partition.
			if off := s.offsets["k"]; off.Offset["position"] != tc.pos {
				t.Errorf("stored offset %v, want position %d", off.Offset, tc.pos)
			}
			if tc.final {
				n := len(task.got)
				if err := s.commitAcked(true); (err != nil) != wantErr {
					t.Errorf("second final commitAcked = %v, want an error: %v", err, wantErr)
				}
				if len(task.got) != n {
					t.Errorf("a second final commit committed again: %v", task.got[n:])
				}
			}
		})
	}
}

var errPendingMark = errors.New("not yet acknowledged")

// The graceful timeout bounds the final flush and commit too: a sink whose
// final Flush hangs is reported abandoned at the timeout, and Stopped still
// runs exactly once, after the Flush returns.
func TestFinalFlushBoundedByGracefulTimeout(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("slowflush-"), testenv.Unique("slowflush-topic-")
	produce(t, e.brokers, topic, 5, func(i int) string { return fmt.Sprint(i) })
	cfg := sinkConfig(name, topic, sampleconn.KeyBlockFlush, "true", KeyGracefulTimeout, "300")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.await("5 records put", func() bool { return len(e.rec.Sunk(name)) >= 5 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = e.w.StopTasks(ctx, []TaskID{id}, false)[id]
	if !errors.Is(err, errAbandoned) {
		t.Fatalf("StopTasks with a hanging final Flush = %v, want abandoned after the 300 ms graceful timeout", err)
	}
	if ctx.Err() != nil {
		t.Errorf("StopTasks returned only when the caller's context ended")
	}
	if n := e.rec.Count(inst + " Stopped"); n != 0 {
		t.Fatalf("Stopped ran while the final Flush was still blocked")
	}
	if st, ok := e.w.TaskStatus(id); !ok || !st.Abandoned {
		t.Errorf("TaskStatus = %+v, %v; want Abandoned", st, ok)
	}
	e.rec.ReleaseBlocked()
	e.awaitCall(inst+" Stopped", 1)
	e.checkStoppedLast(inst)
}

// A stop or deletion of a task whose Stopped already ran: a plain stop just
// forgets it; a deletion is told the instance had stopped without deletion.
func TestStopTasksAlreadyStopped(t *testing.T) {
	tests := []struct {
		name    string
		deleted bool
		want    error
	}{
		{"plain stop of a failed task", false, nil},
		{"deletion of a failed task", true, ErrAlreadyStopped},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			name := testenv.Unique("failed-")
			id, err := e.startTask(sourceConfig(name, testenv.Unique("failed-topic-"), sampleconn.KeyFailAfter, "0"), 0)
			if err != nil {
				t.Fatal(err)
			}
			inst := sampleconn.TaskInstance(name, 0)
			e.awaitTaskState(id, StateFailed)
			e.awaitCall(inst+" Stopped", 1)
			err = e.w.StopTasks(e.ctx(), []TaskID{id}, tc.deleted)[id]
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("StopTasks = %v, want %v", err, tc.want)
			}
			if _, ok := e.w.TaskStatus(id); ok {
				t.Errorf("the task is still listed")
			}
			e.checkStoppedLast(inst)
		})
	}
}

// StopConnector(deleted=true) on a connector whose Stopped already ran
// without deletion says so, so the herder completes the deletion.
func TestStopConnectorDeletionAfterPlainStopped(t *testing.T) {
	tests := []struct {
		name    string
		deleted bool
		want    error
	}{
		{"plain stop after a failed start", false, nil},
		{"deletion after a failed start", true, ErrAlreadyStopped},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			name := testenv.Unique("cfail-")
			cfg := sourceConfig(name, "t", sampleconn.KeyFailStart, "true")
			if err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger, Target: TargetRunning}); err == nil {
				t.Fatal("StartConnector succeeded; want Start to fail")
			}
			err := e.w.StopConnector(e.ctx(), name, tc.deleted)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("StopConnector = %v, want %v", err, tc.want)
			}
			e.checkStoppedLast(sampleconn.ConnectorInstance(name))
		})
	}
}

// An abandoned instance replaced by a fresh one under the same id does not
// report over its successor (e.g. a FAILED when its blocked call returns).
func TestReplacedInstanceDoesNotReport(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("stale-"), testenv.Unique("stale-topic-")
	produce(t, e.brokers, topic, 3, func(i int) string { return fmt.Sprint(i) })
	cfg := sinkConfig(name, topic, sampleconn.KeyBlock, sampleconn.BlockIgnoreCtx, KeyGracefulTimeout, "200")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.awaitCall(sampleconn.TaskInstance(name, 0)+" Put blocking", 1)
	e.w.mu.Lock()
	old := e.w.tasks[id]
	e.w.mu.Unlock()
	if err := e.w.StopTasks(e.ctx(), []TaskID{id}, false)[id]; !errors.Is(err, errAbandoned) {
		t.Fatalf("StopTasks = %v, want abandoned", err)
	}
	fresh := sinkConfig(name, topic) // the fresh instance does not block
	if _, err := e.startTask(fresh, 0); err != nil {
		t.Fatal(err)
	}
	e.awaitTaskState(id, StateRunning)
	old.setStatus(Status{State: StateFailed, Trace: "late failure of the abandoned instance"})
	if s, _ := e.lastEvent(name, 0); s.State != StateRunning {
		t.Errorf("last reported status %+v: the replaced instance overwrote its successor's", s)
	}
	if s, _ := e.w.TaskStatus(id); s.State != StateRunning {
		t.Errorf("TaskStatus %+v, want the fresh instance's RUNNING", s)
	}
}

// ghostMember joins group as a consumer that never heartbeats or rejoins,
// as a worker killed with SIGKILL leaves its member behind: the group waits
// for it (up to its session and rebalance timeouts) on every rebalance.
func ghostMember(t *testing.T, brokers []string, group, topic string, timeout time.Duration) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 1
	meta.Topics = []string{topic}
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group = group
	join.SessionTimeoutMillis = int32(timeout.Milliseconds())
	join.RebalanceTimeoutMillis = int32(timeout.Milliseconds())
	join.ProtocolType = "consumer"
	for _, name := range []string{"cooperative-sticky", "sticky", "range"} {
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = name, meta.AppendTo(nil)
		join.Protocols = append(join.Protocols, p)
	}
	var resp *kmsg.JoinGroupResponse
	for range 2 { // the first answer may only hand out a member id
		resp, err = join.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if kerr.ErrorForCode(resp.ErrorCode) != kerr.MemberIDRequired {
			break
		}
		join.MemberID = resp.MemberID
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		t.Fatalf("ghost join: %v", err)
	}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID, sync.Generation = group, resp.MemberID, resp.Generation
	sync.ProtocolType, sync.Protocol = resp.ProtocolType, resp.Protocol
	if resp.LeaderID == resp.MemberID {
		empty := kmsg.NewConsumerMemberAssignment()
		a := kmsg.NewSyncGroupRequestGroupAssignment()
		a.MemberID, a.MemberAssignment = resp.MemberID, empty.AppendTo(nil)
		sync.GroupAssignment = append(sync.GroupAssignment, a)
	}
	sresp, err := sync.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(sresp.ErrorCode); err != nil {
		t.Fatalf("ghost sync: %v", err)
	}
}

// A sink stopped (here: deleted) while its group waits for a dead member
// returns within the graceful timeout, and Stopped runs before the stop
// returns; the worker's Close then waits for the consumer's background
// close.
func TestSinkStopBoundedWhileGroupWaitsForDeadMember(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("ghost-"), testenv.Unique("ghost-topic-")
	produce(t, e.brokers, topic, 3, func(i int) string { return fmt.Sprint(i) })
	// Long enough to outlast the stop, short enough for Close's wait on
	// the consumer's background close (kgo waits for the JoinGroup answer,
	// which the coordinator sends once the ghost times out).
	ghostMember(t, e.brokers, groupID(name), topic, 10*time.Second)
	cfg := sinkConfig(name, topic, KeyGracefulTimeout, "1000")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	// The sink's join makes the group rebalance, which waits for the ghost.
	e.awaitTaskState(id, StateRunning)
	e.await("the group rebalancing", func() bool { return groupState(t, e.brokers, groupID(name)) == "PreparingRebalance" })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = e.w.StopTasks(ctx, []TaskID{id}, true)[id]
	if err != nil {
		t.Fatalf("StopTasks while the group waits for a dead member = %v; want a clean stop within the 1 s graceful timeout", err)
	}
	if ctx.Err() != nil {
		t.Fatal("StopTasks returned only when the caller's context ended")
	}
	e.checkStoppedLast(inst)
}

func groupState(t *testing.T, brokers []string, group string) string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gs, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err != nil {
		return ""
	}
	return gs[group].State
}

// A deletion that arrives while a plain stop's Stopped is running (too late
// to reach the instance) is told so, not answered with the plain Stopped's
// result.
func TestStopConnectorDeletionDuringPlainStopped(t *testing.T) {
	e := newEnv(t)
	name := testenv.Unique("cslow-")
	cfg := sourceConfig(name, "t", sampleconn.KeyBlockStopped, "true")
	if err := e.w.StartConnector(e.ctx(), ConnectorRun{Name: name, Config: cfg, Ledger: e.ledger, Target: TargetRunning}); err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.ConnectorInstance(name)
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.w.StopConnector(short, name, false); err == nil {
		t.Fatal("plain StopConnector returned while Stopped is blocked")
	}
	e.awaitCall(inst+" Stopped blocking", 1)
	// Still listed while Stopped runs; StopConnector(deleted) reaches it
	// through finish, called here directly so the release below cannot
	// overtake the call (StopConnector of a forgotten connector is a no-op).
	e.w.mu.Lock()
	c := e.w.connectors[name]
	e.w.mu.Unlock()
	if c == nil {
		t.Fatal("the connector is not listed while its Stopped runs")
	}
	result := make(chan error, 1)
	go func() { result <- c.finish(e.w, true) }()
	e.rec.ReleaseBlocked()
	if err := <-result; !errors.Is(err, ErrAlreadyStopped) {
		t.Errorf("StopConnector(deleted) during a plain Stopped = %v, want ErrAlreadyStopped", err)
	}
	if n := e.rec.Count(inst + " Stop(true)"); n != 0 {
		t.Errorf("Stop(true) delivered after Stopped began: %v", e.rec.CallsOf(inst))
	}
	e.checkStoppedLast(inst)
}

// A restart of a task whose previous instance is still finishing (its final
// commit or Stopped) waits for it: the fresh instance must not read what
// the old one is about to confirm.
func TestRestartWaitsForPreviousInstanceToFinish(t *testing.T) {
	e := newEnv(t)
	name, topic := testenv.Unique("restartwait-"), testenv.Unique("restartwait-topic-")
	produce(t, e.brokers, topic, 3, func(i int) string { return fmt.Sprint(i) })
	// Put fails at once (the task is FAILED), then Stopped blocks.
	failing := sinkConfig(name, topic, sampleconn.KeyFailAfter, "0", sampleconn.KeyBlockStopped, "true")
	id, err := e.startTask(failing, 0)
	if err != nil {
		t.Fatal(err)
	}
	inst := sampleconn.TaskInstance(name, 0)
	e.awaitCall(inst+" Stopped blocking", 1)
	e.awaitTaskState(id, StateFailed)
	started := make(chan error, 1)
	go func() {
		_, err := e.startTask(sinkConfig(name, topic), 0)
		started <- err
	}()
	// Something that must not happen cannot be awaited: give the start
	// 300 ms to (wrongly) return while the old Stopped is still blocked. A
	// slow machine can only make this miss the bug, never fail wrongly.
	select {
	case err := <-started:
		t.Fatalf("StartTask returned (%v) while the previous instance's Stopped was still running", err)
	case <-time.After(300 * time.Millisecond):
	}
	e.rec.ReleaseBlocked()
	select {
	case err := <-started:
		if err != nil {
			t.Fatal(err)
		}
	case <-e.ctx().Done():
		t.Fatal("StartTask did not return after the previous instance's Stopped was released")
	}
	calls := e.rec.CallsOf(inst)
	stopped, restarted := slices.Index(calls, "Stopped"), -1
	for i, c := range calls {
		if c == "Start" && i > 0 {
			restarted = i
		}
	}
	if stopped < 0 || restarted < stopped {
		t.Errorf("calls %v: the fresh instance's Start must follow the old instance's Stopped", calls)
	}
}

// A sink stopped while its periodic offset commit hangs (a broker that
// stopped answering, as in a network partition) stops within the graceful
// timeout: the stop cuts that commit short, and the final flush commits
// again within the rest of the grace. Before, the loop sat in the commit
// for franz-go's request timeouts (up to 30 s), the stop was abandoned and
// a deletion's Stopped came that much later.
func TestSinkStopCutsAHangingPeriodicCommit(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	hung := make(chan struct{}, 1)
	c.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		select {
		case hung <- struct{}{}:
		default:
		}
		return nil, nil, true // handled, never answered
	})
	e := newEnvOn(t, c.ListenAddrs())
	name, topic := testenv.Unique("hungcommit-"), testenv.Unique("hungcommit-topic-")
	produce(t, e.brokers, topic, 3, func(i int) string { return fmt.Sprint(i) })
	cfg := sinkConfig(name, topic, KeyGracefulTimeout, "2000")
	id, err := e.startTask(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-hung: // the loop's periodic commit of the 3 records waits for an answer
	case <-e.ctx().Done():
		t.Fatal("no offset commit reached the broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.w.StopTasks(ctx, []TaskID{id}, true)[id]; err != nil {
		t.Fatalf("StopTasks while an offset commit hangs = %v; want a clean stop within the 2 s graceful timeout", err)
	}
	e.checkStoppedLast(sampleconn.TaskInstance(name, 0))
}
