package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/kafka"
)

// pending is one produced record waiting for its acknowledgement.
type pending struct {
	rec  connect.SourceRecord
	pkey string // the source partition, as JSON
	done bool   // set under sourceLoop.mu by the produce callback
	err  error
	// part is the Kafka partition the record went to, set by the
	// callback (-1 if unknown: the record failed before partitioning).
	part int32
}

// sourceLoop is the state of one source task's loop. Only the task
// goroutine touches it, except the produce callbacks, which set
// pending.done/err under mu and wake the loop through acked.
type sourceLoop struct {
	t        *taskInstance
	task     connect.SourceTask
	producer *kgo.Client
	creator  *kafka.TopicCreator
	known    map[string]bool // topics known to exist
	active   activeTopics

	mu    sync.Mutex
	acked chan struct{} // capacity 1: "some callback ran"
	// callbacks counts produce callbacks still to run: franz-go runs them
	// on a goroutine of its own, which Close does not wait for. drained,
	// when set (under mu), is closed by the callback that ends the count.
	callbacks atomic.Int64
	drained   chan struct{}

	queue  []*pending            // Poll order, not yet committed
	byPart map[string][]*pending // per source partition, not yet folded into offsets

	// The offsets are written by a flusher goroutine, so an idle Poll does
	// not hold them back.
	offMu    sync.Mutex
	offsets  map[string]SourceOffset
	dirty    map[string]bool // offsets not yet written to the store
	putMu    sync.Mutex      // one store write at a time
	lastMap  map[string]any  // the last source partition map (kept alive so its address is not reused)
	lastKey  string
	firstErr error
	wake     bool // an ack was seen by a wait: scan even if acked is empty

	// A Poll that blocks while records are in flight is interrupted (its
	// context cancelled) once an ack arrives and it has run for
	// commitInterruptAfter, so Commit is not held back by an idle source.
	pollCancel   context.CancelFunc // under mu
	pollStart    time.Time          // under mu
	ackSincePoll bool               // under mu
}

// commitTimeout bounds one Commit call.
const commitTimeout = 30 * time.Second

// commitInterruptAfter is how long a Poll may block while acknowledged
// records wait for their Commit.
const commitInterruptAfter = 50 * time.Millisecond

// sourcePartitioner sends a record with Partition >= 0 to that partition
// and partitions the rest by key (Kafka's default sticky-key partitioner).
type sourcePartitioner struct{ def kgo.Partitioner }

func (p sourcePartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return &sourceTopicPartitioner{p.def.ForTopic(topic)}
}

type sourceTopicPartitioner struct{ def kgo.TopicPartitioner }

func (p *sourceTopicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return r.Partition >= 0 || p.def.RequiresConsistency(r)
}

func (p *sourceTopicPartitioner) Partition(r *kgo.Record, n int) int {
	if r.Partition >= 0 {
		return int(r.Partition)
	}
	return p.def.Partition(r, n)
}

func (p *sourceTopicPartitioner) OnNewBatch() {
	if nb, ok := p.def.(kgo.TopicPartitionerOnNewBatch); ok {
		nb.OnNewBatch()
	}
}

// producerOpts are the source producer's options: idempotent with acks=all
// (franz-go's defaults), our partitioner, and no buffer limit of
// franz-go's: the loop bounds what is in flight before it polls, and a
// full buffer would block Produce where a stop is not seen (one Poll batch
// can be larger than any fixed room).
func (w *Worker) producerOpts() []kgo.Opt {
	return append([]kgo.Opt{
		kgo.RecordPartitioner(sourcePartitioner{kgo.StickyKeyPartitioner(nil)}),
		kgo.MaxBufferedRecords(math.MaxInt32),
		kgo.ProducerLinger(5 * time.Millisecond),
		// No KIP-714 client metrics: Close waits up to 1 s for a final
		// metrics push, which a broker that is away never answers, and
		// the final phase leaves only 1/10 of the graceful timeout for
		// Close (finalDeadline): every stop during an outage was abandoned.
		kgo.DisableClientMetrics(),
	}, w.kopts...)
}

func (t *taskInstance) runSource(task connect.SourceTask) (final func(), err error) {
	creator, err := t.w.kafkaAdmin()
	if err != nil {
		return nil, err
	}
	producer, err := kafka.NewClient(t.w.seeds, t.log, t.w.producerOpts()...)
	if err != nil {
		return nil, err
	}
	s := &sourceLoop{
		t: t, task: task, producer: producer, creator: creator, known: map[string]bool{},
		acked: make(chan struct{}, 1), byPart: map[string][]*pending{},
		offsets: map[string]SourceOffset{}, dirty: map[string]bool{},
	}
	flushCtx, stopFlusher := context.WithCancel(context.Background())
	flusherDone := make(chan struct{})
	go func() {
		defer close(flusherDone)
		tick := time.NewTicker(t.set.flushInterval)
		defer tick.Stop()
		for {
			select {
			case <-flushCtx.Done():
				return
			case <-tick.C:
				s.writeOffsets()
			}
		}
	}()
	final = func() {
		stopFlusher()
		<-flusherDone
		s.finish()
	}
	var idle *time.Timer
	defer func() {
		if idle != nil {
			idle.Stop()
		}
	}()
	for {
		if err := s.processAcks(); err != nil {
			return final, err
		}
		stopping, paused, changed := t.state()
		if stopping {
			return final, nil
		}
		if paused || len(s.queue) >= t.w.maxInFlight {
			// Acks keep coming (and Commit keeps being called) while Poll
			// waits: backpressure or pause.
			select {
			case <-changed:
			case <-s.acked:
				s.wake = true
			}
			continue
		}
		ctx, cancel := t.loopContext()
		var interrupt *time.Timer
		if len(s.queue) > 0 {
			s.mu.Lock()
			// An ack signalled since processAcks ran counts too: its callback
			// will not come again.
			s.pollCancel, s.pollStart, s.ackSincePoll = cancel, time.Now(), len(s.acked) > 0
			s.mu.Unlock()
			interrupt = time.AfterFunc(commitInterruptAfter, func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				if s.pollCancel != nil && s.ackSincePoll {
					s.pollCancel()
					s.pollCancel = nil
				}
			})
		}
		var recs []connect.SourceRecord
		err := guard("Poll", func() (err error) {
			recs, err = task.Poll(ctx)
			return err
		})
		cancelled := ctx.Err() != nil && !isPanic(err)
		if interrupt != nil {
			interrupt.Stop()
			s.mu.Lock()
			s.pollCancel = nil
			s.mu.Unlock()
		}
		cancel()
		if err != nil {
			if cancelled {
				continue // pause or stop interrupted Poll: not a failure
			}
			return final, fmt.Errorf("Poll: %w", err)
		}
		if stopping, _, _ := t.state(); stopping {
			// Not produced, so never committed: the task delivers them
			// again after a restart.
			continue
		}
		if len(recs) == 0 {
			// Nothing yet: give the task a moment rather than spin.
			if idle == nil {
				idle = time.NewTimer(10 * time.Millisecond)
			} else {
				idle.Reset(10 * time.Millisecond)
			}
			select {
			case <-idle.C:
			case <-changed:
			}
			continue
		}
		if err := s.produce(recs); err != nil {
			if errors.Is(err, errStopping) {
				continue
			}
			return final, err
		}
	}
}

func (s *sourceLoop) partitionKey(m map[string]any) (string, error) {
	if m == nil {
		return "null", nil
	}
	// Tasks usually reuse one map per source partition: skip re-encoding.
	// Like record bytes, a map handed over by Poll must not be mutated.
	if s.lastMap != nil && reflect.ValueOf(m).Pointer() == reflect.ValueOf(s.lastMap).Pointer() {
		return s.lastKey, nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("source partition %v is not JSON-encodable: %w", m, err)
	}
	s.lastMap, s.lastKey = m, string(b)
	return s.lastKey, nil
}

func (s *sourceLoop) produce(recs []connect.SourceRecord) error {
	t := s.t
	// One allocation per batch for the bookkeeping and the Kafka records.
	ps := make([]pending, len(recs))
	krs := make([]kgo.Record, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.Topic == "" {
			return fmt.Errorf("Poll returned a record without a topic (source partition %v): the connector must set SourceRecord.Topic", r.SourcePartition)
		}
		if !s.known[r.Topic] {
			if err := s.ensureTopic(r.Topic); err != nil {
				return err
			}
			s.known[r.Topic] = true
		}
		s.active.use(t.w, t.id.Connector, r.Topic)
		key, err := s.partitionKey(r.SourcePartition)
		if err != nil {
			return err
		}
		p := &ps[i]
		p.rec, p.pkey = *r, key
		s.queue = append(s.queue, p)
		s.byPart[key] = append(s.byPart[key], p)
		kr := &krs[i]
		kr.Topic, kr.Partition, kr.Key, kr.Value, kr.Timestamp = r.Topic, r.Partition, r.Key, r.Value, r.Timestamp
		if len(r.Headers) > 0 {
			kr.Headers = make([]kgo.RecordHeader, len(r.Headers))
			for j, h := range r.Headers {
				kr.Headers[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
			}
		}
		// Not the loop context: a pause must not fail buffered records.
		s.callbacks.Add(1)
		s.producer.Produce(context.Background(), kr, func(r *kgo.Record, err error) {
			s.mu.Lock()
			p.part = r.Partition
			if s.callbacks.Add(-1) == 0 && s.drained != nil {
				close(s.drained)
				s.drained = nil
			}
			p.done, p.err = true, err
			if s.pollCancel != nil {
				s.ackSincePoll = true
				if time.Since(s.pollStart) >= commitInterruptAfter {
					s.pollCancel()
					s.pollCancel = nil
				}
			}
			// Signalled under mu, so the Poll set-up above sees it.
			select {
			case s.acked <- struct{}{}:
			default:
			}
			s.mu.Unlock()
		})
	}
	return nil
}

// processAcks commits the acknowledged prefix of the queue (Poll order) and
// advances each source partition's offset over its acknowledged prefix.
func (s *sourceLoop) processAcks() error { return s.commitAcked(false) }

// ensureTopic creates topic if it is missing. While no broker answers it
// asks again, backing off up to topicRetryMax, as Kafka Connect retries a
// retriable topic creation: the first record of a topic (every topic,
// after a restart) arriving during a Kafka outage failed the task, while
// records of topics already known simply waited for Kafka. A stop cuts it
// short (the records not produced are sent again after a restart); a
// refusal of the topic's settings fails the task at once.
func (s *sourceLoop) ensureTopic(topic string) error {
	t := s.t
	wait := time.Second
	for {
		ctx, cancel := context.WithTimeout(t.hctx, topicAttemptTimeout)
		err := s.creator.EnsureWith(ctx, t.set.createPartitions, t.set.createReplication, topic)
		cancel()
		switch {
		case err == nil:
			return nil
		case t.hctx.Err() != nil:
			return errStopping
		case !errors.Is(err, kafka.ErrUnreachable):
			return err
		}
		t.log.Warn("cannot create the topic while Kafka does not answer; retrying", "topic", topic, "retry_in", wait, "error", err)
		// The records already acknowledged (other topics) are committed
		// meanwhile, as while Poll blocks: the retries may last as long as
		// the outage.
		timer := time.NewTimer(wait)
		for waiting := true; waiting; {
			select {
			case <-t.hctx.Done():
				timer.Stop()
				return errStopping
			case <-timer.C:
				waiting = false
			case <-s.acked:
				s.wake = true
				if err := s.processAcks(); err != nil {
					timer.Stop()
					return err
				}
			}
		}
		wait = min(wait*2, topicRetryMax)
	}
}

// topicRetryMax bounds the wait between two attempts of ensureTopic.
const topicRetryMax = 10 * time.Second

// topicAttemptTimeout bounds one attempt of ensureTopic (a variable for
// tests).
var topicAttemptTimeout = 30 * time.Second

// commitAcked is processAcks; with final (the loop has ended and the
// producer is closed or flushed) it commits every acknowledged record, in
// Poll order, even past one that failed on another Kafka partition: a
// record Kafka holds must reach Commit (a consume-and-delete source would
// otherwise send it again), unless it is behind a refused or unacknowledged
// record of its own partition.
// Offsets still only advance over each partition's acknowledged prefix.
func (s *sourceLoop) commitAcked(final bool) error {
	select {
	case <-s.acked:
	default:
		if !s.wake && !final {
			return nil
		}
	}
	s.wake = false
	s.mu.Lock()
	n := 0
	for n < len(s.queue) && s.queue[n].done {
		if err := s.queue[n].err; err != nil && s.firstErr == nil {
			s.firstErr = err
		}
		if s.queue[n].err != nil {
			break
		}
		n++
	}
	var extra []connect.SourceRecord // final: acknowledged records past the prefix
	if final {
		// Not past a record that failed (or is unacknowledged) on the same
		// Kafka partition: that one is sent again after a restart, and a
		// consume-and-delete source that deleted a later change of the same
		// key would then deliver the changes out of order (the older one
		// last). Other partitions are acked independently. Unknown
		// partition: the whole topic is held back.
		type tp struct {
			topic string
			part  int32
		}
		held := map[tp]bool{}
		isHeld := func(p *pending) bool {
			return held[tp{p.rec.Topic, -1}] || held[tp{p.rec.Topic, p.part}]
		}
		kept := s.queue[:n:n]
		for _, p := range s.queue[n:] {
			if p.done && p.err == nil && !isHeld(p) {
				extra = append(extra, p.rec)
				continue
			}
			if !p.done || p.err != nil {
				part := p.part
				if !p.done {
					part = p.rec.Partition // the callback has not said
				}
				held[tp{p.rec.Topic, part}] = true
			}
			kept = append(kept, p)
		}
		if len(extra) > 0 {
			// The committed prefix plus the unacknowledged rest stay in
			// order; the extra records are committed after the prefix.
			s.queue = kept
		}
	}
	for key, ps := range s.byPart {
		m := 0
		for m < len(ps) && ps[m].done && ps[m].err == nil {
			m++
		}
		if m > 0 {
			last := ps[m-1].rec
			s.offMu.Lock()
			s.offsets[key] = SourceOffset{Partition: last.SourcePartition, Offset: last.SourceOffset}
			s.dirty[key] = true
			s.offMu.Unlock()
			if m == len(ps) {
				delete(s.byPart, key)
			} else {
				s.byPart[key] = ps[m:]
			}
		}
	}
	s.mu.Unlock()
	if n > 0 || len(extra) > 0 {
		acked := make([]connect.SourceRecord, n, n+len(extra))
		for i, p := range s.queue[:n] {
			acked[i] = p.rec
		}
		acked = append(acked, extra...)
		clear(s.queue[:n])
		s.queue = s.queue[n:]
		// Never the loop's context: a stop or pause must not cancel the
		// confirmation of records that are already in Kafka.
		ctx, cancel := context.WithTimeout(s.t.base, commitTimeout)
		err := guard("Commit", func() error { return s.task.Commit(ctx, acked) })
		cancel()
		if err != nil {
			// Kafka Connect logs and carries on: the records are in Kafka.
			s.t.log.Warn("source task Commit failed; the task may deliver these records again after a restart", "error", err, "records", len(acked))
		}
	}
	if s.firstErr != nil && errors.Is(s.firstErr, kerr.MessageTooLarge) {
		// A restart meets the same record: say what lets it through.
		return fmt.Errorf("producing to Kafka failed: %w: a record is larger than the producer or the topic accepts; raise the worker's limit (tidyconnect standalone --max-message-bytes; topics it creates get that max.message.bytes) and, for a topic that exists already, its max.message.bytes (kafka-configs --alter --entity-type topics --add-config max.message.bytes=...), then restart the task; records from this one on are not committed and will be delivered again", s.firstErr)
	}
	if s.firstErr != nil && !errors.Is(s.firstErr, kgo.ErrClientClosed) {
		return fmt.Errorf("producing to Kafka failed: %w; records from this one on are not committed and will be delivered again after a restart", s.firstErr)
	}
	return nil
}

// writeOffsets writes the offsets acknowledged since the last write.
func (s *sourceLoop) writeOffsets() {
	s.putMu.Lock()
	defer s.putMu.Unlock()
	s.offMu.Lock()
	if len(s.dirty) == 0 {
		s.offMu.Unlock()
		return
	}
	keys := make([]string, 0, len(s.dirty))
	batch := make([]SourceOffset, 0, len(s.dirty))
	for key := range s.dirty {
		keys = append(keys, key)
		batch = append(batch, s.offsets[key])
	}
	clear(s.dirty)
	s.offMu.Unlock()
	ctx, cancel := context.WithTimeout(s.t.base, 30*time.Second)
	defer cancel()
	if err := s.t.w.offsets.Put(ctx, s.t.id.Connector, batch); err != nil {
		// Marked dirty again: the next flush retries.
		s.offMu.Lock()
		for _, k := range keys {
			s.dirty[k] = true
		}
		s.offMu.Unlock()
		s.t.log.Error("writing source offsets failed; will retry at the next flush", "error", err, "partitions", len(batch))
	}
}

// finish waits (within the rest of the graceful timeout) for in-flight
// records, commits every acknowledged one, writes the offsets and closes
// the producer. Commit gets its own bound (not the exhausted grace): a
// consume-and-delete source confirms there what Kafka already holds.
func (s *sourceLoop) finish() {
	t := s.t
	ctx, cancel := context.WithDeadline(context.Background(), t.finalDeadline())
	err := s.producer.Flush(ctx)
	cancel()
	s.mu.Lock()
	inFlight := 0
	for _, p := range s.queue {
		if !p.done {
			inFlight++
		}
	}
	s.mu.Unlock()
	if err != nil {
		t.log.Warn("in-flight records were not acknowledged within the graceful timeout; they will be delivered again after a restart", "in_flight", inFlight, "error", err)
	}
	// Commit what is acknowledged before Close fails the rest, then once
	// more for acks that raced the close, once their callbacks have run:
	// Close fails what is still buffered (never committed) but does not
	// wait for the callbacks, and a record Kafka holds must reach Commit.
	s.mu.Lock()
	failed := s.firstErr != nil // the loop failed on it, and said so
	s.mu.Unlock()
	_ = s.commitAcked(true)
	s.producer.Close()
	s.awaitCallbacks(callbacksAfterClose)
	_ = s.commitAcked(true)
	if !failed {
		s.logRefused()
	}
	s.writeOffsets()
}

// callbacksAfterClose bounds the wait for produce callbacks after Close,
// which fails the records still buffered at once.
const callbacksAfterClose = 5 * time.Second

// errStopping ends produce when a stop cut it short.
var errStopping = errors.New("stopping")

// logRefused reports the records Kafka refused while the task stopped
// (not those Close failed): not committed, so sent again after a restart,
// where they will fail again.
func (s *sourceLoop) logRefused() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.queue {
		if p.done && p.err != nil && !errors.Is(p.err, kgo.ErrClientClosed) {
			s.t.log.Error("a record was refused by Kafka while the task stopped; it is not committed and will be sent again after a restart",
				"topic", p.rec.Topic, "error", p.err)
		}
	}
}

// awaitCallbacks waits, at most d, until every produce callback has run.
func (s *sourceLoop) awaitCallbacks(d time.Duration) {
	s.mu.Lock()
	if s.callbacks.Load() == 0 {
		s.mu.Unlock()
		return
	}
	drained := make(chan struct{})
	s.drained = drained
	s.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
		s.t.log.Warn("produce callbacks still outstanding after the producer closed; their records are sent again after a restart", "outstanding", s.callbacks.Load())
	}
}
