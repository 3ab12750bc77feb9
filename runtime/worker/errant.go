package worker

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/kafka"
)

// Dead letter queue context headers, named as Kafka Connect names them.
const (
	HeaderErrTopic        = "__connect.errors.topic"
	HeaderErrPartition    = "__connect.errors.partition"
	HeaderErrOffset       = "__connect.errors.offset"
	HeaderErrConnector    = "__connect.errors.connector.name"
	HeaderErrTask         = "__connect.errors.task.id"
	HeaderErrStage        = "__connect.errors.stage"
	HeaderErrClass        = "__connect.errors.class.name"
	HeaderErrExcClass     = "__connect.errors.exception.class.name"
	HeaderErrExcMessage   = "__connect.errors.exception.message"
	HeaderErrExcStackTrac = "__connect.errors.exception.stacktrace"
)

// errantReporter is a sink task's connect.ErrantRecordReporter.
type errantReporter struct {
	t *taskInstance

	mu       sync.Mutex
	producer *kgo.Client
	failErr  error // a Report that said "fail": the worker fails the task
	closed   bool
}

func (t *taskInstance) errantErr() error {
	r, ok := t.host.Errors.(*errantReporter)
	if !ok {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failErr
}

// Report implements connect.ErrantRecordReporter: with errors.tolerance=none
// it returns an error (and the task fails even if it ignores it); with all
// it sends the record to the dead letter queue topic, if one is set, and
// returns nil.
func (r *errantReporter) Report(ctx context.Context, rec connect.SinkRecord, cause error) error {
	t := r.t
	if !t.set.tolerateAll {
		err := fmt.Errorf("record %s[%d]@%d could not be delivered and errors.tolerance is none: %w", rec.Topic, rec.Partition, rec.Offset, cause)
		r.mu.Lock()
		if r.failErr == nil {
			r.failErr = err
		}
		r.mu.Unlock()
		return err
	}
	t.log.Warn("errant record tolerated", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "error", cause, "dead_letter_queue", t.set.dlqTopic)
	if t.set.dlqTopic == "" {
		return nil
	}
	p, err := r.client(ctx)
	if err != nil {
		return err
	}
	kr := &kgo.Record{Topic: t.set.dlqTopic, Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp}
	for _, h := range rec.Headers {
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if t.set.dlqHeaders {
		add := func(k, v string) { kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
		add(HeaderErrTopic, rec.Topic)
		add(HeaderErrPartition, strconv.Itoa(int(rec.Partition)))
		add(HeaderErrOffset, strconv.FormatInt(rec.Offset, 10))
		add(HeaderErrConnector, t.id.Connector)
		add(HeaderErrTask, strconv.Itoa(t.id.Task))
		add(HeaderErrStage, "TASK_PUT")
		add(HeaderErrClass, t.class)
		add(HeaderErrExcClass, fmt.Sprintf("%T", cause))
		add(HeaderErrExcMessage, cause.Error())
		add(HeaderErrExcStackTrac, cause.Error())
	}
	if err := p.ProduceSync(ctx, kr).FirstErr(); err != nil {
		return fmt.Errorf("sending errant record %s[%d]@%d to the dead letter queue topic %s failed: %w; check the topic exists or can be created", rec.Topic, rec.Partition, rec.Offset, t.set.dlqTopic, err)
	}
	return nil
}

func (r *errantReporter) client(ctx context.Context) (*kgo.Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("the task is stopping: errant record not sent to the dead letter queue")
	}
	if r.producer != nil {
		return r.producer, nil
	}
	t := r.t
	creator, err := t.w.kafkaAdmin()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := creator.EnsureWith(cctx, 1, t.set.dlqRF, t.set.dlqTopic); err != nil {
		return nil, fmt.Errorf("creating the dead letter queue topic: %w", err)
	}
	p, err := kafka.NewClient(t.w.seeds, t.log, t.w.kopts...)
	if err != nil {
		return nil, err
	}
	r.producer = p
	return p, nil
}

func (r *errantReporter) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.producer != nil {
		r.producer.Close()
		r.producer = nil
	}
}
