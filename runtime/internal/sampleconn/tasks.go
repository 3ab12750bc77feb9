package sampleconn

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// SourceTask emits synthetic records. Each of its source partitions
// {"task": "<n>", "partition": "<p>"} carries offset {"position": <i>}, the
// position of the last record; after a restart it continues after the offset
// Host.Offsets returns.
type SourceTask struct {
	baseTask
	topic      string
	count      int64
	batch      int
	rate       int
	valueSize  int
	partitions []map[string]any
	next       []int64 // next position per source partition
	turn       int
	last       time.Time
}

func (t *SourceTask) Start(ctx context.Context, cfg connect.Config) error {
	def := SourceConfigDef()
	if err := t.startTask(ctx, def, cfg); err != nil {
		return err
	}
	cfg = def.WithDefaults(cfg)
	t.topic = cfg.String(KeyTopic)
	c, _ := cfg.Int(KeyCount, 100)
	t.count = int64(c)
	t.batch, _ = cfg.Int(KeyBatch, 10)
	t.rate, _ = cfg.Int(KeyRate, 0)
	t.valueSize, _ = cfg.Int(KeyValueSize, 0)
	n, _ := cfg.Int(KeyPartitions, 1)
	for p := range n {
		sp := map[string]any{"task": strconv.Itoa(t.host.Task), "partition": strconv.Itoa(p)}
		t.partitions = append(t.partitions, sp)
		var next int64
		if t.host.Offsets != nil {
			off, err := t.host.Offsets.Offset(ctx, sp)
			if err != nil {
				return fmt.Errorf("%s: reading offset of %v: %w", t.instance, sp, err)
			}
			if pos, ok := position(off); ok {
				next = pos + 1
			}
		}
		t.next = append(t.next, next)
	}
	return nil
}

// position reads "position" from an offset map, whatever number type JSON
// decoding gave it.
func position(off map[string]any) (int64, bool) {
	switch v := off["position"].(type) {
	case int64:
		return v, true
	case int:
		return int64(v), true
	case float64:
		return int64(v), true
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	}
	return 0, false
}

// Position reads the position of a sample source offset.
func Position(off map[string]any) (int64, bool) { return position(off) }

func (t *SourceTask) Poll(ctx context.Context) ([]connect.SourceRecord, error) {
	t.maybePanic("Poll")
	if err := t.maybeFailOrBlock(ctx, "Poll"); err != nil {
		t.rec.record(t.instance, "Poll", err)
		return nil, err
	}
	n := t.batch
	if t.rate > 0 {
		// Pace to the rate: wait until the batch's time slot.
		if !t.last.IsZero() {
			wait := time.Until(t.last.Add(time.Duration(n) * time.Second / time.Duration(t.rate)))
			if wait > 0 {
				timer := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					timer.Stop()
					return nil, ctx.Err()
				case <-timer.C:
				}
			}
		}
		t.last = time.Now()
	}
	if k := t.knobs; k.applies(t.host.Task) && k.failAfter >= 0 && t.seen+n > k.failAfter {
		n = k.failAfter - t.seen // stop exactly at the failure point
	}
	if k := t.knobs; k.applies(t.host.Task) && k.block != BlockNone && t.seen+n > k.blockAfter && t.seen < k.blockAfter {
		n = k.blockAfter - t.seen
	}
	var out []connect.SourceRecord
	for range len(t.partitions) {
		p := t.turn % len(t.partitions)
		t.turn++
		for len(out) < n && (t.count < 0 || t.next[p] < t.count) {
			out = append(out, t.makeRecord(p))
		}
		if len(out) >= n {
			break
		}
	}
	if len(out) == 0 {
		// Everything emitted: wait for the end rather than spin.
		<-ctx.Done()
		return nil, ctx.Err()
	}
	t.seen += len(out)
	t.rec.record(t.instance, fmt.Sprintf("Poll(%d)", len(out)), nil)
	return out, nil
}

func (t *SourceTask) makeRecord(p int) connect.SourceRecord {
	pos := t.next[p]
	t.next[p]++
	var value []byte
	text := fmt.Sprintf("%s task %d partition %d position %d", t.host.Connector, t.host.Task, p, pos)
	if t.valueSize > 0 {
		value = make([]byte, t.valueSize)
		copy(value, text)
	} else {
		value = []byte(text)
	}
	return connect.SourceRecord{
		SourcePartition: t.partitions[p],
		SourceOffset:    map[string]any{"position": pos},
		Topic:           t.topic,
		Partition:       -1,
		Key:             []byte(fmt.Sprintf("%d-%d-%d", t.host.Task, p, pos)),
		Value:           value,
		Headers:         []connect.Header{{Key: "sample", Value: []byte("yes")}},
		Timestamp:       time.Now(),
	}
}

func (t *SourceTask) Commit(_ context.Context, acked []connect.SourceRecord) error {
	t.maybePanic("Commit")
	t.rec.addCommitted(t.host.Connector, acked)
	t.rec.record(t.instance, fmt.Sprintf("Commit(%d)", len(acked)), nil)
	return nil
}

func (t *SourceTask) Stop(deleted bool) { t.stop(deleted) }

func (t *SourceTask) Stopped(ctx context.Context) error { return t.stopped(ctx) }

// SinkTask keeps every record Put gives it in the Recorder; Flush reports
// the next offset after the records it has (limited by sample.flush.upto).
type SinkTask struct {
	baseTask
	errant     []byte
	upTo       int64
	ahead      int64
	have       map[connect.TopicPartition]int64
	blockFlush bool
	failOpen   bool
}

func (t *SinkTask) Start(ctx context.Context, cfg connect.Config) error {
	def := SinkConfigDef()
	if err := t.startTask(ctx, def, cfg); err != nil {
		return err
	}
	cfg = def.WithDefaults(cfg)
	u, _ := cfg.Int(KeyFlushUpTo, -1)
	t.upTo = int64(u)
	a, _ := cfg.Int(KeyFlushAhead, 0)
	t.ahead = int64(a)
	t.blockFlush, _ = cfg.Bool(KeyBlockFlush, false)
	t.failOpen, _ = cfg.Bool(KeyFailOpen, false)
	if v, ok := cfg[KeyErrant]; ok && v != "" {
		t.errant = []byte(v)
	}
	t.have = map[connect.TopicPartition]int64{}
	return nil
}

func (t *SinkTask) Put(ctx context.Context, records []connect.SinkRecord) error {
	t.maybePanic("Put")
	if err := t.maybeFailOrBlock(ctx, "Put"); err != nil {
		t.rec.record(t.instance, fmt.Sprintf("Put(%d)", len(records)), err)
		return err
	}
	t.seen += len(records)
	kept := records
	if t.errant != nil {
		kept = nil
		for _, r := range records {
			if string(r.Value) != string(t.errant) {
				kept = append(kept, r)
				continue
			}
			if t.host.Errors == nil {
				return fmt.Errorf("%s: errant record but the host has no ErrantRecordReporter", t.instance)
			}
			if err := t.host.Errors.Report(ctx, r, fmt.Errorf("sample: value %q is errant", r.Value)); err != nil {
				t.rec.record(t.instance, fmt.Sprintf("Put(%d)", len(records)), err)
				return err
			}
			t.rec.record(t.instance, fmt.Sprintf("Report(%d)", r.Offset), nil)
		}
	}
	t.rec.addSunk(t.host.Connector, kept)
	for _, r := range records {
		tp := r.TopicPartition()
		if r.Offset+1 > t.have[tp] {
			t.have[tp] = r.Offset + 1
		}
	}
	t.rec.record(t.instance, fmt.Sprintf("Put(%d)", len(records)), nil)
	return nil
}

func (t *SinkTask) Flush(context.Context) (map[connect.TopicPartition]int64, error) {
	t.maybePanic("Flush")
	t.mu.Lock()
	stopped := t.stopCalled
	t.mu.Unlock()
	if t.blockFlush && stopped {
		t.rec.record(t.instance, "Flush blocking", nil)
		<-t.rec.releaseCh()
	}
	out := make(map[connect.TopicPartition]int64, len(t.have))
	for tp, next := range t.have {
		if t.upTo >= 0 && next > t.upTo {
			next = t.upTo
		}
		if next > 0 {
			out[tp] = next + t.ahead
		}
	}
	t.rec.record(t.instance, "Flush", nil)
	return out, nil
}

// Open and Close make the sample sink connect.PartitionAware.
func (t *SinkTask) Open(_ context.Context, tps []connect.TopicPartition) error {
	if t.failOpen && t.knobs.applies(t.host.Task) {
		err := fmt.Errorf("%s: Open failed as %s asked", t.instance, KeyFailOpen)
		t.rec.record(t.instance, fmt.Sprintf("Open(%d)", len(tps)), err)
		return err
	}
	t.rec.record(t.instance, fmt.Sprintf("Open(%d)", len(tps)), nil)
	return nil
}

func (t *SinkTask) Close(_ context.Context, tps []connect.TopicPartition) error {
	for _, tp := range tps {
		delete(t.have, tp)
	}
	t.rec.record(t.instance, fmt.Sprintf("Close(%d)", len(tps)), nil)
	return nil
}

func (t *SinkTask) Stop(deleted bool) { t.stop(deleted) }

func (t *SinkTask) Stopped(ctx context.Context) error { return t.stopped(ctx) }

var (
	_ connect.SourceTask     = (*SourceTask)(nil)
	_ connect.SinkTask       = (*SinkTask)(nil)
	_ connect.PartitionAware = (*SinkTask)(nil)
)
