package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
		add(HeaderErrExcClass, errorClass(cause))
		add(HeaderErrExcMessage, cause.Error())
		add(HeaderErrExcStackTrac, errorChain(cause))
	}
	// Not ProduceSync: while no broker answers, franz-go keeps the record
	// (retrying) even after ctx ends, so a pause or stop could not cut a
	// Report short and Put never returned (the task was abandoned). Given
	// up on, the record may still reach the topic later, or be failed by
	// the producer's Close; a Report made again after a resume or restart
	// may then add a duplicate, as for any at-least-once delivery.
	done := make(chan error, 1)
	p.Produce(ctx, kr, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("sending errant record %s[%d]@%d to the dead letter queue topic %s failed: %w; check the topic exists or can be created", rec.Topic, rec.Partition, rec.Offset, t.set.dlqTopic, err)
	}
	return nil
}

func (r *errantReporter) client(ctx context.Context) (*kgo.Client, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, errReporterClosed
	}
	if p := r.producer; p != nil {
		r.mu.Unlock()
		return p, nil
	}
	r.mu.Unlock()
	// Not under r.mu: the creation may wait for Kafka, and errantErr (which
	// the loop calls after every Put and Flush) must not wait with it.
	if err := r.ensureTopic(ctx); err != nil {
		return nil, err
	}
	t := r.t
	// No KIP-714 client metrics, as for the source producer: Close would
	// wait for a final push to a broker that may be away.
	p, err := kafka.NewClient(t.w.seeds, t.log, append([]kgo.Opt{kgo.DisableClientMetrics()}, t.w.kopts...)...)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		p.Close()
		return nil, errReporterClosed
	case r.producer != nil: // a concurrent Report made one first
		p.Close()
		return r.producer, nil
	}
	r.producer = p
	return p, nil
}

var errReporterClosed = errors.New("the task is stopping: errant record not sent to the dead letter queue")

// ensureTopic creates the dead letter queue topic. While no broker answers
// it asks again, backing off as a source's topic creation does (decision in
// source.go's ensureTopic), until ctx ends (a pause or stop cancels Put's,
// Flush's is bounded): the first errant record after a start, during a
// Kafka outage, failed the task at once (a refused dial fails the creation
// immediately), while later ones simply waited for Kafka in the produce.
func (r *errantReporter) ensureTopic(ctx context.Context) error {
	t := r.t
	creator, err := t.w.kafkaAdmin()
	if err != nil {
		return err
	}
	wait := time.Second
	for {
		cctx, cancel := context.WithTimeout(ctx, topicAttemptTimeout)
		err := creator.EnsureWith(cctx, 1, t.set.dlqRF, t.set.dlqTopic)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil, !errors.Is(err, kafka.ErrUnreachable):
			return fmt.Errorf("creating the dead letter queue topic: %w", err)
		}
		t.log.Warn("cannot create the dead letter queue topic while Kafka does not answer; retrying", "topic", t.set.dlqTopic, "retry_in", wait, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("creating the dead letter queue topic: %w", err)
		case <-time.After(wait):
		}
		wait = min(wait*2, topicRetryMax)
	}
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

// errorClass names the Go type of the error that caused err: the innermost
// of its wrapping chain (the outer ones are mostly fmt's wrappers, which say
// nothing), as Kafka names the exception's class.
func errorClass(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return fmt.Sprintf("%T", err)
		}
		err = next
	}
}

// errorChain stands in for Kafka's stack trace, which Go errors do not
// have: the error's message, then each error it wraps as "Caused by:
// <type>: <message>", the way a Java stack trace lists its causes. Errors
// that join several (errors.Join) list each, indented under their joiner.
func errorChain(err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%T: %s", err, err.Error())
	var walk func(e error, indent string)
	walk = func(e error, indent string) {
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			if c := u.Unwrap(); c != nil {
				fmt.Fprintf(&b, "\n%sCaused by: %T: %s", indent, c, c.Error())
				walk(c, indent)
			}
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				if c == nil {
					continue
				}
				fmt.Fprintf(&b, "\n%s\tCaused by: %T: %s", indent, c, c.Error())
				walk(c, indent+"\t")
			}
		}
	}
	walk(err, "")
	return b.String()
}
