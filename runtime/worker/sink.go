package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/kafka"
)

// maxPollRecords bounds one Put batch.
const maxPollRecords = 2000

// sinkLoop is the state of one sink task. The loop goroutine and the
// consumer group's rebalance callbacks both call the task; mu serializes
// them (BlockRebalanceOnPoll already keeps callbacks out of Put, mu makes it
// airtight and gives the race detector its edges).
type sinkLoop struct {
	t        *taskInstance
	task     connect.SinkTask
	aware    connect.PartitionAware
	consumer *kgo.Client

	mu        sync.Mutex
	assigned  map[connect.TopicPartition]bool
	committed map[connect.TopicPartition]int64
	// taken is, per partition, one past the highest offset given to Put:
	// Flush may not commit beyond it (as Kafka Connect ignores offsets not
	// yet consumed), or records no task saw would be skipped.
	taken    map[connect.TopicPartition]int64
	pending  []connect.SinkRecord // fetched but not yet accepted by Put
	asyncErr error                // from Open in a callback: fails the task
	gone     atomic.Bool          // finish gave up waiting for the close: callbacks leave the task alone
	noFlush  bool                 // failed or finished: callbacks only Close
	active   activeTopics
}

// sinkSessionTimeout is the sink consumers' group session timeout
// (decision 0013); WithKafka options may override it.
const sinkSessionTimeout = 10 * time.Second

// regexMetadataMaxAge is how often a topics.regex sink looks for new
// matching topics.
const regexMetadataMaxAge = 10 * time.Second

// groupID is the consumer group of a sink connector, as Kafka Connect names it.
func groupID(connector string) string { return "connect-" + connector }

// regexCheckTimeout bounds warnTopicsNoLongerMatched.
const regexCheckTimeout = 30 * time.Second

// warnTopicsNoLongerMatched logs a warning naming the topics the
// connector's consumer group holds committed offsets for that topics.regex
// matches only in part. Before topics.regex matched whole names, such a
// sink consumed them; after an upgrade it silently stopped doing so (its
// status stays RUNNING). The warning says how to keep consuming them.
func (s *sinkLoop) warnTopicsNoLongerMatched(ctx context.Context) {
	t := s.t
	whole, err := regexp.Compile(anchoredRegex(t.set.topicsRegex))
	if err != nil {
		return
	}
	part, err := regexp.Compile(t.set.topicsRegex)
	if err != nil {
		return
	}
	offsets, err := kadm.NewClient(s.consumer).FetchOffsets(ctx, groupID(t.id.Connector))
	if err != nil {
		t.log.Debug("could not read the consumer group's committed offsets to check topics.regex against the topics it consumed", "error", err)
		return
	}
	var missed []string
	for topic := range offsets {
		if topic != t.set.dlqTopic && !whole.MatchString(topic) && part.MatchString(topic) {
			missed = append(missed, topic)
		}
	}
	if len(missed) == 0 {
		return
	}
	slices.Sort(missed)
	t.log.Warn("topics.regex matches whole topic names (as in Kafka Connect) and no longer matches topics this connector consumed before (an earlier version matched the pattern anywhere in the name): their new records are not delivered; to keep consuming them, set topics.regex to the suggested pattern",
		"topics.regex", t.set.topicsRegex, "topics", missed, "suggested", suggestRegex(t.set.topicsRegex, missed, t.set.dlqTopic))
}

// suggestRegex is the topics.regex that keeps consuming the topics missed
// as well as those re matches: re matched anywhere in the name, as earlier
// versions did, unless that matches the dead letter queue topic (validation
// refuses it: the sink would consume its own errant records); then re
// plus the missed topics by name.
func suggestRegex(re string, missed []string, dlq string) string {
	broad := ".*(?:" + re + ").*"
	if b, err := regexp.Compile(anchoredRegex(broad)); err == nil && (dlq == "" || !b.MatchString(dlq)) {
		return broad
	}
	alt := []string{"(?:" + re + ")"}
	for _, topic := range missed {
		alt = append(alt, regexp.QuoteMeta(topic))
	}
	return strings.Join(alt, "|")
}

func (t *taskInstance) runSink(task connect.SinkTask) (final func(), err error) {
	s := &sinkLoop{
		t: t, task: task,
		assigned: map[connect.TopicPartition]bool{}, committed: map[connect.TopicPartition]int64{}, taken: map[connect.TopicPartition]int64{},
	}
	s.aware, _ = task.(connect.PartitionAware)
	opts := []kgo.Opt{
		kgo.ConsumerGroup(groupID(t.id.Connector)),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onRevoked),
		// Kafka Connect's consumer default is 45 s; a worker killed with
		// SIGKILL holds its partitions that long (decision 0013).
		kgo.SessionTimeout(sinkSessionTimeout),
	}
	if t.set.topicsRegex != "" {
		// Kafka Connect matches whole topic names (Pattern.matches);
		// franz-go matches anywhere in the name unless anchored.
		opts = append(opts, kgo.ConsumeRegex(), kgo.ConsumeTopics(anchoredRegex(t.set.topicsRegex)),
			// New matching topics are found at a metadata refresh: Kafka's
			// default of 5 minutes left a sink created together with its
			// source idle that long.
			kgo.MetadataMaxAge(regexMetadataMaxAge))
		if t.set.dlqTopic != "" {
			// Validation refuses a DLQ the regex matches; this keeps the
			// sink from reading its own errant records regardless.
			opts = append(opts, kgo.ConsumeExcludeTopics("^"+regexp.QuoteMeta(t.set.dlqTopic)+"$"))
		}
	} else {
		opts = append(opts, kgo.ConsumeTopics(t.set.topics...))
	}
	s.consumer, err = kafka.NewClient(t.w.seeds, t.log, append(opts, t.w.kopts...)...)
	if err != nil {
		return nil, err
	}
	final = s.finish
	if t.set.topicsRegex != "" && t.id.Task == 0 {
		// Best effort, beside the loop; the final step waits for it before
		// the client closes.
		ctx, cancel := context.WithTimeout(t.base, regexCheckTimeout)
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.warnTopicsNoLongerMatched(ctx)
		}()
		final = func() {
			cancel()
			<-done
			s.finish()
		}
	}
	nextFlush := time.Now().Add(t.set.flushInterval)
	for {
		if err := s.takeAsyncErr(); err != nil {
			return final, err
		}
		stopping, paused, changed := t.state()
		if stopping {
			return final, nil
		}
		if paused {
			// No Poll, no Put; the group keeps heartbeating in the
			// background and may rebalance (the callbacks flush and commit).
			s.consumer.AllowRebalance()
			timer := time.NewTimer(time.Until(nextFlush))
			select {
			case <-changed:
			case <-timer.C:
				// What was put before the pause still gets flushed.
				s.mu.Lock()
				s.flushAndCommit(nil)
				s.mu.Unlock()
				nextFlush = time.Now().Add(t.set.flushInterval)
			}
			timer.Stop()
			continue
		}
		s.mu.Lock()
		havePending := len(s.pending) > 0
		s.mu.Unlock()
		if !havePending {
			ctx, cancel := t.loopContext()
			pctx, pcancel := context.WithDeadline(ctx, nextFlush)
			fetches := s.consumer.PollRecords(pctx, maxPollRecords)
			pcancel()
			cancel()
			if fetches.IsClientClosed() {
				return final, nil
			}
			fetches.EachError(func(topic string, p int32, err error) {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
					t.log.Warn("fetch error (the client retries)", "topic", topic, "partition", p, "error", err)
				}
			})
			s.mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				s.pending = append(s.pending, sinkRecord(r))
			})
			s.mu.Unlock()
		}
		// An Open that failed in this poll's assignment callback fails the
		// task before its partitions' records reach Put (Kafka Connect never
		// puts records of partitions whose open failed).
		if err := s.takeAsyncErr(); err != nil {
			return final, err
		}
		if err := s.put(); err != nil {
			return final, err
		}
		if !time.Now().Before(nextFlush) {
			s.mu.Lock()
			s.flushAndCommit(nil)
			s.mu.Unlock()
			nextFlush = time.Now().Add(t.set.flushInterval)
		}
		s.consumer.AllowRebalance()
	}
}

func sinkRecord(r *kgo.Record) connect.SinkRecord {
	sr := connect.SinkRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
	if len(r.Headers) > 0 {
		sr.Headers = make([]connect.Header, len(r.Headers))
		for i, h := range r.Headers {
			sr.Headers[i] = connect.Header{Key: h.Key, Value: h.Value}
		}
	}
	return sr
}

func (s *sinkLoop) takeAsyncErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asyncErr
}

// put gives the pending records to Put. A Put interrupted by a pause or stop
// keeps them pending: resumed, they are put again; stopped, they were never
// flushed, so never committed, and come back after a restart.
func (s *sinkLoop) put() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return nil
	}
	if stopping, paused, _ := s.t.state(); stopping || paused {
		return nil // a pause or stop arrived during the fetch: no Put now
	}
	for _, r := range s.pending {
		s.active.use(s.t.w, s.t.id.Connector, r.Topic)
	}
	// Given, even if Put is interrupted: a task may publish part of the
	// batch and report it in Flush (the runtime puts the rest again).
	for _, r := range s.pending {
		if tp := r.TopicPartition(); r.Offset+1 > s.taken[tp] {
			s.taken[tp] = r.Offset + 1
		}
	}
	ctx, cancel := s.t.loopContext()
	defer cancel()
	err := guard("Put", func() error { return s.task.Put(ctx, s.pending) })
	if rerr := s.t.errantErr(); rerr != nil && err == nil {
		err = rerr // the task swallowed a Report that said to fail
	}
	if err != nil {
		if ctx.Err() != nil && s.t.errantErr() == nil && !isPanic(err) {
			return nil
		}
		return fmt.Errorf("Put: %w", err)
	}
	// A fresh slice for the next batch: the task may keep the one it was
	// given (Kafka Connect hands each put a new collection).
	s.pending = nil
	return nil
}

// flushAndCommit calls Flush and commits exactly the offsets it returned
// for assigned partitions (only those in only, if set). Callers hold s.mu.
// A stop cuts it short (the context given to Start, cancelled on Stop): a
// commit to a broker that stopped answering would otherwise hold the loop
// (or a rebalance callback, under s.mu) for the commit's 30 s, past the
// graceful timeout; the final flush in finish commits again, bounded.
func (s *sinkLoop) flushAndCommit(only map[connect.TopicPartition]bool) {
	s.flushAndCommitCtx(s.t.hctx, only)
}

// flushAndCommitCtx is flushAndCommit within parent (the final one is
// bounded by the rest of the graceful timeout).
func (s *sinkLoop) flushAndCommitCtx(parent context.Context, only map[connect.TopicPartition]bool) {
	t := s.t
	ctx, cancel := context.WithTimeout(parent, 30*time.Second)
	defer cancel()
	var offs map[connect.TopicPartition]int64
	err := guard("Flush", func() (err error) {
		offs, err = s.task.Flush(ctx)
		return err
	})
	if rerr := t.errantErr(); rerr != nil {
		// A Report under errors.tolerance=none (a nack that arrived after
		// Put returned) fails the task as one during Put does, also on an
		// idle topic where no Put would notice it; and nothing is
		// committed from then on, even if the task swallowed the error
		// and reported offsets past that record.
		if s.asyncErr == nil {
			s.asyncErr = fmt.Errorf("Flush: %w", rerr)
		}
		t.log.Error("a record could not be delivered under errors.tolerance=none; offsets not committed", "error", rerr)
		return
	}
	if err != nil {
		t.log.Error("Flush failed; offsets not committed", "error", err)
		switch {
		case s.asyncErr != nil: // failing already
		case isPanic(err):
			s.asyncErr = err // the task fails: the next Flush would panic too
		case ctx.Err() == nil && !s.pausedNow():
			// An error of the task's own, not the end of ctx, fails it as
			// one from Put does: Put is not called on an idle topic, so a
			// task could not fail otherwise (amqpsink giving up
			// reconnecting in the periodic Flush stayed RUNNING forever,
			// delivering nothing). Not while paused: pausing is how an
			// operator waits out the external system's maintenance, and
			// Kafka Connect fails no task on a flush error; after the
			// resume, Put or the next Flush meets the error again if it
			// lasts.
			s.asyncErr = fmt.Errorf("Flush: %w", err)
		}
		return
	}
	commit := map[string]map[int32]kgo.EpochOffset{}
	var tps []connect.TopicPartition
	for tp, off := range offs {
		if off > s.taken[tp] {
			t.log.Warn("the task's Flush returned an offset past the records it was given; committing only those", "topic", tp.Topic, "partition", tp.Partition, "offset", off, "given_up_to", s.taken[tp])
			off = s.taken[tp]
		}
		if !s.assigned[tp] || (only != nil && !only[tp]) || off <= s.committed[tp] {
			continue
		}
		if commit[tp.Topic] == nil {
			commit[tp.Topic] = map[int32]kgo.EpochOffset{}
		}
		commit[tp.Topic][tp.Partition] = kgo.EpochOffset{Epoch: -1, Offset: off}
		tps = append(tps, tp)
	}
	if len(tps) == 0 {
		return
	}
	var cerr error
	s.consumer.CommitOffsetsSync(ctx, commit, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		cerr = commitErr(resp, err)
	})
	if cerr != nil {
		t.log.Warn("committing sink offsets failed; they are committed at the next flush, or the records are delivered again", "error", cerr)
		return
	}
	for _, tp := range tps {
		s.committed[tp] = commit[tp.Topic][tp.Partition].Offset
	}
}

// pausedNow reports whether the task's target is PAUSED (not stopping).
func (s *sinkLoop) pausedNow() bool {
	stopping, paused, _ := s.t.state()
	return paused && !stopping
}

// commitErr returns the first error of an offset commit.
func commitErr(resp *kmsg.OffsetCommitResponse, err error) error {
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("%s[%d]: %w", t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}

func tpList(m map[string][]int32) []connect.TopicPartition {
	var out []connect.TopicPartition
	for topic, ps := range m {
		for _, p := range ps {
			out = append(out, connect.TopicPartition{Topic: topic, Partition: p})
		}
	}
	slices.SortFunc(out, func(a, b connect.TopicPartition) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	return out
}

func (s *sinkLoop) onAssigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	tps := tpList(m)
	if len(tps) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.Load() {
		return
	}
	for _, tp := range tps {
		s.assigned[tp] = true
		s.active.use(s.t.w, s.t.id.Connector, tp.Topic)
	}
	s.t.log.Info("partitions assigned", "partitions", len(tps))
	if s.aware != nil && !s.noFlush {
		ctx, cancel := context.WithTimeout(s.t.base, 30*time.Second)
		defer cancel()
		if err := guard("Open", func() error { return s.aware.Open(ctx, tps) }); err != nil && s.asyncErr == nil {
			s.asyncErr = fmt.Errorf("Open(%v): %w", tps, err)
		}
	}
}

// onRevoked flushes and commits the revoked partitions synchronously, then
// closes them. It also handles lost partitions (the commit then fails and
// is logged).
func (s *sinkLoop) onRevoked(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	tps := tpList(m)
	if len(tps) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone.Load() {
		return
	}
	revoked := map[connect.TopicPartition]bool{}
	for _, tp := range tps {
		revoked[tp] = true
	}
	if !s.noFlush {
		s.flushAndCommit(revoked)
	}
	if s.aware != nil {
		ctx, cancel := context.WithTimeout(s.t.base, 30*time.Second)
		if err := guard("Close", func() error { return s.aware.Close(ctx, tps) }); err != nil {
			s.t.log.Warn("Close of revoked partitions failed", "error", err)
		}
		cancel()
	}
	for _, tp := range tps {
		delete(s.assigned, tp)
		delete(s.committed, tp)
		delete(s.taken, tp)
	}
	// The new owner fetches them again from the committed offset.
	s.pending = slices.DeleteFunc(s.pending, func(r connect.SinkRecord) bool { return revoked[r.TopicPartition()] })
	s.t.log.Info("partitions revoked", "partitions", len(tps))
}

// finish flushes and commits (unless the task failed: then only what earlier
// flushes reported is committed), leaves the group (closing the partitions)
// and closes the dead letter queue producer. The flush, commit and leave
// are bounded by the rest of the graceful timeout: a group that is still
// waiting for a dead member's session to expire must not hold a stop (or a
// DELETE) beyond it.
func (s *sinkLoop) finish() {
	t := s.t
	t.mu.Lock()
	failed := t.status.State == StateFailed
	t.mu.Unlock()
	ctx, cancel := context.WithDeadline(t.base, t.finalDeadline())
	defer cancel()
	s.mu.Lock()
	if !failed {
		s.flushAndCommitCtx(ctx, nil)
	}
	s.noFlush = true
	s.mu.Unlock()
	// A loop that ended between poll and AllowRebalance would block the
	// leave's revoke callback forever.
	s.consumer.AllowRebalance()
	if err := s.consumer.LeaveGroupContext(ctx); err != nil {
		// Close below then returns at once; the group drops the member
		// when its session times out.
		t.log.Warn("leaving the consumer group did not finish within the graceful timeout; the group reassigns the partitions after the session timeout", "error", err, "session_timeout", sinkSessionTimeout)
	}
	// Close waits for the leave to end; bounded too, it finishes in the
	// background (owned by the worker's WaitGroup) and its callbacks no
	// longer touch the task, whose Stopped comes next.
	closed := make(chan struct{})
	t.w.wg.Add(1)
	go func() {
		defer t.w.wg.Done()
		defer close(closed)
		s.consumer.Close() // leaving the group revokes: onRevoked closes the partitions
	}()
	select {
	case <-closed:
	case <-ctx.Done():
		s.gone.Store(true)
		t.log.Warn("closing the consumer did not finish within the graceful timeout; it finishes in the background", "session_timeout", sinkSessionTimeout)
	}
	s.mu.Lock()
	if left := slices.Collect(maps.Keys(s.assigned)); len(left) > 0 && s.aware != nil {
		cctx, ccancel := context.WithTimeout(t.base, 30*time.Second)
		if err := guard("Close", func() error { return s.aware.Close(cctx, left) }); err != nil {
			t.log.Warn("Close of partitions failed", "error", err)
		}
		ccancel()
	}
	clear(s.assigned)
	s.mu.Unlock()
	if r, ok := t.host.Errors.(*errantReporter); ok {
		r.close()
	}
}
