package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
)

// keepingSink is a sink task that keeps every batch it was given (to write
// them in Flush, a common pattern) next to a copy of their values, and, if
// reportInFlush, reports its first record as errant from Flush, as amqpsink
// reports a nack that arrives after Put returned.
type keepingSink struct {
	reportInFlush bool
	swallow       bool // ignore Report's error and return the offsets anyway

	host  *connect.Host
	mu    sync.Mutex
	kept  [][]connect.SinkRecord
	seen  [][]string
	first *connect.SinkRecord
	next  map[connect.TopicPartition]int64
}

func (k *keepingSink) Start(ctx context.Context, _ connect.Config) error {
	k.host = connect.HostFrom(ctx)
	k.next = map[connect.TopicPartition]int64{}
	return nil
}

func (k *keepingSink) Put(_ context.Context, recs []connect.SinkRecord) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.kept = append(k.kept, recs)
	k.seen = append(k.seen, values(recs))
	for _, r := range recs {
		if k.first == nil {
			k.first = &r
		}
		k.next[r.TopicPartition()] = r.Offset + 1
	}
	return nil
}

func (k *keepingSink) Flush(ctx context.Context) (map[connect.TopicPartition]int64, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.reportInFlush && k.first != nil {
		if err := k.host.Errors.Report(ctx, *k.first, errors.New("the broker nacked it")); err != nil && !k.swallow {
			return nil, err
		}
	}
	return maps.Clone(k.next), nil
}

func (k *keepingSink) Stop(bool)                     {}
func (k *keepingSink) Stopped(context.Context) error { return nil }

func (k *keepingSink) batches() (kept, seen [][]string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, b := range k.kept {
		kept = append(kept, values(b))
	}
	return kept, slices.Clone(k.seen)
}

type sinkOnlyConnector struct{}

func (sinkOnlyConnector) Spec() connect.Spec                          { return connect.Spec{Type: connect.TypeSink} }
func (sinkOnlyConnector) Start(context.Context, connect.Config) error { return nil }
func (sinkOnlyConnector) TaskConfigs(int) ([]connect.Config, error)   { return []connect.Config{{}}, nil }
func (sinkOnlyConnector) Stop(bool)                                   {}
func (sinkOnlyConnector) Stopped(context.Context) error               { return nil }

// startKeepingSink runs one keepingSink task on topic, after first(brokers)
// (which writes the topic).
func startKeepingSink(t *testing.T, task *keepingSink, topic string, first func(brokers []string)) (*env, *keepingSink, TaskID) {
	reg, err := plugins.New(append(sampleconn.Plugins(sampleconn.NewRecorder()), connect.Plugin{
		Class:        "keeping-sink",
		NewConnector: func() connect.Connector { return sinkOnlyConnector{} },
		NewTask:      func() connect.Task { return task },
	})...)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, WithPlugins(reg))
	first(e.brokers)
	name := testenv.Unique("keeping-")
	cfg := connect.Config{KeyName: name, KeyConnectorClass: "keeping-sink", KeyTopics: topic, KeyOffsetFlushInterval: "100"}
	id := TaskID{Connector: name, Task: 0}
	if err := e.w.StartTask(e.ctx(), TaskRun{ID: id, ConnectorConfig: cfg, TaskConfig: cfg.Clone(), Ledger: e.ledger, Target: TargetRunning}); err != nil {
		t.Fatal(err)
	}
	return e, task, id
}

// The slice given to Put is the task's: the next batch does not overwrite it.
func TestPutBatchIsTheTasks(t *testing.T) {
	topic := testenv.Unique("keep-topic-")
	e, task, _ := startKeepingSink(t, &keepingSink{}, topic, func(brokers []string) {
		produce(t, brokers, topic, 3, func(i int) string { return fmt.Sprint("v", i) })
	})
	e.await("3 records put", func() bool { _, seen := task.batches(); return len(slices.Concat(seen...)) >= 3 })
	produce(t, e.brokers, topic, 3, func(i int) string { return fmt.Sprint("w", i) })
	e.await("6 records put", func() bool { _, seen := task.batches(); return len(slices.Concat(seen...)) >= 6 })
	kept, seen := task.batches()
	if !slices.EqualFunc(kept, seen, slices.Equal[[]string]) {
		t.Errorf("the batches Put was given changed after Put returned: they now hold %q, Put saw %q", kept, seen)
	}
}

// A Report under errors.tolerance=none from Flush fails the task, also on a
// topic where no further record comes for Put to notice it, and commits
// nothing past the record, even when the task swallowed Report's error.
func TestErrantReportInFlushFailsTheTask(t *testing.T) {
	for _, swallow := range []bool{false, true} {
		t.Run(fmt.Sprintf("swallow=%v", swallow), func(t *testing.T) {
			topic := testenv.Unique("flushreport-topic-")
			e, _, id := startKeepingSink(t, &keepingSink{reportInFlush: true, swallow: swallow}, topic, func(brokers []string) {
				produce(t, brokers, topic, 1, func(int) string { return "x" })
			})
			s := e.awaitTaskState(id, StateFailed)
			if !strings.Contains(s.Trace, "Flush") || !strings.Contains(s.Trace, "errors.tolerance is none") {
				t.Errorf("trace %q, want the Flush and the tolerance", s.Trace)
			}
			if at := groupOffset(t, e.brokers, groupID(id.Connector), topic, 0); at > 0 {
				t.Errorf("offset %d committed past the record that could not be delivered", at)
			}
		})
	}
}

// topics.regex matches whole topic names, as in Kafka Connect: "<p>-a"
// does not consume "<p>-ab".
func TestTopicsRegexMatchesWholeNames(t *testing.T) {
	e := newEnv(t)
	name, prefix := testenv.Unique("rxfull-"), testenv.Unique("rxf")
	produce(t, e.brokers, prefix+"-ab", 2, func(i int) string { return fmt.Sprint("ab", i) })
	produce(t, e.brokers, prefix+"-a", 2, func(i int) string { return fmt.Sprint("a", i) })
	cfg := sinkConfig(name, "")
	delete(cfg, KeyTopics)
	cfg[KeyTopicsRegex] = prefix + "-a"
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	e.await("the records of "+prefix+"-a", func() bool { return len(e.rec.Sunk(name)) >= 2 })
	// Both topics existed before the task subscribed, so one metadata
	// load saw both: give a match of the other one time to be fetched.
	time.Sleep(time.Second)
	got := values(e.rec.Sunk(name))
	slices.Sort(got)
	if want := []string{"a0", "a1"}; !slices.Equal(got, want) {
		t.Errorf("topics.regex=%s-a consumed %v (topics %v), want only %v", prefix, got, e.w.Topics(name), want)
	}
}

// A dead letter queue topic that topics.regex matches is refused: the sink
// would consume its own errant records, copying them again without end.
func TestDLQMatchedByTopicsRegexRefused(t *testing.T) {
	for _, tc := range []struct {
		regex, dlq string
		refused    bool
	}{
		{"orders-.*", "orders-dlq", true},
		{"orders", "orders-dlq", false}, // whole names: "orders" does not match
		{"orders|dlq", "dlq", true},
	} {
		cfg := connect.Config{KeyName: "x", KeyConnectorClass: sampleconn.SinkClass, KeyTopicsRegex: tc.regex, KeyErrorsTolerance: "all", KeyDLQTopic: tc.dlq}
		errs := ValidateCommon(connect.TypeSink, cfg)
		if got := len(errs[KeyDLQTopic]) > 0; got != tc.refused {
			t.Errorf("topics.regex=%q with DLQ %q: errors %v, want refused=%v", tc.regex, tc.dlq, errs, tc.refused)
		}
	}
}

// A topics.regex sink finds a matching topic created after it started
// within its metadata refresh (10 s), not Kafka's default 5 minutes: a
// sink created together with its source would sit idle that long.
func TestTopicsRegexFindsALaterTopic(t *testing.T) {
	e := newEnv(t)
	name, prefix := testenv.Unique("rxlate-"), testenv.Unique("rxl")
	produce(t, e.brokers, prefix+"-first", 1, func(i int) string { return fmt.Sprint("first", i) })
	cfg := sinkConfig(name, "")
	delete(cfg, KeyTopics)
	cfg[KeyTopicsRegex] = prefix + "-.*"
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	e.await("the record of the topic that existed", func() bool { return len(e.rec.Sunk(name)) >= 1 })
	produce(t, e.brokers, prefix+"-later", 2, func(i int) string { return fmt.Sprint("later", i) })
	e.await("the records of the topic created later", func() bool { return len(e.rec.Sunk(name)) >= 3 })
}
