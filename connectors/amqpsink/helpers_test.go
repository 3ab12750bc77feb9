package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// broker is the test's own view of RabbitMQ, outside the connector.
type broker struct {
	t    testing.TB
	url  string
	conn *amqp.Connection
}

func newBroker(t testing.TB, rawURL string) *broker {
	t.Helper()
	conn, err := amqp.Dial(rawURL)
	if err != nil {
		t.Fatalf("test connection to RabbitMQ: %v", err)
	}
	t.Cleanup(func() {
		// A test that deleted its vhost has had the connection closed.
		if err := conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			t.Errorf("closing the test connection to RabbitMQ: %v", err)
		}
	})
	return &broker{t: t, url: rawURL, conn: conn}
}

// on runs fn on a throwaway channel (a failed check closes it).
func (b *broker) on(fn func(ch *amqp.Channel) error) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return err
	}
	defer func() {
		if !ch.IsClosed() {
			_ = ch.Close()
		}
	}()
	return fn(ch)
}

func (b *broker) queueExists(name string) bool {
	b.t.Helper()
	err := b.on(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		return err
	})
	if err != nil && !isNotFound(err) {
		b.t.Fatalf("checking queue %q: %v", name, err)
	}
	return err == nil
}

func (b *broker) exchangeExists(name string) bool {
	b.t.Helper()
	err := b.on(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(name, "topic", true, false, false, false, nil)
	})
	if err != nil && !isNotFound(err) {
		b.t.Fatalf("checking exchange %q: %v", name, err)
	}
	return err == nil
}

func (b *broker) messages(queue string) int {
	b.t.Helper()
	var n int
	err := b.on(func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	if err != nil {
		b.t.Fatalf("counting messages in %q: %v", queue, err)
	}
	return n
}

// declareQueue creates a queue outside the connector and deletes it when the
// test ends.
func (b *broker) declareQueue(name, typ string) {
	b.t.Helper()
	err := b.on(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": typ})
		return err
	})
	if err != nil {
		b.t.Fatalf("declaring queue %q: %v", name, err)
	}
	b.t.Cleanup(func() { b.deleteQueue(name) })
}

// deleteQueue deletes queue name; one already gone is no failure.
func (b *broker) deleteQueue(name string) {
	b.t.Helper()
	err := b.on(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(name, false, false, false); return err })
	if err != nil && !isNotFound(err) {
		b.t.Errorf("deleting queue %q: %v", name, err)
	}
}

// deleteExchange deletes exchange name; one already gone is no failure.
func (b *broker) deleteExchange(name string) {
	b.t.Helper()
	err := b.on(func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) })
	if err != nil && !isNotFound(err) {
		b.t.Errorf("deleting exchange %q: %v", name, err)
	}
}

func (b *broker) publish(queue, body string) {
	b.t.Helper()
	err := b.on(func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{Body: []byte(body), DeliveryMode: amqp.Persistent})
		if err != nil {
			return err
		}
		if !dc.Wait() {
			return errors.New("nacked")
		}
		return nil
	})
	if err != nil {
		b.t.Fatalf("publishing to %q: %v", queue, err)
	}
}

// drain consumes want messages from queue (acknowledging them), failing the
// test if they do not arrive in time.
func (b *broker) drain(queue string, want int) []amqp.Delivery {
	b.t.Helper()
	var out []amqp.Delivery
	err := b.on(func(ch *amqp.Channel) error {
		if err := ch.Qos(1000, 0, false); err != nil {
			return err
		}
		ds, err := ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			return err
		}
		timeout := time.NewTimer(60 * time.Second)
		defer timeout.Stop()
		for len(out) < want {
			select {
			case d, ok := <-ds:
				if !ok {
					return fmt.Errorf("consumer closed after %d of %d messages", len(out), want)
				}
				out = append(out, d)
				if err := d.Ack(false); err != nil {
					return err
				}
			case <-timeout.C:
				return fmt.Errorf("got %d of %d messages", len(out), want)
			}
		}
		return nil
	})
	if err != nil {
		b.t.Fatalf("draining %q: %v", queue, err)
	}
	return out
}

// drainDistinct consumes from queue until want distinct message-ids were
// seen and returns the first delivery of each (at least once allows
// duplicates, e.g. after a consumer-group rebalance).
func (b *broker) drainDistinct(queue string, want int) []amqp.Delivery {
	b.t.Helper()
	seen := map[string]bool{}
	var out []amqp.Delivery
	err := b.on(func(ch *amqp.Channel) error {
		ds, err := ch.Consume(queue, "", true, false, false, false, nil)
		if err != nil {
			return err
		}
		timeout := time.NewTimer(60 * time.Second)
		defer timeout.Stop()
		for len(out) < want {
			select {
			case d, ok := <-ds:
				if !ok {
					return errors.New("consumer closed")
				}
				if !seen[d.MessageId] {
					seen[d.MessageId] = true
					out = append(out, d)
				}
			case <-timeout.C:
				return fmt.Errorf("%d of %d distinct messages arrived", len(out), want)
			}
		}
		return nil
	})
	if err != nil {
		b.t.Fatalf("draining %q: %v", queue, err)
	}
	return out
}

// awaitBodies consumes from queue until bodies v<from>..v<to-1> were all seen
// (duplicates, which at-least-once allows, are ignored).
func (b *broker) awaitBodies(queue string, from, to int) {
	b.t.Helper()
	want := map[string]bool{}
	for i := from; i < to; i++ {
		want[fmt.Sprintf("v%d", i)] = true
	}
	err := b.on(func(ch *amqp.Channel) error {
		ds, err := ch.Consume(queue, "", true, false, false, false, nil)
		if err != nil {
			return err
		}
		timeout := time.NewTimer(60 * time.Second)
		defer timeout.Stop()
		for len(want) > 0 {
			select {
			case d, ok := <-ds:
				if !ok {
					return errors.New("consumer closed")
				}
				delete(want, string(d.Body))
			case <-timeout.C:
				return fmt.Errorf("%d bodies never arrived", len(want))
			}
		}
		return nil
	})
	if err != nil {
		b.t.Fatalf("waiting for messages in %q: %v", queue, err)
	}
}

func (b *broker) purge(queue string) {
	b.t.Helper()
	if err := b.on(func(ch *amqp.Channel) error { _, err := ch.QueuePurge(queue, false); return err }); err != nil {
		b.t.Fatalf("purging %q: %v", queue, err)
	}
}

func rabbitmqctl(t testing.TB) string {
	t.Helper()
	p, err := lookRabbitmqctl()
	if err != nil {
		testenv.Skip(t, "this test needs rabbitmqctl to inspect or close broker connections: %v", err)
	}
	return p
}

func ctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := tryCtl(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryCtl runs rabbitmqctl, returning its failure (with its output) as an
// error.
func tryCtl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, rabbitmqctl(t), args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// connections counts the broker connections whose connection_name belongs to
// the connector.
func connections(t testing.TB, connector string) int {
	out := ctl(t, "list_connections", "-q", "--no-table-headers", "client_properties")
	return strings.Count(out, "tidyconnect:"+connector+":")
}

// bindings lists "source destination routing_key arguments" lines of the vhost.
func bindings(t testing.TB, vhost string) string {
	return ctl(t, "list_bindings", "-q", "--no-table-headers", "-p", vhost, "source_name", "destination_name", "routing_key", "arguments")
}

// testVhost creates a vhost for one test (so that closing every connection of
// it touches nobody else), deleted when the test ends unless the test
// already deleted it, and returns a URL for it.
func testVhost(t testing.TB, base string) (vhost, vurl string) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	vhost = testenv.Unique("tc-vh-")
	addVhost(t, vhost, base)
	t.Cleanup(func() {
		_, err := tryCtl(t, "delete_vhost", vhost)
		if err == nil {
			return
		}
		out, lerr := tryCtl(t, "list_vhosts", "-q", "--no-table-headers", "name")
		if lerr != nil {
			t.Errorf("%v; and listing the vhosts: %v", err, lerr)
		} else if slices.Contains(strings.Fields(out), vhost) {
			t.Errorf("vhost %s left behind: %v", vhost, err)
		}
	})
	u.Path = "/" + vhost
	u.RawPath = ""
	return vhost, u.String()
}

// addVhost creates vhost and gives the user of the URL base every
// permission on it.
func addVhost(t testing.TB, vhost, base string) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	user := "guest"
	if u.User != nil {
		user = u.User.Username()
	}
	ctl(t, "add_vhost", vhost)
	ctl(t, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
}

// reporter is an ErrantRecordReporter that records every report.
type reporter struct {
	mu       sync.Mutex
	tolerate bool
	reports  []report
}

type report struct {
	rec connect.SinkRecord
	err error
}

func (r *reporter) Report(_ context.Context, rec connect.SinkRecord, err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, report{rec, err})
	if r.tolerate {
		return nil
	}
	return fmt.Errorf("errors.tolerance=none: %w", err)
}

func (r *reporter) got() []report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]report(nil), r.reports...)
}

func testHost(name string, task int, l connect.Ledger, errs connect.ErrantRecordReporter) *connect.Host {
	lg := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return &connect.Host{Connector: name, Task: task, Logger: lg.With("connector", name, "task", task), Ledger: l, Errors: errs, RequestTaskReconfiguration: func() {}}
}

// sink is a connector with one task, driven as the runtime drives it.
type sink struct {
	t      testing.TB
	name   string
	ledger connect.Ledger
	conn   *Connector
	task   *Task
	errs   connect.ErrantRecordReporter
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func startSink(t testing.TB, cfg connect.Config, l connect.Ledger, errs connect.ErrantRecordReporter) *sink {
	t.Helper()
	s, err := tryStartSink(t, cfg, l, errs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tryStartSink(t testing.TB, cfg connect.Config, l connect.Ledger, errs connect.ErrantRecordReporter) (*sink, error) {
	return tryStartSinkLogged(t, cfg, l, errs, nil)
}

// tryStartSinkLogged is tryStartSink with the task logging to lg (nil: the
// default, warnings to stderr).
// startSinkWithLog starts a sink whose connector and task log into the
// returned buffer, shown when the test fails, with a memory ledger and a
// recording reporter; the sink is deleted at the end of the test.
func startSinkWithLog(t *testing.T, cfg connect.Config) (*sink, *testenv.SyncBuffer) {
	t.Helper()
	logs := &testenv.SyncBuffer{}
	lg := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := tryStartSinkLogged(t, cfg, connect.NewMemoryLedger(), &reporter{}, lg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.stop(true)
		if t.Failed() {
			t.Logf("task log:\n%s", logs.String())
		}
	})
	return s, logs
}

func tryStartSinkLogged(t testing.TB, cfg connect.Config, l connect.Ledger, errs connect.ErrantRecordReporter, lg *slog.Logger) (*sink, error) {
	name := cfg["name"]
	s := &sink{t: t, name: name, ledger: l, conn: &Connector{}, task: &Task{}, errs: errs}
	ctx := connect.WithHost(ctxT(t), testHost(name, -1, l, nil))
	if err := s.conn.Start(ctx, cfg); err != nil {
		s.conn.Stop(false)
		_ = s.conn.Stopped(ctx)
		return nil, fmt.Errorf("connector Start: %w", err)
	}
	tcs, err := s.conn.TaskConfigs(1)
	if err != nil {
		t.Fatal(err)
	}
	th := testHost(name, 0, l, errs)
	if lg != nil {
		th.Logger = lg.With("connector", name, "task", 0)
	}
	tctx := connect.WithHost(ctxT(t), th)
	if err := s.task.Start(tctx, tcs[0]); err != nil {
		s.task.Stop(false)
		_ = s.task.Stopped(tctx)
		s.conn.Stop(false)
		_ = s.conn.Stopped(ctx)
		return nil, fmt.Errorf("task Start: %w", err)
	}
	return s, nil
}

func (s *sink) put(recs ...connect.SinkRecord) {
	s.t.Helper()
	if err := s.task.Put(ctxT(s.t), recs); err != nil {
		s.t.Fatalf("Put: %v", err)
	}
}

func (s *sink) flush() map[connect.TopicPartition]int64 {
	s.t.Helper()
	offs, err := s.task.Flush(ctxT(s.t))
	if err != nil {
		s.t.Fatalf("Flush: %v", err)
	}
	return offs
}

func (s *sink) stop(deleted bool) error {
	s.task.Stop(deleted)
	if err := s.task.Stopped(connect.WithHost(ctxT(s.t), testHost(s.name, 0, s.ledger, s.errs))); err != nil {
		return fmt.Errorf("task Stopped: %w", err)
	}
	s.conn.Stop(deleted)
	return s.conn.Stopped(connect.WithHost(ctxT(s.t), testHost(s.name, -1, s.ledger, nil)))
}

// baseConfig is a fresh config with a unique connector name and topics.
func baseConfig(t testing.TB, rawURL string, topics ...string) connect.Config {
	name := testenv.Unique("tc-amqp-")
	return connect.Config{
		"name":            name,
		"connector.class": Class,
		KeyURL:            rawURL,
		KeyTopics:         strings.Join(topics, ","),
		KeyQueue:          name + ".${topic}",
	}
}

// cleanupByName removes what a test's connector may have left behind if the
// test failed half-way.
func cleanupByName(t testing.TB, b *broker, exchange string, queues ...string) {
	t.Cleanup(func() {
		for _, q := range queues {
			b.deleteQueue(q)
		}
		b.deleteExchange(exchange)
	})
}

func rec(topic string, partition int32, offset int64, key, value string) connect.SinkRecord {
	r := connect.SinkRecord{Topic: topic, Partition: partition, Offset: offset, Value: []byte(value), Timestamp: time.Unix(1700000000+offset, 0)}
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

var (
	ctlOnce sync.Once
	ctlPath string
	ctlErr  error
)

// lookRabbitmqctl finds a rabbitmqctl that works for this user against the
// broker the tests use: a service named by TIDYCONNECT_TEST_RABBITMQ_URL (a
// local rabbitmqctl cannot reach a testcontainers broker), run as a user it
// accepts (Debian's wrapper refuses all but root and rabbitmq).
func lookRabbitmqctl() (string, error) {
	ctlOnce.Do(func() {
		if os.Getenv(testenv.RabbitMQEnv) == "" {
			ctlErr = fmt.Errorf("the broker is not a local service (%s is unset)", testenv.RabbitMQEnv)
			return
		}
		p, err := exec.LookPath("rabbitmqctl")
		if err != nil {
			ctlErr = errors.New("rabbitmqctl is not on PATH")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, p, "-q", "list_vhosts").CombinedOutput(); err != nil {
			ctlErr = fmt.Errorf("rabbitmqctl does not work here (run the tests as root or the rabbitmq user): %v: %s", err, strings.TrimSpace(string(out)))
			return
		}
		ctlPath = p
	})
	return ctlPath, ctlErr
}

// vhostOf is the vhost a RabbitMQ URL names ("/" for none).
func vhostOf(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := amqp.ParseURI(rawURL)
	if err != nil {
		t.Fatalf("parsing the RabbitMQ URL: %v", err)
	}
	return u.Vhost
}

// suspendQueue suspends the process of classic queue q on the vhost of
// rawURL (it stops answering, as a stalled broker would) until the returned
// resume is called, or the test ends.
func suspendQueue(t testing.TB, rawURL, q string) (resume func()) {
	t.Helper()
	queuePid := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"%s">>, queue, <<"%s">>)), P = amqqueue:get_pid(Q)`, vhostOf(t, rawURL), q)
	ctl(t, "eval", queuePid+", sys:suspend(P).")
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			ctl(t, "eval", queuePid+", sys:resume(P).")
		}
	}
	t.Cleanup(resume)
	return resume
}
