package worker

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/kafka"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
)

// benchCounter counts what the benchmark tasks saw.
type benchCounter struct{ n atomic.Int64 }

type benchConnector struct{ typ connect.ConnectorType }

func (c benchConnector) Spec() connect.Spec                        { return connect.Spec{Type: c.typ} }
func (benchConnector) Start(context.Context, connect.Config) error { return nil }
func (benchConnector) TaskConfigs(n int) ([]connect.Config, error) {
	return make([]connect.Config, n), nil
}
func (benchConnector) Stop(bool)                              {}
func (benchConnector) Stopped(context.Context) error          { return nil }
func (benchTask) Start(context.Context, connect.Config) error { return nil }
func (benchTask) Stop(bool)                                   {}
func (benchTask) Stopped(context.Context) error               { return nil }
func (t *benchSink) Put(_ context.Context, r []connect.SinkRecord) error {
	t.c.n.Add(int64(len(r)))
	return nil
}
func (t *benchSink) Flush(context.Context) (map[connect.TopicPartition]int64, error) {
	return nil, nil
}

type benchTask struct{}

// benchSource emits 200-byte values in batches of 1000 from one source
// partition, without end.
type benchSource struct {
	benchTask
	c     *benchCounter
	topic string
	pos   int64
	part  map[string]any
	value []byte
}

func (t *benchSource) Poll(context.Context) ([]connect.SourceRecord, error) {
	out := make([]connect.SourceRecord, 1000)
	for i := range out {
		t.pos++
		out[i] = connect.SourceRecord{SourcePartition: t.part, SourceOffset: map[string]any{"pos": t.pos}, Topic: t.topic, Partition: -1, Value: t.value}
	}
	return out, nil
}

func (t *benchSource) Commit(_ context.Context, acked []connect.SourceRecord) error {
	t.c.n.Add(int64(len(acked)))
	return nil
}

type benchSink struct {
	benchTask
	c *benchCounter
}

func benchWorker(b *testing.B, brokers []string, c *benchCounter, topic string) *Worker {
	reg, err := plugins.New(
		connect.Plugin{Class: "bench-source", NewConnector: func() connect.Connector { return benchConnector{connect.TypeSource} },
			NewTask: func() connect.Task {
				return &benchSource{c: c, topic: topic, part: map[string]any{"p": "0"}, value: make([]byte, 200)}
			}},
		connect.Plugin{Class: "bench-sink", NewConnector: func() connect.Connector { return benchConnector{connect.TypeSink} },
			NewTask: func() connect.Task { return &benchSink{c: c} }},
	)
	if err != nil {
		b.Fatal(err)
	}
	w, err := New(WithPlugins(reg), WithOffsetStore(NewMemoryOffsetStore()), WithKafka(brokers),
		WithLogger(slog.New(slog.DiscardHandler)), WithTopicCreation(1, -1))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Close(ctx)
	})
	return w
}

func awaitCount(b *testing.B, c *benchCounter, n int64) {
	deadline := time.Now().Add(10 * time.Minute)
	for c.n.Load() < n {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d records after 10 minutes", c.n.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func embeddedBrokers(b *testing.B) []string {
	e, err := kafka.StartEmbedded(context.Background(), b.TempDir(), "127.0.0.1:0", kafka.WithEmbeddedLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	return e.Addrs()
}

// BenchmarkSourceThroughput measures Poll -> produce -> ack -> Commit with
// 200-byte values: against the embedded broker (kfake persisting to a data
// dir) and against kfake discarding what it receives (the worker and
// franz-go without broker storage). One op is one record.
func BenchmarkSourceThroughput(b *testing.B) {
	cases := []struct {
		name    string
		brokers func(b *testing.B) []string
	}{
		{"embedded", embeddedBrokers},
		{"blackhole", func(b *testing.B) []string { return testenv.KafkaBrokers(b, kfake.BlackholeProduce()) }},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			var c benchCounter
			topic := testenv.Unique("bench-src-")
			w := benchWorker(b, bc.brokers(b), &c, topic)
			cfg := connect.Config{KeyName: "bench-src", KeyConnectorClass: "bench-source"}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			if err := w.StartTask(context.Background(), TaskRun{ID: TaskID{Connector: "bench-src"}, ConnectorConfig: cfg, TaskConfig: connect.Config{}, Target: TargetRunning}); err != nil {
				b.Fatal(err)
			}
			awaitCount(b, &c, int64(b.N))
			el := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(c.n.Load())/el.Seconds(), "records/s")
		})
	}
}

// BenchmarkSinkThroughput measures consume -> Put (no-op) with 200-byte
// values: records pre-produced to the embedded broker, and kfake serving a
// canned batch (no broker storage). One op is one record.
func BenchmarkSinkThroughput(b *testing.B) {
	b.Run("embedded", func(b *testing.B) {
		brokers := embeddedBrokers(b)
		topic := testenv.Unique("bench-sink-")
		preProduce(b, brokers, topic, b.N)
		runSinkBench(b, brokers, topic)
	})
	b.Run("synthetic", func(b *testing.B) {
		topic := testenv.Unique("bench-sink-")
		brokers := testenv.KafkaBrokers(b, kfake.SyntheticFetch(kfake.SyntheticBatch{RecordBytes: 200}), kfake.SeedTopics(1, topic))
		runSinkBench(b, brokers, topic)
	})
}

func runSinkBench(b *testing.B, brokers []string, topic string) {
	var c benchCounter
	w := benchWorker(b, brokers, &c, topic)
	cfg := connect.Config{KeyName: testenv.Unique("bench-sink-"), KeyConnectorClass: "bench-sink", KeyTopics: topic}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	if err := w.StartTask(context.Background(), TaskRun{ID: TaskID{Connector: cfg[KeyName]}, ConnectorConfig: cfg, TaskConfig: connect.Config{}, Target: TargetRunning}); err != nil {
		b.Fatal(err)
	}
	awaitCount(b, &c, int64(b.N))
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(c.n.Load())/el.Seconds(), "records/s")
}

func preProduce(b *testing.B, brokers []string, topic string, n int) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := kafka.EnsureTopics(ctx, kadm.NewClient(cl), 1, -1, topic); err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 200)
	var failed atomic.Value
	for range n {
		cl.Produce(ctx, &kgo.Record{Topic: topic, Value: value}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Store(err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}
