package amqpsink

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Benchmarks need RabbitMQ. Reproduce the figures in docs/amqpsink.md with
//
//	TIDYCONNECT_TEST_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5672/ \
//	  go test -run '^$' -bench . -benchtime 100000x ./connectors/amqpsink/
//
// (BenchmarkBacklogMemory ignores -benchtime and always drains 1M records).

var value200 = bytes.Repeat([]byte("x"), 200)

// BenchmarkSinkVsPlainPublisher publishes b.N 200-byte messages twice on the
// same broker in the same run: with a plain amqp091-go publisher (pipelined
// confirms, same window, same exchange and binding, persistent, mandatory)
// and through the sink (Put in batches of 500, then Flush until every
// message is confirmed). The two alternate in ten rounds, in alternating
// order, so that a change in the broker's load hits both alike. It reports
// both rates and their ratio.
func BenchmarkSinkVsPlainPublisher(b *testing.B) {
	u := testenv.RabbitMQURL(b)
	for _, qt := range []string{"quorum", "classic"} {
		b.Run(qt, func(b *testing.B) {
			br := newBroker(b, u)
			cfg := baseConfig(b, u, "bench")
			cfg[KeyQueueType] = qt
			name := cfg["name"]
			cleanupByName(b, br, name, name+".bench", name+".plain")
			s := startSink(b, cfg, connect.NewMemoryLedger(), &reporter{})
			b.Cleanup(func() { _ = s.stop(true) })
			// The plain publisher's queue, bound like the sink's.
			if err := br.on(func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare(name+".plain", true, false, false, false, amqp.Table{"x-queue-type": qt}); err != nil {
					return err
				}
				return ch.QueueBind(name+".plain", "plain", name, false, nil)
			}); err != nil {
				b.Fatal(err)
			}
			pp := newPlainPublisher(b, u, name, "plain", 4096)
			const rounds, batch = 10, 500
			var plain, sink time.Duration
			next := 0
			runSink := func(n int) {
				start := time.Now()
				recs := make([]connect.SinkRecord, 0, batch)
				for i := 0; i < n; i++ {
					recs = append(recs, connect.SinkRecord{Topic: "bench", Offset: int64(next), Key: []byte(strconv.Itoa(next)), Value: value200, Timestamp: start})
					next++
					if len(recs) == batch || i == n-1 {
						s.put(recs...)
						recs = recs[:0]
					}
				}
				if got := s.flush()[connect.TopicPartition{Topic: "bench"}]; got != int64(next) {
					b.Fatalf("flushed offset %d, want %d", got, next)
				}
				sink += time.Since(start)
			}
			runPlain := func(n int) {
				start := time.Now()
				pp.publish(n)
				plain += time.Since(start)
			}
			b.ResetTimer()
			for r := range rounds {
				n := b.N / rounds
				if r == rounds-1 {
					n = b.N - (rounds-1)*(b.N/rounds)
				}
				if r%2 == 0 {
					runPlain(n)
					runSink(n)
				} else {
					runSink(n)
					runPlain(n)
				}
			}
			b.StopTimer()
			plainRate, sinkRate := float64(b.N)/plain.Seconds(), float64(b.N)/sink.Seconds()
			b.ReportMetric(plainRate, "plain-msg/s")
			b.ReportMetric(sinkRate, "sink-msg/s")
			b.ReportMetric(sinkRate/plainRate, "ratio")
			br.deleteQueue(name + ".plain")
			br.deleteQueue(name + ".bench")
		})
	}
}

// plainPublisher is the baseline: one channel in confirm mode, at most
// window messages unconfirmed.
type plainPublisher struct {
	b             testing.TB
	ch            *amqp.Channel
	confirms      chan amqp.Confirmation
	returns       chan amqp.Return
	exchange, key string
	window, sent  int
}

func newPlainPublisher(b testing.TB, u, exchange, key string, window int) *plainPublisher {
	conn, err := amqp.Dial(u)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	return &plainPublisher{b: b, ch: ch, exchange: exchange, key: key, window: window,
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, window+1)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, window+1))}
}

// publish sends n messages and waits until all are confirmed.
func (p *plainPublisher) publish(n int) {
	outstanding, acked := 0, 0
	now := time.Now()
	wait := func() {
		c := <-p.confirms
		outstanding--
		if c.Ack {
			acked++
		}
	}
	for range n {
		for outstanding >= p.window {
			wait()
		}
		i := p.sent
		p.sent++
		err := p.ch.Publish(p.exchange, p.key, true, false, amqp.Publishing{
			ContentType: "application/octet-stream", DeliveryMode: amqp.Persistent, MessageId: "plain-0-" + strconv.Itoa(i),
			Timestamp: now, Headers: amqp.Table{"kafka.topic": "plain", "kafka.partition": int32(0), "kafka.offset": int64(i)}, Body: value200,
		})
		if err != nil {
			p.b.Fatal(err)
		}
		outstanding++
	}
	for outstanding > 0 {
		wait()
	}
	if acked != n || len(p.returns) > 0 {
		p.b.Fatalf("plain publisher: %d of %d acked, %d returned", acked, n, len(p.returns))
	}
}

// BenchmarkBacklogMemory drains a backlog of 1M 200-byte records through Put
// (batches of 500, as the worker's poll loop delivers them; Flush every 50k as
// its commit interval would) into a classic queue and reports the peak RSS of
// the process. Memory is bounded by rabbitmq.max.in.flight, not the backlog.
func BenchmarkBacklogMemory(b *testing.B) {
	u := testenv.RabbitMQURL(b)
	const total, batch, flushEvery = 1_000_000, 500, 50_000
	for range b.N {
		br := newBroker(b, u)
		cfg := baseConfig(b, u, "backlog")
		cfg[KeyQueueType] = "classic"
		name := cfg["name"]
		cleanupByName(b, br, name, name+".backlog")
		s := startSink(b, cfg, connect.NewMemoryLedger(), &reporter{})
		start := time.Now()
		recs := make([]connect.SinkRecord, 0, batch)
		var rssAt10 int64
		for i := 0; i < total; i++ {
			// A fresh value per record, as records fetched from Kafka are.
			v := make([]byte, 200)
			copy(v, value200)
			recs = append(recs, connect.SinkRecord{Topic: "backlog", Offset: int64(i), Value: v, Timestamp: start})
			if len(recs) == batch {
				s.put(recs...)
				recs = make([]connect.SinkRecord, 0, batch)
			}
			if (i+1)%flushEvery == 0 {
				s.flush()
			}
			if i+1 == total/10 {
				rssAt10 = peakRSS()
			}
		}
		if got := s.flush()[connect.TopicPartition{Topic: "backlog"}]; got != total {
			b.Fatalf("flushed offset %d, want %d", got, total)
		}
		elapsed := time.Since(start)
		b.ReportMetric(float64(total)/elapsed.Seconds(), "msg/s")
		b.ReportMetric(float64(rssAt10)/(1<<20), "peakRSS@100k-MiB")
		b.ReportMetric(float64(peakRSS())/(1<<20), "peakRSS@1M-MiB")
		if err := s.stop(true); err != nil {
			b.Fatal(err)
		}
	}
}

// peakRSS reads VmHWM (the resident set's high-water mark) in bytes.
func peakRSS() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
