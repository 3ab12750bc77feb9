package herder

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/internal/syncworker"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// Worker kinds the herder tests run against.
const (
	kindSync = "sync" // syncworker: the herder's decisions alone
	kindReal = "real" // runtime/worker with Kafka (kfake in-process)
)

var workerKinds = []string{kindSync, kindReal}

// flakyClass is a sample source whose connector's Stopped fails while
// failCleanup is set, for cleanup-failure tests.
const flakyClass = "flaky-source"

var failCleanup atomic.Bool

// blockCleanup, when set, holds flaky-source's Stopped until it is closed.
var blockCleanup atomic.Pointer[chan struct{}]

type flakyConnector struct{ connect.Connector }

func (f *flakyConnector) Stopped(ctx context.Context) error {
	if ch := blockCleanup.Load(); ch != nil {
		<-*ch
	}
	if failCleanup.Load() {
		return errors.New("flaky-source: cleanup failed (database down, say)")
	}
	return f.Connector.Stopped(ctx)
}

func testPlugins(t testing.TB, rec *sampleconn.Recorder) *plugins.Registry {
	t.Helper()
	ps := sampleconn.Plugins(rec)
	src := ps[0]
	flaky := connect.Plugin{
		Class:        flakyClass,
		NewConnector: func() connect.Connector { return &flakyConnector{src.NewConnector()} },
		NewTask:      src.NewTask,
	}
	reg, err := plugins.New(append(ps, flaky)...)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

type harness struct {
	t       testing.TB
	kind    string
	dir     string
	rec     *sampleconn.Recorder
	reg     *plugins.Registry
	seeds   []string
	st      *store.File
	h       *Standalone
	adm     *kadm.Client
	extra   []Option
	closeFn func()

	mu          sync.Mutex
	extraTopics []string // created by the test itself; dropped at cleanup
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("HERDER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newHarness starts a herder on dir. seeds may be nil for the sync worker.
func newHarness(t testing.TB, kind, dir string, rec *sampleconn.Recorder, seeds []string, extra ...Option) *harness {
	t.Helper()
	if kind == kindReal && seeds == nil {
		seeds = testenv.KafkaBrokers(t)
	}
	hs := &harness{t: t, kind: kind, dir: dir, rec: rec, reg: testPlugins(t, rec), seeds: seeds, extra: extra}
	// Registered before start: it runs after every Close of the herder.
	hs.dropKafkaObjectsAtCleanup()
	hs.start()
	return hs
}

// dropKafkaObjectsAtCleanup makes the test's cleanup delete the topics and
// consumer groups its connectors used (and those named with dropTopic), so
// a run against a real broker (TIDYCONNECT_TEST_KAFKA_BROKERS) leaves
// nothing behind; the in-process broker is discarded anyway. It does
// nothing for a harness without Kafka. Register it before the herder
// starts, so that it runs once the herder has stopped.
func (hs *harness) dropKafkaObjectsAtCleanup() {
	t := hs.t
	if len(hs.seeds) == 0 {
		return
	}
	t.Cleanup(func() {
		connectors := map[string]bool{}
		for _, c := range hs.rec.Calls() {
			// "connector/<name>" or "task/<name>/<n>"
			parts := strings.Split(c.Instance, "/")
			if len(parts) >= 2 {
				connectors[parts[1]] = true
			}
		}
		hs.mu.Lock()
		topics := map[string]bool{}
		for _, tp := range hs.extraTopics {
			topics[tp] = true
		}
		hs.mu.Unlock()
		var groups []string
		for c := range connectors {
			groups = append(groups, SinkGroup(c))
			for _, r := range hs.rec.Committed(c) {
				topics[r.Topic] = true
			}
		}
		if len(topics) == 0 && len(groups) == 0 {
			return
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(hs.seeds...))
		if err != nil {
			t.Errorf("cleanup: a Kafka client to drop the test's topics and groups: %v", err)
			return
		}
		defer cl.Close()
		adm := kadm.NewClient(cl)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if len(groups) > 0 {
			resp, err := adm.DeleteGroups(ctx, groups...)
			if err != nil {
				t.Errorf("cleanup: deleting the consumer groups %v: %v", groups, err)
			}
			for _, r := range resp {
				if r.Err != nil && !errors.Is(r.Err, kerr.GroupIDNotFound) {
					t.Errorf("cleanup: deleting the consumer group %s: %v", r.Group, r.Err)
				}
			}
		}
		if len(topics) > 0 {
			names := slices.Sorted(maps.Keys(topics))
			resp, err := adm.DeleteTopics(ctx, names...)
			if err != nil {
				t.Errorf("cleanup: deleting the topics %v: %v", names, err)
			}
			for _, r := range resp {
				if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
					t.Errorf("cleanup: deleting the topic %s: %v", r.Topic, r.Err)
				}
			}
		}
	})
}

// dropTopic has the test's cleanup delete topics the test created itself.
func (hs *harness) dropTopic(topics ...string) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.extraTopics = append(hs.extraTopics, topics...)
}

func (hs *harness) start() {
	t := hs.t
	t.Helper()
	st, err := store.OpenFile(hs.dir)
	if err != nil {
		t.Fatal(err)
	}
	hs.st = st
	log := testLogger(t)
	var newWorker NewHookedWorkerFunc
	switch hs.kind {
	case kindSync:
		newWorker = func(hk WorkerHooks) (Worker, error) { return syncworker.New(hs.reg, hk.Status), nil }
	case kindReal:
		newWorker = func(hk WorkerHooks) (Worker, error) {
			w, err := worker.New(worker.WithID("test:8083"), worker.WithPlugins(hs.reg), worker.WithOffsetStore(st),
				worker.WithKafka(hs.seeds), worker.WithLogger(log), worker.WithStatusListener(hk.Status), worker.WithTaskReconfigurationHandler(hk.Reconfigure),
				worker.WithAbandonedTaskHandler(hk.AbandonedTaskGone), worker.WithTopicHandler(hk.TopicSeen),
				worker.WithGracefulTimeout(3*time.Second))
			if err != nil {
				return nil, err
			}
			return w, nil
		}
		if hs.adm == nil {
			hs.adm = newAdmin(t, hs.seeds)
		}
	}
	opts := []Option{WithStore(st), WithPlugins(hs.reg), WithHookedWorker(newWorker), WithLogger(log), WithDeletionRetry(time.Hour, time.Hour)}
	if hs.adm != nil {
		opts = append(opts, WithKafkaAdmin(hs.adm))
	}
	h, err := NewStandalone(testCtx(t), append(opts, hs.extra...)...)
	if err != nil {
		st.Close()
		t.Fatalf("NewStandalone: %v", err)
	}
	hs.h = h
	closed := false
	hs.closeFn = func() {
		if closed {
			return
		}
		closed = true
		// Bounded: a Close that hangs fails the test instead of the run.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	}
	t.Cleanup(hs.closeFn)
}

// restart closes the herder (as on SIGTERM) and starts a new one on the
// same data directory.
func (hs *harness) restart() {
	hs.t.Helper()
	hs.closeFn()
	hs.start()
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func awaitCtx(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 20*time.Second)
}

// sourceConfig is a sample source config with n tasks owning resource r.
func sourceConfig(topic string, tasks int, extra ...string) connect.Config {
	cfg := connect.Config{
		KeyConnectorClass:       sampleconn.SourceClass,
		KeyTasksMax:             itoa(tasks),
		sampleconn.KeyTopic:     topic,
		sampleconn.KeyCount:     "-1",
		sampleconn.KeyRate:      "200",
		sampleconn.KeyResources: "r1",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		cfg[extra[i]] = extra[i+1]
	}
	return cfg
}

func itoa(n int) string { return strconv.Itoa(n) }

// awaitRunning waits until the connector and its n tasks were started.
func (hs *harness) awaitRunning(name string, n int) {
	hs.t.Helper()
	// Polled: a status can change after the recorder's last change.
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for !func() bool {
		st, err := hs.h.ConnectorStatus(context.Background(), name)
		if err != nil || st.Connector.State != worker.StateRunning || len(st.Tasks) != n {
			return false
		}
		for _, ts := range st.Tasks {
			if ts.State != worker.StateRunning {
				return false
			}
		}
		return true
	}() {
		if time.Now().After(deadline) {
			err = errors.New("timed out")
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		st, serr := hs.h.ConnectorStatus(context.Background(), name)
		hs.t.Fatalf("connector %s not RUNNING with %d RUNNING tasks: %v (status %+v, %v)", name, n, err, st, serr)
	}
}

// pollUntil polls cond until it holds or the deadline passes.
func pollUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newAdmin(t testing.TB, seeds []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}
