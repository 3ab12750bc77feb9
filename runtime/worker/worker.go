package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/kafka"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
)

// Worker runs connector and task instances. Create it with New; Close stops
// everything it runs (never as a deletion) and waits.
type Worker struct {
	id               string
	plugins          *plugins.Registry
	offsets          OffsetStore
	seeds            []string
	kopts            []kgo.Opt
	logger           *slog.Logger
	listen           StatusListener
	grace            time.Duration
	stoppedTimeout   time.Duration
	flushInterval    time.Duration
	maxInFlight      int
	topicPartitions  int32
	topicReplication int16
	topicConfigs     map[string]*string
	reconfigure      func(connector string)
	abandonedGone    func(id TaskID)
	topicSeen        func(connector, topic string)

	adminOnce sync.Once
	admin     *kgo.Client
	adminErr  error
	creator   *kafka.TopicCreator

	// statusMu orders "is this instance still the current one" checks with
	// the reports they guard; taken before mu.
	statusMu sync.Mutex

	mu         sync.Mutex
	closed     bool
	connectors map[string]*connInstance
	tasks      map[TaskID]*taskInstance
	topics     map[string]map[string]bool
	// topicResets counts ResetTopics calls: a task's cache of the topics
	// it used (activeTopics) is dropped when it changes.
	topicResets atomic.Uint64
	wg          sync.WaitGroup // every task goroutine and connector stop
}

// Opt configures a Worker.
type Opt func(*Worker)

// WithID sets the worker_id reported in statuses (Kafka Connect uses the REST
// host:port).
func WithID(id string) Opt { return func(w *Worker) { w.id = id } }

// WithPlugins sets the plugin registry. Required.
func WithPlugins(r *plugins.Registry) Opt { return func(w *Worker) { w.plugins = r } }

// WithOffsetStore sets where source offsets are stored. Required for source
// connectors.
func WithOffsetStore(s OffsetStore) Opt { return func(w *Worker) { w.offsets = s } }

// WithKafka sets the Kafka seed brokers and extra client options. Required
// for tasks.
func WithKafka(seeds []string, opts ...kgo.Opt) Opt {
	return func(w *Worker) { w.seeds, w.kopts = seeds, opts }
}

// WithLogger sets the logger; instances get it with connector and task
// attributes.
func WithLogger(l *slog.Logger) Opt { return func(w *Worker) { w.logger = l } }

// WithStatusListener sets the function told about every state change.
func WithStatusListener(f StatusListener) Opt { return func(w *Worker) { w.listen = f } }

// WithGracefulTimeout sets the default bound on every stop
// (task.shutdown.graceful.timeout.ms overrides it per connector).
func WithGracefulTimeout(d time.Duration) Opt { return func(w *Worker) { w.grace = d } }

// WithStoppedTimeout bounds each Stopped call, which may drop external
// resources on a deletion (default 1 minute).
func WithStoppedTimeout(d time.Duration) Opt { return func(w *Worker) { w.stoppedTimeout = d } }

// WithOffsetFlushInterval sets the default of offset.flush.interval.ms
// (60s, as Kafka Connect).
func WithOffsetFlushInterval(d time.Duration) Opt { return func(w *Worker) { w.flushInterval = d } }

// WithMaxInFlightRecords bounds, per source task, the records produced but
// not yet acknowledged; Poll is not called while the bound is reached
// (default 50000).
func WithMaxInFlightRecords(n int) Opt { return func(w *Worker) { w.maxInFlight = n } }

// WithTopicCreation sets the defaults of topic.creation.default.partitions
// and topic.creation.default.replication.factor for topics source tasks
// produce to; -1 means the broker's default (the default).
func WithTopicCreation(partitions int32, replicationFactor int16) Opt {
	return func(w *Worker) { w.topicPartitions, w.topicReplication = partitions, replicationFactor }
}

// WithTopicConfigs sets topic configs that topics created on demand get,
// e.g. max.message.bytes for records larger than the broker's default.
func WithTopicConfigs(configs map[string]string) Opt {
	return func(w *Worker) {
		w.topicConfigs = map[string]*string{}
		for k, v := range configs {
			w.topicConfigs[k] = &v
		}
	}
}

// WithTaskReconfigurationHandler sets what connect.Host's
// RequestTaskReconfiguration calls (the herder re-reads TaskConfigs).
func WithTaskReconfigurationHandler(f func(connector string)) Opt {
	return func(w *Worker) { w.reconfigure = f }
}

// WithAbandonedTaskHandler sets what is told, with the task's id, that an
// instance abandoned after its graceful timeout has finished after all (its
// Poll/Put returned, its final commit and Stopped ran) and the worker has
// forgotten it: TaskStatus no longer lists it, so the id is free for a new
// instance. It is called once per such instance, from the instance's
// goroutine, and must not block. It is not called when another instance
// already runs under the id (a caller started one beside the abandoned one).
func WithAbandonedTaskHandler(f func(id TaskID)) Opt {
	return func(w *Worker) { w.abandonedGone = f }
}

// WithTopicHandler sets what is told that a connector's tasks used a topic
// for the first time since they started on this worker (or since
// ResetTopics), so the caller can persist the active topics at once rather
// than lose them in a crash. It is called from the task's goroutine, or a
// sink's rebalance callback, holding the task's own lock: it must not block
// (nor wait for the task).
func WithTopicHandler(f func(connector, topic string)) Opt {
	return func(w *Worker) { w.topicSeen = f }
}

// Errors callers can test with errors.Is.
var (
	ErrUnknownPlugin = errors.New("unknown connector plugin")
	ErrNotRunning    = errors.New("instance is not running on this worker")
	ErrAlreadyExists = errors.New("instance already runs on this worker")
	ErrClosed        = errors.New("worker is closed")
)

// New returns a Worker.
func New(opts ...Opt) (*Worker, error) {
	w := &Worker{
		grace:            5 * time.Second,
		stoppedTimeout:   time.Minute,
		flushInterval:    60 * time.Second,
		maxInFlight:      50000,
		topicPartitions:  -1,
		topicReplication: -1,
		logger:           slog.Default(),
		connectors:       map[string]*connInstance{},
		tasks:            map[TaskID]*taskInstance{},
		topics:           map[string]map[string]bool{},
	}
	for _, o := range opts {
		o(w)
	}
	var bad []string
	if w.plugins == nil {
		bad = append(bad, "plugins (WithPlugins) are required")
	}
	if w.grace < 0 {
		bad = append(bad, "the graceful timeout must not be negative")
	}
	if w.maxInFlight < 1 {
		bad = append(bad, "max in-flight records must be at least 1")
	}
	if w.flushInterval <= 0 {
		bad = append(bad, "the offset flush interval must be positive")
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("worker: %s", strings.Join(bad, "; "))
	}
	if w.logger == nil {
		w.logger = slog.New(slog.DiscardHandler)
	}
	if w.listen == nil {
		w.listen = func(string, int, Status) {}
	}
	if w.reconfigure == nil {
		w.reconfigure = func(string) {}
	}
	if w.abandonedGone == nil {
		w.abandonedGone = func(TaskID) {}
	}
	if w.topicSeen == nil {
		w.topicSeen = func(string, string) {}
	}
	return w, nil
}

// kafkaAdmin returns the worker's shared client for topic creation.
func (w *Worker) kafkaAdmin() (*kafka.TopicCreator, error) {
	w.adminOnce.Do(func() {
		if len(w.seeds) == 0 {
			w.adminErr = errors.New("worker: no Kafka brokers configured (WithKafka)")
			return
		}
		w.admin, w.adminErr = kafka.NewClient(w.seeds, w.logger, w.kopts...)
		if w.adminErr == nil {
			w.creator = kafka.NewTopicCreator(w.admin, w.topicPartitions, w.topicReplication)
			w.creator.Configs = w.topicConfigs
			w.creator.Logger = w.logger
		}
	})
	return w.creator, w.adminErr
}

func (w *Worker) report(connector string, task int, s Status) {
	s.WorkerID = w.id
	w.listen(connector, task, s)
}

func (w *Worker) addTopic(connector, topic string) {
	w.mu.Lock()
	if w.topics[connector] == nil {
		w.topics[connector] = map[string]bool{}
	}
	seen := w.topics[connector][topic]
	w.topics[connector][topic] = true
	w.mu.Unlock()
	if !seen {
		w.topicSeen(connector, topic)
	}
}

func (w *Worker) host(connector string, task int, ledger connect.Ledger, cleanupOnly bool, typ connect.ConnectorType) *connect.Host {
	lg := w.logger.With("connector", connector)
	if task >= 0 {
		lg = lg.With("task", task)
	}
	if ledger == nil {
		ledger = connect.NewMemoryLedger()
	}
	h := &connect.Host{Connector: connector, Task: task, Logger: lg, Ledger: ledger, CleanupOnly: cleanupOnly}
	if typ == connect.TypeSource && w.offsets != nil {
		h.Offsets = offsetReader{store: w.offsets, connector: connector}
	}
	if task < 0 {
		h.RequestTaskReconfiguration = func() { w.reconfigure(connector) }
	}
	return h
}

type offsetReader struct {
	store     OffsetStore
	connector string
}

func (r offsetReader) Offset(ctx context.Context, partition map[string]any) (map[string]any, error) {
	return r.store.Get(ctx, r.connector, partition)
}

// connInstance is one connector instance.
type connInstance struct {
	name   string
	cfg    connect.Config
	conn   connect.Connector
	host   *connect.Host
	ctx    context.Context
	cancel context.CancelFunc

	startDone  chan struct{} // closed when Start returned (or was skipped)
	finishDone chan struct{} // closed when Stopped returned; finishErr is its result
	finishErr  error

	// stopMu is held by Stop calls and while Stopped begins, so that no
	// Stop overlaps or follows Stopped, without holding mu: a Stop that
	// blocks must not hold up status reads and target changes.
	stopMu      sync.Mutex
	stopDeleted bool // a Stop(true) was delivered; guarded by stopMu

	mu           sync.Mutex
	status       Status
	target       TargetState
	started      bool // Start was attempted
	finished     bool // finish began: Stop was called
	stoppedBegun bool // Stopped was called: no more Stop calls
	deleted      bool
	// startTaken: a successful Start's result is on its way to the caller
	// of StartConnector. callerGone: that caller gave up first and was told
	// the start failed, so a Start that returns later must not leave the
	// instance RUNNING behind its back (the herder would never generate its
	// task configs). Exactly one of them is set, under mu.
	startTaken bool
	callerGone bool
}

// deliverStop calls Stop unless Stopped has begun, and reports whether it
// did. Stop gets every deletion asked for so far, whatever this call asks.
//
// A deletion is recorded at once, before waiting for stopMu: if Stopped
// begins first, it owes the instance that Stop(true) (beginStopped).
func (c *connInstance) deliverStop(deleted bool) bool {
	c.mu.Lock()
	if c.stoppedBegun {
		c.mu.Unlock()
		return false
	}
	c.deleted = c.deleted || deleted
	c.mu.Unlock()
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	c.mu.Lock()
	if c.stoppedBegun {
		c.mu.Unlock()
		return false
	}
	deleted = c.deleted
	c.mu.Unlock()
	c.callStop(deleted)
	return true
}

// callStop calls Stop; stopMu is held.
func (c *connInstance) callStop(deleted bool) {
	if err := guard("Stop", func() error { c.conn.Stop(deleted); return nil }); err != nil {
		c.host.Logger.Error("connector Stop failed", "error", err, "deleted", deleted)
	}
	if deleted {
		c.stopDeleted = true
	}
}

// beginStopped marks Stopped as begun, after delivering a Stop(true) owed
// to a deletion recorded while another Stop held stopMu, and returns
// whether Stopped runs as a deletion.
func (c *connInstance) beginStopped() bool {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	c.mu.Lock()
	c.stoppedBegun = true
	deleted := c.deleted
	c.mu.Unlock()
	if deleted && !c.stopDeleted {
		c.callStop(true)
	}
	return deleted
}

func (c *connInstance) setStatus(w *Worker, s Status) {
	c.mu.Lock()
	c.status = s
	c.mu.Unlock()
	w.report(c.name, -1, s)
}

func stateForTarget(t TargetState) State {
	switch t {
	case TargetPaused:
		return StatePaused
	case TargetStopped:
		return StateStopped
	}
	return StateRunning
}

// StartConnector creates a connector instance and calls Start. It returns
// Start's error (the instance is then FAILED, and its Stop(false) and
// Stopped have been called). The instance runs until StopConnector. With
// Target STOPPED the instance is registered but Start is not called, as
// Kafka Connect does not run a stopped connector.
func (w *Worker) StartConnector(ctx context.Context, run ConnectorRun) error {
	class := run.Config[KeyConnectorClass]
	p, ok := w.plugins.Lookup(class)
	if !ok {
		return fmt.Errorf("worker: connector %s: %w %q: install the plugin or fix connector.class", run.Name, ErrUnknownPlugin, class)
	}
	var conn connect.Connector
	var typ connect.ConnectorType
	if err := guard("NewConnector/Spec", func() error { conn = p.NewConnector(); typ = conn.Spec().Type; return nil }); err != nil {
		return fmt.Errorf("worker: connector %s: %w", run.Name, err)
	}
	host := w.host(run.Name, -1, run.Ledger, run.CleanupOnly, typ)
	ictx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &connInstance{name: run.Name, cfg: run.Config.Clone(), conn: conn, host: host, ctx: connect.WithHost(ictx, host), cancel: cancel, target: run.Target, startDone: make(chan struct{}), finishDone: make(chan struct{})}
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			cancel()
			return fmt.Errorf("worker: starting connector %s: %w", run.Name, ErrClosed)
		}
		old, ok := w.connectors[run.Name]
		if !ok {
			break
		}
		old.mu.Lock()
		started, finished := old.started, old.finished
		old.mu.Unlock()
		if started && !finished {
			w.mu.Unlock()
			cancel()
			return fmt.Errorf("worker: connector %s: %w; stop it first", run.Name, ErrAlreadyExists)
		}
		if !started {
			break // registered STOPPED: nothing was ever called on it
		}
		select {
		case <-old.finishDone:
			// Done; StopConnector forgets it any moment.
		default:
			// Its Stopped still runs (a StopConnector whose caller gave
			// up): the new instance's Start must not overlap it, as a
			// restarted task waits for its previous instance.
			w.mu.Unlock()
			select {
			case <-old.finishDone:
				continue
			case <-ctx.Done():
				cancel()
				return fmt.Errorf("worker: connector %s: its previous instance is still in Stopped (%w); retry when it has finished", run.Name, ctx.Err())
			}
		}
		break
	}
	// Marked started (and counted in w.wg) before it is listed, under
	// w.mu: a Close that lists it then stops it, waiting for its Start;
	// marked only after, a Close in between forgot it as never started
	// and its Start ran on, RUNNING on a closed worker.
	start := run.Target != TargetStopped || run.CleanupOnly
	c.started = start
	if start {
		w.wg.Add(1)
	}
	w.connectors[run.Name] = c
	w.mu.Unlock()

	if !start {
		close(c.startDone)
		c.setStatus(w, Status{State: StateStopped})
		return nil
	}
	host.Logger.Info("starting connector", "class", class, "cleanup_only", run.CleanupOnly)
	// Start is bounded by the caller's ctx: cancelling it interrupts Start
	// like a Stop would. A Start that ignores that keeps running in its own
	// goroutine (Close waits for it) and the caller gets an error.
	stopWatch := context.AfterFunc(ctx, cancel)
	result := make(chan error, 1)
	go func() {
		defer w.wg.Done()
		err := guard("Start", func() error { return conn.Start(c.ctx, run.Config.Clone()) })
		stopWatch()
		close(c.startDone)
		if err != nil {
			host.Logger.Error("connector failed to start", "error", err)
			c.setStatus(w, Status{State: StateFailed, Trace: err.Error()})
			c.finish(w, false)
			result <- fmt.Errorf("worker: connector %s failed to start: %w", run.Name, err)
			return
		}
		c.mu.Lock()
		target := c.target // SetTargetState may have run during Start
		gone := c.callerGone
		c.startTaken = !gone
		c.mu.Unlock()
		if gone {
			// The caller was told Start failed: the instance fails as if
			// it had (FAILED, Stop(false), Stopped).
			err := errors.New("Start returned only after the caller had given up waiting for it; restart the connector")
			host.Logger.Error("connector started too late", "error", err)
			c.setStatus(w, Status{State: StateFailed, Trace: err.Error()})
			c.finish(w, false)
			result <- err
			return
		}
		c.setStatus(w, Status{State: stateForTarget(target)})
		result <- nil
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		c.mu.Lock()
		taken := c.startTaken
		c.callerGone = !taken
		c.mu.Unlock()
		if taken {
			return <-result // Start succeeded just now: report it
		}
		return fmt.Errorf("worker: connector %s: Start did not return when the caller gave up (%w); it is still running, StopConnector stops it", run.Name, ctx.Err())
	}
}

// finish calls Stop(deleted) and, once Start has returned, Stopped. A
// second call before Stopped began delivers its Stop too (a deletion after a
// plain stop reaches the instance); every call returns Stopped's result.
func (c *connInstance) finish(w *Worker, deleted bool) error {
	c.mu.Lock()
	if !c.started {
		c.mu.Unlock()
		return nil
	}
	if c.finished {
		c.mu.Unlock()
		late := false
		if !c.deliverStop(deleted) {
			c.mu.Lock()
			late = deleted && !c.deleted // Stopped began without deletion: too late to tell it
			c.mu.Unlock()
		}
		<-c.finishDone
		if late {
			return fmt.Errorf("worker: connector %s: its Stopped already ran with connectorDeleted=false, so nothing was cleaned up; complete the deletion with a CleanupOnly instance: %w", c.name, ErrAlreadyStopped)
		}
		return c.finishErr
	}
	c.finished = true
	c.cancel()
	c.mu.Unlock()
	c.deliverStop(deleted)
	<-c.startDone // Stopped comes after Start returned, even if Stop raced it
	deleted = c.beginStopped()
	sctx, cancel := context.WithTimeout(connect.WithHost(context.Background(), c.host), w.stoppedTimeout)
	defer cancel()
	err := guard("Stopped", func() error { return c.conn.Stopped(sctx) })
	if err != nil {
		c.host.Logger.Error("connector Stopped failed", "error", err, "deleted", deleted)
		err = fmt.Errorf("worker: connector %s: Stopped: %w", c.name, err)
	} else {
		c.host.Logger.Info("connector stopped", "deleted", deleted)
	}
	c.finishErr = err
	close(c.finishDone)
	return err
}

// TaskConfigs asks a running connector for its task configurations, honouring
// tasks.max.
func (w *Worker) TaskConfigs(ctx context.Context, connector string) ([]map[string]string, error) {
	w.mu.Lock()
	c := w.connectors[connector]
	w.mu.Unlock()
	if c == nil {
		return nil, fmt.Errorf("worker: task configs of connector %s: %w", connector, ErrNotRunning)
	}
	c.mu.Lock()
	running := c.started && !c.finished && c.status.State != StateFailed
	c.mu.Unlock()
	if !running {
		return nil, fmt.Errorf("worker: task configs of connector %s: %w (it is stopped or failed)", connector, ErrNotRunning)
	}
	maxTasks, err := c.cfg.Int(KeyTasksMax, 1)
	if err != nil || maxTasks < 1 {
		return nil, fmt.Errorf("worker: connector %s: tasks.max must be a positive integer, got %q", connector, c.cfg[KeyTasksMax])
	}
	var cfgs []connect.Config
	err = guard("TaskConfigs", func() (err error) {
		cfgs, err = c.conn.TaskConfigs(maxTasks)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("worker: connector %s: TaskConfigs: %w", connector, err)
	}
	if len(cfgs) > maxTasks {
		c.host.Logger.Warn("connector returned more task configs than tasks.max; using the first ones", "returned", len(cfgs), "tasks_max", maxTasks)
		cfgs = cfgs[:maxTasks]
	}
	out := make([]map[string]string, len(cfgs))
	for i, tc := range cfgs {
		out[i] = maps.Clone(map[string]string(tc))
	}
	return out, ctx.Err()
}

// StopConnector calls Stop(connectorDeleted) and Stopped on the connector
// instance and forgets it. It returns Stopped's error. An instance that was
// never started is only forgotten. With connectorDeleted=true, an instance
// whose Stopped already began with connectorDeleted=false (its Start failed,
// or a plain stop got there first) returns an error wrapping
// ErrAlreadyStopped: the deletion did not reach it and completing it is the
// herder's (a CleanupOnly instance).
func (w *Worker) StopConnector(ctx context.Context, name string, connectorDeleted bool) error {
	w.mu.Lock()
	c := w.connectors[name]
	w.mu.Unlock()
	if c == nil {
		return nil
	}
	done := make(chan error, 1)
	w.wg.Add(1) // Close waits for a Stopped that outlives this call
	go func() {
		defer w.wg.Done()
		err := c.finish(w, connectorDeleted)
		w.mu.Lock()
		if w.connectors[name] == c {
			delete(w.connectors, name)
		}
		w.mu.Unlock()
		done <- err
	}()
	select {
	case err := <-done:
		if connectorDeleted || err == nil {
			w.report(name, -1, Status{State: StateUnassigned})
		}
		return err
	case <-ctx.Done():
		// Stopped goes on; the instance stays listed until it returns, and
		// a later StopConnector delivers its Stop and waits again.
		return fmt.Errorf("worker: connector %s: still stopping when the caller gave up: %w", name, ctx.Err())
	}
}

// SetTargetState pauses or resumes a connector and its tasks. A paused task
// gets no Stop call; its Poll context is cancelled and Poll/Put are not called
// until it is resumed. STOPPED is reported for the connector; its tasks are
// held like paused ones until the herder stops them.
func (w *Worker) SetTargetState(connector string, target TargetState) {
	w.mu.Lock()
	c := w.connectors[connector]
	var ts []*taskInstance
	for id, t := range w.tasks {
		if id.Connector == connector {
			ts = append(ts, t)
		}
	}
	w.mu.Unlock()
	if c != nil {
		c.mu.Lock()
		changed := c.target != target && c.started && !c.finished && c.status.State != StateFailed
		c.target = target
		c.mu.Unlock()
		if changed {
			c.setStatus(w, Status{State: stateForTarget(target)})
		}
	}
	for _, t := range ts {
		t.setTarget(target)
	}
}

// ConnectorStatus returns the status of a connector instance on this worker.
func (w *Worker) ConnectorStatus(name string) (Status, bool) {
	w.mu.Lock()
	c := w.connectors[name]
	w.mu.Unlock()
	if c == nil {
		return Status{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.status
	s.WorkerID = w.id
	return s, true
}

// TaskStatus returns the status of a task instance on this worker.
func (w *Worker) TaskStatus(id TaskID) (Status, bool) {
	w.mu.Lock()
	t := w.tasks[id]
	w.mu.Unlock()
	if t == nil {
		return Status{}, false
	}
	return t.getStatus(), true
}

// Topics returns the topics a connector's tasks produced to or consumed from
// since they started on this worker (or since ResetTopics), sorted.
func (w *Worker) Topics(connector string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := slices.Collect(maps.Keys(w.topics[connector]))
	slices.Sort(out)
	return out
}

// ResetTopics forgets the active topics of a connector.
func (w *Worker) ResetTopics(connector string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.topics, connector)
	w.topicResets.Add(1)
}

// activeTopics is a task's cache of the topics it told addTopic about, so
// that a record of a known topic costs no lock. A ResetTopics (of any
// connector) drops it: a reset topic the task keeps using is active again
// (KIP-558), and the topic handler is told again.
type activeTopics struct {
	resets uint64
	seen   map[string]bool
}

func (a *activeTopics) use(w *Worker, connector, topic string) {
	if n := w.topicResets.Load(); a.seen == nil || n != a.resets {
		a.seen, a.resets = map[string]bool{}, n
	}
	if !a.seen[topic] {
		a.seen[topic] = true
		w.addTopic(connector, topic)
	}
}

// Close stops every instance with connectorDeleted == false, as on worker
// shutdown: tasks first, then connectors. It waits for every task goroutine,
// bounded by ctx, and reports tasks still blocked when ctx ends.
func (w *Worker) Close(ctx context.Context) error {
	w.mu.Lock()
	w.closed = true
	ids := slices.Collect(maps.Keys(w.tasks))
	names := slices.Collect(maps.Keys(w.connectors))
	w.mu.Unlock()
	var errs []error
	for id, err := range w.StopTasks(ctx, ids, false) {
		if err != nil {
			errs = append(errs, fmt.Errorf("task %s-%d: %w", id.Connector, id.Task, err))
		}
	}
	var cwg sync.WaitGroup
	var emu sync.Mutex
	for _, n := range names {
		cwg.Go(func() {
			if err := w.StopConnector(ctx, n, false); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		})
	}
	cwg.Wait()
	all := make(chan struct{})
	go func() { w.wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-ctx.Done():
		w.mu.Lock()
		var stuck []string
		for id := range w.tasks {
			stuck = append(stuck, fmt.Sprintf("task %s-%d", id.Connector, id.Task))
		}
		for name := range w.connectors {
			stuck = append(stuck, "connector "+name)
		}
		w.mu.Unlock()
		slices.Sort(stuck)
		what := "plugin calls that did not return (Start, Poll/Put, Stop or Stopped)"
		if len(stuck) > 0 {
			what = "instances still in a plugin call (Start, Poll/Put, Stop or Stopped): " + strings.Join(stuck, ", ")
		}
		errs = append(errs, fmt.Errorf("worker: closing: %s: %w", what, ctx.Err()))
		// The waiter above ends when they return; its channel is dropped.
	}
	w.adminOnce.Do(func() {}) // synchronises with a concurrent first use
	if w.admin != nil {
		w.admin.Close()
	}
	return errors.Join(errs...)
}
