package herder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/version"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// Worker is what the standalone herder drives; *worker.Worker implements it.
type Worker interface {
	StartConnector(ctx context.Context, run worker.ConnectorRun) error
	TaskConfigs(ctx context.Context, connector string) ([]map[string]string, error)
	StartTask(ctx context.Context, run worker.TaskRun) error
	SetTargetState(connector string, target worker.TargetState)
	StopTasks(ctx context.Context, ids []worker.TaskID, connectorDeleted bool) map[worker.TaskID]error
	StopConnector(ctx context.Context, name string, connectorDeleted bool) error
	ConnectorStatus(name string) (worker.Status, bool)
	TaskStatus(id worker.TaskID) (worker.Status, bool)
	Topics(connector string) []string
	Close(ctx context.Context) error
}

var _ Worker = (*worker.Worker)(nil)

// WorkerHooks are the herder's callbacks the worker must be built with.
type WorkerHooks struct {
	// Status is the worker's StatusListener (worker.WithStatusListener).
	Status worker.StatusListener
	// Reconfigure handles connect.Host.RequestTaskReconfiguration
	// (worker.WithTaskReconfigurationHandler). It does not block.
	Reconfigure func(connector string)
	// AbandonedTaskGone is told that a task instance abandoned after its
	// graceful timeout has finished and the worker forgot it
	// (worker.WithAbandonedTaskHandler): a start of that task held back
	// meanwhile is then made. It does not block.
	AbandonedTaskGone func(id worker.TaskID)
	// TopicSeen is told that a connector's tasks used a topic for the
	// first time on this worker (worker.WithTopicHandler): the active
	// topics are persisted then, so GET /connectors/{name}/topics still
	// lists them after a crash. It does not block.
	TopicSeen func(connector, topic string)
}

// NewWorkerFunc creates the worker the herder drives, reporting to
// listener.
type NewWorkerFunc func(listener worker.StatusListener) (Worker, error)

// NewHookedWorkerFunc creates the worker the herder drives, wired to every
// hook.
type NewHookedWorkerFunc func(hooks WorkerHooks) (Worker, error)

// Option configures a Standalone herder.
type Option func(*Standalone)

// WithStore sets the durable store. Required.
func WithStore(s store.Store) Option { return func(h *Standalone) { h.store = s } }

// WithPlugins sets the plugin registry (the same one the worker uses). Required.
func WithPlugins(r *plugins.Registry) Option { return func(h *Standalone) { h.plugins = r } }

// WithWorker sets how the worker is created. It (or WithHookedWorker) is
// required. Such a worker is told only the status listener: use
// WithHookedWorker for one that can abandon tasks (runtime/worker), or a
// task held back behind an abandoned instance is never started by itself.
func WithWorker(f NewWorkerFunc) Option {
	return func(h *Standalone) {
		h.newWorker = func(hk WorkerHooks) (Worker, error) { return f(hk.Status) }
	}
}

// WithHookedWorker is WithWorker for a worker that also takes the task
// reconfiguration hook (worker.WithTaskReconfigurationHandler) and the
// abandoned-task hook (worker.WithAbandonedTaskHandler).
func WithHookedWorker(f NewHookedWorkerFunc) Option { return func(h *Standalone) { h.newWorker = f } }

// WithKafkaAdmin sets the admin client used for sink offsets (the consumer
// group connect-<name>). Without it sink offsets cannot be read or changed.
func WithKafkaAdmin(adm *kadm.Client) Option { return func(h *Standalone) { h.adm = adm } }

// WithKafkaClient is WithKafkaAdmin on cl, and lets a sink's deletion
// remove the members its stopped tasks left in its consumer group
// (removeGroupMembers) rather than wait for their sessions to time out.
func WithKafkaClient(cl *kgo.Client) Option {
	return func(h *Standalone) { h.adm, h.kafka = kadm.NewClient(cl), cl }
}

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(h *Standalone) { h.log = l } }

// WithWorkerID sets the worker_id shown in statuses the herder makes up
// itself (STOPPED, UNASSIGNED, a failed deletion); the worker's own
// statuses carry its id.
func WithWorkerID(id string) Option { return func(h *Standalone) { h.workerID = id } }

// WithKafkaClusterID sets the cluster id GET / reports.
func WithKafkaClusterID(id string) Option { return func(h *Standalone) { h.clusterID = id } }

// WithDeletionRetry sets the background retry backoff of failed deletions:
// first after min, doubling up to max.
func WithDeletionRetry(min, max time.Duration) Option {
	return func(h *Standalone) { h.retryMin, h.retryMax = min, max }
}

// WithDeletionAttemptTimeout bounds one deletion attempt (default 2m): a
// cleanup that cannot finish (a cleanup-only Start blocked on an
// unreachable system) then fails visibly and is retried with backoff
// instead of hanging.
func WithDeletionAttemptTimeout(d time.Duration) Option {
	return func(h *Standalone) { h.attemptTimeout = d }
}

// Hook points for tests that inject crashes.
const (
	hookIntentWritten = "intent-written"
	hookTasksStopped  = "tasks-stopped"
	// hookAbandonedGone runs (connector name) once the herder has handled
	// the return of an abandoned task instance, whether it started the
	// held-back task or not.
	hookAbandonedGone = "abandoned-task-gone"
	// hookHeldBackLocked runs (connector name) when a held-back start holds
	// the connector's lock, before it registers its cancel.
	hookHeldBackLocked = "held-back-locked"
	// hookResumeLocked runs (connector name) when resumeInterruptedStart
	// holds the connector's lock, before it registers its cancel.
	hookResumeLocked = "resume-locked"
	// hookInterruptAsked runs (connector name) when an operation has asked
	// for an interrupt (interruptStart), before it waits for the
	// connector's lock.
	hookInterruptAsked = "interrupt-asked"
	// hookYieldWait runs (connector name) when a background start that
	// yielded waits for the operations that asked for an interrupt to
	// take the connector's lock.
	hookYieldWait = "yield-wait"
)

// withHook is test-only: fn runs at the named points above.
func withHook(fn func(point, connector string)) Option {
	return func(h *Standalone) { h.hook = fn }
}

// SinkGroup is the consumer group of a sink connector, as Kafka Connect
// names it.
func SinkGroup(connector string) string { return "connect-" + connector }

// Standalone is the single-process herder: it keeps every connector on its
// one worker and persists through a store.Store. It is the only place that
// decides connectorDeleted: true, and only in DeleteConnector (and when it
// completes a deletion recorded before a crash).
type Standalone struct {
	store     store.Store
	plugins   *plugins.Registry
	newWorker NewHookedWorkerFunc
	w         Worker
	adm       *kadm.Client
	kafka     *kgo.Client // nil: leftover group members are waited out
	log       *slog.Logger
	clusterID string
	workerID  string
	retryMin  time.Duration
	retryMax  time.Duration
	// attemptTimeout bounds one deletion attempt.
	attemptTimeout time.Duration
	hook           func(point, connector string)

	mu      sync.Mutex
	conns   map[string]*conn
	closed  bool
	orphans map[string][]connect.Resource // found at start-up

	statusMu sync.Mutex
	statuses map[worker.TaskID]worker.Status // Task -1 for the connector

	// bg owns the background deletion retries.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup
}

// conn is the herder's view of one connector.
type conn struct {
	name string
	// op serialises lifecycle operations; acquire with lock (ctx-bounded).
	op chan struct{}

	// Guarded by op:
	rec       store.ConnectorRecord
	plugin    connect.Plugin
	spec      connect.Spec
	hasPlugin bool
	inWorker  bool            // the worker knows a connector instance (even a FAILED one)
	running   bool            // that instance's Start succeeded
	tasks     []worker.TaskID // task instances the worker knows
	failure   string          // why the connector is FAILED outside the worker (no plugin, TaskConfigs error)
	// heldBack lists the tasks whose start waits for their abandoned
	// previous instance to return (startTaskLocked); abandonedGone starts
	// them. A stop of the task drops it.
	heldBack map[int]bool

	// Guarded by Standalone.mu (read by status calls without op):
	deletion       *store.DeletionIntent
	retryScheduled bool
	// cancelStart interrupts a background start at boot, or of a held-back
	// task (a Start blocked on an unreachable system), when the user stops,
	// changes or deletes it.
	cancelStart context.CancelFunc
	// interrupts counts interruptStart calls. A held-back start that sees
	// one arrive while it waited for the connector's lock lets that
	// operation go first instead of starting a task it would have to wait
	// for (startHeldBack).
	interrupts uint64
	// approaching counts the operations that called interruptStart and
	// have not taken the connector's lock yet (nor given up on it); a
	// background start does not begin while one is on its way, and once it
	// yielded it waits for them (approachDone, closed when the count drops
	// to zero) before it takes the lock again (interruptible).
	approaching  int
	approachDone chan struct{}
	// approachingChanges counts, among approaching, the config changes
	// that found no start to interrupt (interruptStartFor): validation
	// under the lock may still refuse them, so a request's start does not
	// give way to them (startingFor).
	approachingChanges int
	// topicsPending is set while a topicSeen save waits for the lock:
	// topics first used meanwhile are saved by it, not each by its own.
	topicsPending bool
}

func (c *conn) lock(ctx context.Context) error {
	select {
	case c.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("connector %s is busy with another operation: %w", c.name, ctx.Err())
	}
}

func (c *conn) unlock() { <-c.op }

// NewStandalone creates the herder, then completes every deletion recorded
// before the last shutdown (or crash), then starts the stored connectors in
// their target states in the background (see AwaitStarted). Close stops
// them (never as a deletion).
func NewStandalone(ctx context.Context, opts ...Option) (*Standalone, error) {
	h := &Standalone{
		log:      slog.Default(),
		retryMin: time.Second,
		retryMax: 5 * time.Minute,

		attemptTimeout: 2 * time.Minute,
		conns:          map[string]*conn{},
		statuses:       map[worker.TaskID]worker.Status{},
	}
	for _, o := range opts {
		o(h)
	}
	var missing []string
	if h.store == nil {
		missing = append(missing, "WithStore")
	}
	if h.plugins == nil {
		missing = append(missing, "WithPlugins")
	}
	if h.newWorker == nil {
		missing = append(missing, "WithWorker")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("herder: missing required options: %s", strings.Join(missing, ", "))
	}
	w, err := h.newWorker(WorkerHooks{Status: h.onStatus, Reconfigure: h.requestReconfiguration, AbandonedTaskGone: h.abandonedGone, TopicSeen: h.topicSeen})
	if err != nil {
		return nil, fmt.Errorf("herder: creating the worker: %w", err)
	}
	h.w = w
	h.bgCtx, h.bgCancel = context.WithCancel(context.Background())
	if err := h.recover(ctx); err != nil {
		h.bgCancel()
		h.bgWG.Wait()
		_ = w.Close(context.Background())
		return nil, err
	}
	return h, nil
}

func (h *Standalone) newConn(rec store.ConnectorRecord) *conn {
	c := &conn{name: rec.Name, op: make(chan struct{}, 1), rec: rec}
	c.plugin, c.hasPlugin = h.plugins.Lookup(rec.Config[KeyConnectorClass])
	if c.hasPlugin {
		c.spec = c.plugin.NewConnector().Spec()
	} else {
		c.spec = connect.Spec{Type: connect.TypeUnknown}
		c.failure = h.unknownClassMsg(rec.Config[KeyConnectorClass])
	}
	return c
}

// recover loads the store: deletions first, then the rest.
func (h *Standalone) recover(ctx context.Context) error {
	recs, err := h.store.Connectors(ctx)
	if err != nil {
		return fmt.Errorf("herder: reading stored connectors: %w", err)
	}
	intents, err := h.store.Intents(ctx)
	if err != nil {
		return fmt.Errorf("herder: reading deletion intents: %w", err)
	}
	byName := map[string]store.ConnectorRecord{}
	for _, r := range recs {
		byName[r.Name] = r
	}
	h.mu.Lock()
	for _, in := range intents {
		rec, ok := byName[in.Connector]
		if !ok {
			rec = store.ConnectorRecord{Name: in.Connector, Config: in.Config, Target: worker.TargetStopped}
		}
		c := h.newConn(rec)
		in := in
		c.deletion = &in
		h.conns[in.Connector] = c
	}
	for _, r := range recs {
		if _, ok := h.conns[r.Name]; !ok {
			h.conns[r.Name] = h.newConn(r)
		}
	}
	h.mu.Unlock()

	h.reportOrphans(ctx)

	// Pending deletions are completed before anything else starts.
	for _, in := range intents {
		c := h.get(in.Connector)
		if ctx.Err() != nil {
			// Start-up cut short (a signal): the caller closes the herder
			// next. The intent stays, so the background retry or the next
			// start completes the deletion; failing the start would not.
			h.scheduleRetry(c, in.Attempts)
			continue
		}
		h.log.Info("completing a deletion recorded before the last shutdown", "connector", in.Connector, "phase", in.Phase, "attempts", in.Attempts)
		// c is new and only this loop locks it yet, so the lock is free.
		// Not c.lock(ctx): once ctx has ended its select fails at random.
		c.op <- struct{}{}
		err := h.deleteLocked(ctx, c)
		c.unlock()
		if err != nil {
			h.log.Warn("pending deletion failed; the connector stays visible and is retried in the background", "connector", in.Connector, "error", err)
		}
	}
	// The others start in the background, each in a goroutine the herder
	// owns: a connector whose Start blocks (an unreachable database) must
	// not hold up the REST API or the other connectors. Until started they
	// show UNASSIGNED; operations on them wait for the start.
	for _, r := range recs {
		c := h.get(r.Name)
		if c == nil || h.deletionOf(c) != nil || c.rec.Target == worker.TargetStopped || c.rec.Dormant {
			continue
		}
		c.op <- struct{}{} // taken now, so every later operation comes after the start
		sctx, cancel := context.WithCancel(h.bgCtx)
		h.mu.Lock()
		c.cancelStart = cancel
		h.mu.Unlock()
		h.bgWG.Add(1)
		go func() {
			defer h.bgWG.Done()
			defer c.unlock()
			defer cancel()
			h.startLocked(sctx, c)
			h.mu.Lock()
			c.cancelStart = nil
			h.mu.Unlock()
		}()
	}
	return nil
}

// reportOrphans logs, loudly, every ledger the store holds for a connector
// that has neither a config nor a deletion intent. Nothing cleans these up
// by itself: without a config no cleanup instance can start. Recreating the
// connector under the same name (with a config that reaches the system)
// adopts the ledger, and deleting it drops what it lists.
func (h *Standalone) reportOrphans(ctx context.Context) {
	ol, ok := h.store.(store.OrphanLister)
	if !ok {
		return
	}
	orphans, err := ol.OrphanLedgers(ctx)
	if err != nil {
		h.log.Warn("could not look for orphan ledgers", "error", err)
		return
	}
	names := slices.Sorted(maps.Keys(orphans))
	for _, name := range names {
		res := make([]string, len(orphans[name]))
		for i, r := range orphans[name] {
			res[i] = r.String()
		}
		h.log.Error("ORPHAN LEDGER: resources recorded as owned by a connector that no longer exists; nothing will drop them. Recreate the connector with this name and a working config, then DELETE it, or drop them by hand",
			"connector", name, "resources", res)
	}
	h.mu.Lock()
	h.orphans = orphans
	h.mu.Unlock()
}

// OrphanLedgers returns the orphan ledgers found at start-up (see
// store.OrphanLister), by connector name.
func (h *Standalone) OrphanLedgers() map[string][]connect.Resource {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string][]connect.Resource, len(h.orphans))
	for k, v := range h.orphans {
		out[k] = slices.Clone(v)
	}
	return out
}

// AwaitStarted waits until the connectors found at start-up have been
// started (or failed to), or ctx ends.
func (h *Standalone) AwaitStarted(ctx context.Context) error {
	h.mu.Lock()
	conns := slices.Collect(maps.Values(h.conns))
	h.mu.Unlock()
	for _, c := range conns {
		if err := c.lock(ctx); err != nil {
			return err
		}
		c.unlock()
	}
	return nil
}

func (h *Standalone) get(name string) *conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[name]
}

// lookup returns the connector locked for an operation, or ErrNotFound.
func (h *Standalone) lookup(ctx context.Context, name string) (*conn, error) {
	h.mu.Lock()
	closed := h.closed
	c := h.conns[name]
	h.mu.Unlock()
	if closed {
		return nil, errors.New("herder: the worker is shutting down; retry against the restarted worker")
	}
	if c == nil {
		return nil, ErrNotFound
	}
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	// It may have been deleted while we waited.
	if h.get(name) != c {
		c.unlock()
		return nil, ErrNotFound
	}
	return c, nil
}

// lookupLive is lookup for operations that make no sense while the
// connector is being deleted.
func (h *Standalone) lookupLive(ctx context.Context, name string) (*conn, error) {
	c, err := h.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	if d := h.deletionOf(c); d != nil {
		c.unlock()
		return nil, &BadRequestError{Msg: fmt.Sprintf("connector %s is being deleted (phase %s, last error: %s); fix the configuration with PUT /connectors/%s/config if it is the cause, then retry DELETE /connectors/%s to complete the deletion", c.name, d.Phase, orNone(d.LastError), c.name, c.name)}
	}
	return c, nil
}

// interruptStart cancels a background start of name still in progress, so
// the caller's operation does not wait for a Start that may never return.
// The interrupted instance ends FAILED (its Stopped runs).
//
// The caller calls arrived once it holds the connector's lock or gave up
// on it: until then no background start begins (interruptible), so none
// can take the lock again ahead of it and block in Start.
func (h *Standalone) interruptStart(name string) (arrived func()) {
	h.mu.Lock()
	c := h.conns[name]
	cancel := h.approachLocked(c)
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return h.arrival(name, c, false)
}

// approachLocked counts an interrupt of c and an operation on its way to
// c's lock, returning the cancel of c's background start in progress, if
// any (nil c: nothing to count). h.mu must be held.
func (h *Standalone) approachLocked(c *conn) (cancel context.CancelFunc) {
	if c == nil {
		return nil
	}
	c.interrupts++
	if c.approaching == 0 {
		c.approachDone = make(chan struct{})
	}
	c.approaching++
	return c.cancelStart
}

// arrival is the arrived of an operation that approachLocked counted;
// change says it was also counted in c.approachingChanges.
func (h *Standalone) arrival(name string, c *conn, change bool) (arrived func()) {
	h.runHook(hookInterruptAsked, name)
	var once sync.Once
	return func() {
		if c == nil {
			return
		}
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			c.approaching--
			if change {
				c.approachingChanges--
			}
			if c.approaching == 0 {
				close(c.approachDone)
				c.approachDone = nil
			}
		})
	}
}

// awaitApproaching waits until no operation that called interruptStart on
// c is still on its way to the connector's lock (see interruptStart).
// It reports false when the herder is closing.
func (h *Standalone) awaitApproaching(c *conn) bool {
	h.mu.Lock()
	ch := c.approachDone
	h.mu.Unlock()
	if ch == nil {
		return h.bgCtx.Err() == nil
	}
	h.runHook(hookYieldWait, c.name)
	select {
	case <-ch:
		return true
	case <-h.bgCtx.Done():
		return false
	}
}

// interruptStartFor interrupts a start in progress (see interruptStart) for
// a config change, built by next from the current config, unless validation
// refuses the change: a refused request changes nothing, so it must not
// leave the connector FAILED with the interrupted Start's "context
// canceled". The request is validated again under the connector's lock.
//
// interrupted says whether a start was interrupted: if validation under the
// lock then refuses the change after all (a Validate that reaches an
// external system, a ledger that gained an entry meanwhile), the caller
// hands the connector to resumeInterruptedStart. arrived is interruptStart's
// (a no-op when the change is refused).
func (h *Standalone) interruptStartFor(ctx context.Context, name string, next func(connect.Config) connect.Config) (interrupted bool, arrived func(), err error) {
	h.mu.Lock()
	c := h.conns[name]
	starting := c != nil && c.cancelStart != nil && c.deletion == nil
	var rec store.ConnectorRecord
	var spec connect.Spec
	var hasPlugin bool
	if starting {
		rec, spec, hasPlugin = c.rec, c.spec, c.hasPlugin
	} else {
		// Nothing to interrupt: counted under this same hold, so that a
		// background start beginning from now on yields to this change
		// instead of being cancelled by it unannounced (a change refused
		// under the lock would then leave it FAILED, never resumed).
		cancel := h.approachLocked(c) // a deletion's cleanup start, as before
		if c != nil {
			c.approachingChanges++
		}
		h.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		return false, h.arrival(name, c, c != nil), nil
	}
	h.mu.Unlock()
	{
		cfg := next(rec.Config.Clone())
		if hasPlugin {
			cfg = unmaskWith(spec, cfg, rec.Config)
		}
		_, _, errs := h.validate(ctx, name, cfg)
		mergeErrs(errs, h.classChangeErrorsFor(ctx, name, rec.Config, cfg))
		if len(errs) > 0 {
			return false, func() {}, &ConfigError{Fields: errs}
		}
	}
	return true, h.interruptStart(name), nil
}

// resumeInterruptedStart starts again, in the background and under the
// connector's lock, a connector whose start interruptStartFor interrupted
// for a change that was then refused: the refused request must leave the
// connector as it would have been without it, not FAILED with "context
// canceled". Instances that came up healthy anyway are left alone.
//
// Like startHeldBack, it yields to an operation that called interruptStart
// before its cancel was registered (a stop sent right after the refused
// change): that call found nothing to cancel and would otherwise wait
// behind a Start that may block until Close. It looks again afterwards.
func (h *Standalone) resumeInterruptedStart(name string) {
	h.inBackgroundLocked(name, func(c *conn, seen uint64) (retry bool) {
		h.runHook(hookResumeLocked, name)
		if c.rec.Target == worker.TargetStopped || c.rec.Dormant || !c.hasPlugin {
			return false
		}
		st := h.statusOf(c)
		healthy := c.running && st.Connector.State != worker.StateFailed
		for _, t := range st.Tasks {
			healthy = healthy && t.State != worker.StateFailed
		}
		if healthy {
			return false
		}
		retry = !h.interruptible(c, seen, func(ctx context.Context) {
			h.logger(c).Info("starting the connector again: its start was interrupted for a config change that was then refused")
			h.stopAllLocked(context.WithoutCancel(ctx), c) // see requestReconfiguration
			h.startLocked(ctx, c)
		})
		if retry {
			h.logger(c).Info("an operation that interrupts starts arrived; it goes first, then the connector is looked at again")
		}
		return retry
	})
}

// inBackgroundLocked runs f in a goroutine the herder owns, under the lock
// of connector name if it still lives and is not being deleted. seen is
// the connector's interrupt count from before f waited for the lock (see
// interruptible); when f reports retry, it yielded to an operation that
// interrupts starts, and it runs again after that one.
func (h *Standalone) inBackgroundLocked(name string, f func(c *conn, seen uint64) (retry bool)) {
	if c := h.get(name); c != nil {
		h.inBackgroundLockedOn(c, f)
	}
}

// inBackgroundLockedOn is inBackgroundLocked for the connector c, and only
// c: once deleted (or deleted and created anew under its name, a new conn)
// f does not run, as the change it would apply was made for c.
func (h *Standalone) inBackgroundLockedOn(c0 *conn, f func(c *conn, seen uint64) (retry bool)) {
	h.mu.Lock()
	seen := c0.interrupts
	h.mu.Unlock()
	h.inBackground(func() {
		c, err := h.lookupLive(h.bgCtx, c0.name)
		if err != nil {
			return
		}
		if c != c0 {
			c.unlock()
			return
		}
		retry := false
		defer func() {
			c.unlock()
			if retry {
				// The operation it yielded to may not be waiting for the
				// lock yet: let it take the lock first.
				h.inBackground(func() {
					if h.awaitApproaching(c) {
						h.inBackgroundLockedOn(c, f)
					}
				})
			}
		}()
		retry = f(c, seen)
	})
}

// interruptsOf is how many interruptStart calls connector name has had: a
// background start notes it before it waits for the connector's lock.
func (h *Standalone) interruptsOf(name string) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[name]; c != nil {
		return c.interrupts
	}
	return 0
}

// interruptible runs start, under c's lock, with a context interruptStart
// cancels. It runs nothing and reports false when an interruptStart came
// since seen, or one is still on its way to the lock: that operation found
// nothing to cancel and waits for the lock, so the caller yields it the
// lock (awaitApproaching) and looks again afterwards.
func (h *Standalone) interruptible(c *conn, seen uint64, start func(ctx context.Context)) bool {
	ctx, cancel := context.WithCancel(h.bgCtx)
	defer cancel()
	h.mu.Lock()
	if c.interrupts != seen || c.approaching > 0 {
		h.mu.Unlock()
		return false
	}
	c.cancelStart = cancel
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		c.cancelStart = nil
		h.mu.Unlock()
	}()
	start(ctx)
	return true
}

// startingFor returns the context the starts of a request's operation run
// under, and the function that ends it; call it under c's lock. The client
// going away does not cancel it: a Start that provisions (a pgaudit initial
// snapshot copying a big table) must not be rolled back, and the connector
// left FAILED, because a client stopped waiting; in Kafka Connect, too, an
// operation outlives the request that asked for it. What does cancel it is
// the herder's Close and every operation that interrupts starts (a delete,
// stop, restart or config change, through c.cancelStart, as for a start at
// boot), so a Start that blocks never holds the connector for good
// (docs/decisions/0025).
//
// A delete, stop or restart that asked for an interrupt before the cancel
// was registered (while this operation, or one before it, held the lock)
// found nothing to cancel and waits for the lock: the starts give way to
// it at once, as a background start yields to it (interruptible), instead
// of holding it behind a Start that may block until Close. A config
// change on its way does not count: validation under the lock may still
// refuse it, and a refused change must leave the connector as it was.
//
// Only starts run under it. The operation's stops and store writes run
// under the request's context without its cancel: the client leaving or an
// interrupt must not cut a stop short (the worker would abandon tasks still
// in Poll or Put), and the worker bounds stops by their graceful timeouts.
func (h *Standalone) startingFor(ctx context.Context, c *conn) (context.Context, func()) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(h.bgCtx, cancel)
	h.mu.Lock()
	c.cancelStart = cancel
	preempted := c.approaching > c.approachingChanges
	h.mu.Unlock()
	if preempted {
		h.logger(c).Info("an operation that interrupts starts is waiting for the connector; this operation's starts give way to it")
		cancel()
	}
	return sctx, func() {
		h.mu.Lock()
		c.cancelStart = nil
		h.mu.Unlock()
		stop()
		cancel()
	}
}

// classChangeErrorsFor is classChangeErrors for the class cfg names, if it
// is an installed plugin (an unknown one is validation's to report).
func (h *Standalone) classChangeErrorsFor(ctx context.Context, name string, old, cfg connect.Config) map[string][]string {
	next, ok := h.plugins.Lookup(strings.TrimSpace(cfg[KeyConnectorClass]))
	if !ok {
		return nil
	}
	return h.classChangeErrors(ctx, name, old, next)
}

// classChangeErrors refuses a new connector.class while the connector owns
// resources: only the plugin that created them can drop them, so a
// connector of another class could never be deleted cleanly.
func (h *Standalone) classChangeErrors(ctx context.Context, name string, old connect.Config, next connect.Plugin) map[string][]string {
	prev, ok := h.plugins.Lookup(strings.TrimSpace(old[KeyConnectorClass]))
	if !ok || prev.Class == next.Class {
		return nil
	}
	owned, err := h.store.Ledger(name).List(ctx)
	if err != nil {
		return map[string][]string{KeyConnectorClass: {fmt.Sprintf("cannot tell whether connector %s owns resources, so connector.class cannot change now (retry): %v", name, err)}}
	}
	if len(owned) == 0 {
		return nil
	}
	return map[string][]string{KeyConnectorClass: {fmt.Sprintf("connector.class cannot change from %s to %s: the connector owns %d resources (GET /connectors/%s/resources) that only %s can drop; delete the connector (dropping them) and create a new one, or keep %s", prev.Class, next.Class, len(owned), name, prev.Class, prev.Class)}}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (h *Standalone) deletionOf(c *conn) *store.DeletionIntent {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.deletion == nil {
		return nil
	}
	d := *c.deletion
	return &d
}

func (h *Standalone) setDeletion(c *conn, d *store.DeletionIntent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if d == nil {
		c.deletion = nil
		return
	}
	cp := *d
	c.deletion = &cp
}

// setRec and setFailure write what statusOf reads without c.op; c.op is
// held too, so c.op holders may read these fields without h.mu.
func (h *Standalone) setRec(c *conn, rec store.ConnectorRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.rec = rec
}

func (h *Standalone) setFailure(c *conn, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.failure = msg
}

func (h *Standalone) onStatus(connector string, task int, s worker.Status) {
	h.statusMu.Lock()
	defer h.statusMu.Unlock()
	h.statuses[worker.TaskID{Connector: connector, Task: task}] = s
}

func (h *Standalone) forgetStatuses(connector string, fromTask int) {
	h.statusMu.Lock()
	defer h.statusMu.Unlock()
	for id := range h.statuses {
		if id.Connector == connector && id.Task >= fromTask {
			delete(h.statuses, id)
		}
	}
}

func (h *Standalone) logger(c *conn) *slog.Logger { return h.log.With("connector", c.name) }

// --- Starting and stopping instances (c.op held)

// startLocked starts the connector instance in c.rec.Target, generates and
// persists task configs, and starts the tasks. Failures leave the
// connector FAILED (visible in its status), not an error: validation passed.
func (h *Standalone) startLocked(ctx context.Context, c *conn) {
	log := h.logger(c)
	if !c.hasPlugin {
		log.Error("cannot start connector", "error", c.failure)
		return
	}
	h.setFailure(c, "")
	h.forgetStatuses(c.name, -1)
	err := h.w.StartConnector(ctx, worker.ConnectorRun{Name: c.name, Config: c.rec.Config.Clone(), Ledger: h.store.Ledger(c.name), Target: c.rec.Target})
	c.inWorker = true
	if err != nil {
		c.running = false
		log.Error("connector failed to start; fix the cause and restart it", "error", err)
		h.onStatusIfMissing(c.name, -1, err)
		return
	}
	c.running = true
	if err := h.startTasksLocked(ctx, c, true); err != nil {
		h.setFailure(c, err.Error())
		log.Error("connector could not generate task configs; fix the cause and restart it", "error", err)
	}
}

// onStatusIfMissing records FAILED for an instance the worker reported
// nothing for, so a failure never shows as UNASSIGNED.
func (h *Standalone) onStatusIfMissing(connector string, task int, err error) {
	h.statusMu.Lock()
	defer h.statusMu.Unlock()
	id := worker.TaskID{Connector: connector, Task: task}
	if s, ok := h.statuses[id]; ok && s.State == worker.StateFailed {
		return
	}
	h.statuses[id] = worker.Status{State: worker.StateFailed, Trace: err.Error()}
}

// startTasksLocked asks the running connector for task configs (when
// regenerate is set), persists them and starts every task.
func (h *Standalone) startTasksLocked(ctx context.Context, c *conn, regenerate bool) error {
	if regenerate {
		cfgs, err := h.w.TaskConfigs(ctx, c.name)
		if err != nil {
			return fmt.Errorf("generating task configs: %w", err)
		}
		tasks := make([]connect.Config, len(cfgs))
		for i, tc := range cfgs {
			tasks[i] = connect.Config(tc).Clone()
		}
		if !reflect.DeepEqual(tasks, c.rec.Tasks) {
			rec := c.rec
			rec.Tasks = tasks
			rec.UpdatedAt = time.Now().UTC()
			if err := h.store.PutConnector(ctx, rec); err != nil {
				return fmt.Errorf("persisting task configs: %w", err)
			}
			h.setRec(c, rec)
		}
		h.forgetStatuses(c.name, len(tasks))
	}
	for i := range c.rec.Tasks {
		h.startTaskLocked(ctx, c, i)
	}
	return nil
}

func (h *Standalone) startTaskLocked(ctx context.Context, c *conn, i int) {
	id := worker.TaskID{Connector: c.name, Task: i}
	if s, ok := h.w.TaskStatus(id); ok && s.Abandoned {
		// Never two instances of one task: the abandoned one may still
		// write (offsets, the ledger) when its blocked call returns. The
		// worker tells abandonedGone when it has, which starts the task
		// then (if it is still wanted).
		msg := "task not started yet: its previous instance is still blocked in Poll/Put (or its final commit) past the graceful timeout; the task starts by itself once that instance returns"
		h.logger(c).Error(msg, "task", i)
		// Shown once the stuck instance is gone and until the held-back
		// start is made (before, the worker reports the stuck instance,
		// marked abandoned).
		h.statusMu.Lock()
		h.statuses[id] = worker.Status{State: worker.StateFailed, Trace: msg}
		h.statusMu.Unlock()
		if !slices.Contains(c.tasks, id) {
			c.tasks = append(c.tasks, id)
		}
		if c.heldBack == nil {
			c.heldBack = map[int]bool{}
		}
		c.heldBack[i] = true
		return
	}
	delete(c.heldBack, i)
	h.statusMu.Lock()
	delete(h.statuses, id)
	h.statusMu.Unlock()
	err := h.w.StartTask(ctx, worker.TaskRun{
		ID: id, ConnectorConfig: c.rec.Config.Clone(), TaskConfig: c.rec.Tasks[i].Clone(),
		Ledger: h.store.Ledger(c.name), Target: c.rec.Target,
	})
	if !slices.Contains(c.tasks, id) {
		c.tasks = append(c.tasks, id)
	}
	if err != nil {
		h.logger(c).Error("task failed to start; fix the cause and restart it", "task", i, "error", err)
		h.onStatusIfMissing(c.name, i, err)
	}
}

// topicSeen persists the active topics once a task used a new one, in a
// goroutine the herder owns and under the connector's lock (so the write
// cannot race a deletion's forget and bring its directory back). Before,
// they were persisted only when tasks stopped or on GET topics, and a crash
// lost them. One save at a time waits for the lock: the topics first used
// before it reads them (a burst, as when a sink is assigned many topics at
// once) are saved by it, not each by a goroutine and a write of its own.
func (h *Standalone) topicSeen(connector, _ string) {
	h.mu.Lock()
	c0 := h.conns[connector]
	if c0 == nil || c0.topicsPending {
		h.mu.Unlock()
		return
	}
	c0.topicsPending = true
	h.mu.Unlock()
	h.inBackground(func() {
		c, err := h.lookupLive(h.bgCtx, connector)
		// Cleared before the topics are read: one first used from now on
		// starts the next save.
		h.mu.Lock()
		c0.topicsPending = false
		h.mu.Unlock()
		if err != nil {
			return
		}
		defer c.unlock()
		if c == c0 {
			h.saveTopics(h.bgCtx, c)
		}
	})
}

// saveTopics keeps what the worker saw so GET topics survives restarts.
func (h *Standalone) saveTopics(ctx context.Context, c *conn) {
	if t := h.w.Topics(c.name); len(t) > 0 {
		if err := h.store.AddTopics(ctx, c.name, t); err != nil {
			h.logger(c).Warn("could not persist the connector's active topics", "error", err)
		}
	}
}

// stopTasksLocked stops the given tasks and waits.
func (h *Standalone) stopTasksLocked(ctx context.Context, c *conn, ids []worker.TaskID, deleted bool) map[worker.TaskID]error {
	if len(ids) == 0 {
		return nil
	}
	h.saveTopics(ctx, c)
	for _, id := range ids {
		delete(c.heldBack, id.Task) // stopped: no longer wanted
	}
	errs := h.w.StopTasks(ctx, ids, deleted)
	// An instance the worker still lists did not finish (abandoned after
	// the graceful timeout, or Stopped still running): it stays in c.tasks
	// so a deletion waits for it and a restart never runs a second
	// instance beside it.
	c.tasks = slices.DeleteFunc(c.tasks, func(id worker.TaskID) bool {
		return slices.Contains(ids, id) && !h.taskAlive(id)
	})
	for id, err := range errs {
		if err != nil {
			h.logger(c).Warn("task stop reported an error", "task", id.Task, "connector_deleted", deleted, "still_running", h.taskAlive(id), "error", err)
		}
	}
	return errs
}

// abandonedGone is the worker's word that the abandoned instance of id has
// finished and is forgotten. In a goroutine the herder owns (Close waits
// for it), under the connector's operation lock like every lifecycle
// operation, the herder forgets the instance too and makes the start it
// held back, if one is still wanted: the connector exists and is not being
// deleted, its target is RUNNING or PAUSED (the task starts in it), the
// task index is in its current task configs (whose config is used) and no
// instance of the task runs. Operations queued on the lock before it
// (restart, reconfiguration, pause, stop, deletion) apply first; those
// that stop the task drop the held-back start (a restart or
// reconfiguration makes its own start, held back again if need be).
func (h *Standalone) abandonedGone(id worker.TaskID) {
	h.inBackground(func() { h.startHeldBack(id) })
}

// startHeldBack starts the task held back behind an abandoned instance of
// id, which has returned, under the connector's lock. A stop, change or
// deletion that calls interruptStart while this waits for (or has just
// taken) the lock could not cancel the start, whose cancel is not
// registered yet, and would wait for a task Start that may block: when one
// has arrived, this yields the lock to it and tries again afterwards.
func (h *Standalone) startHeldBack(id worker.TaskID) {
	seen := h.interruptsOf(id.Connector)
	c, err := h.lookup(h.bgCtx, id.Connector)
	if err != nil {
		return // deleted, or the herder is closing
	}
	retry := false
	defer func() {
		c.unlock()
		if retry {
			h.inBackground(func() {
				if h.awaitApproaching(c) {
					h.startHeldBack(id)
				}
			})
			return
		}
		h.runHook(hookAbandonedGone, c.name)
	}()
	h.runHook(hookHeldBackLocked, c.name)
	if h.taskAlive(id) {
		return // another instance runs (or the id was reused)
	}
	c.tasks = slices.DeleteFunc(c.tasks, func(t worker.TaskID) bool { return t == id })
	if !c.heldBack[id.Task] {
		return
	}
	log := h.logger(c)
	switch {
	case h.bgCtx.Err() != nil:
		delete(c.heldBack, id.Task)
		return
	case h.deletionOf(c) != nil:
		delete(c.heldBack, id.Task)
		log.Info("the abandoned task instance returned; the connector is being deleted, so the task is not started", "task", id.Task)
		return
	case c.rec.Target == worker.TargetStopped:
		// RUNNING and PAUSED want their tasks (a paused task starts
		// paused); a STOPPED connector has none.
		delete(c.heldBack, id.Task)
		log.Info("the abandoned task instance returned; the connector is stopped, so the task is not started", "task", id.Task, "target_state", c.rec.Target)
		return
	case id.Task >= len(c.rec.Tasks):
		delete(c.heldBack, id.Task)
		log.Info("the abandoned task instance returned; the connector no longer has this task", "task", id.Task, "tasks", len(c.rec.Tasks))
		h.forgetStatuses(c.name, len(c.rec.Tasks))
		return
	}
	retry = !h.interruptible(c, seen, func(ctx context.Context) {
		delete(c.heldBack, id.Task)
		log.Info("the abandoned task instance returned; starting the task held back behind it", "task", id.Task, "target_state", c.rec.Target)
		h.startTaskLocked(ctx, c, id.Task)
	})
	if retry {
		log.Info("the abandoned task instance returned; an operation on the connector goes first, then the held-back task is looked at again", "task", id.Task)
	}
}

// taskAlive reports whether the worker still lists an instance of id after
// it was asked to stop it: the instance has not finished (Stopped has not
// returned).
func (h *Standalone) taskAlive(id worker.TaskID) bool {
	_, ok := h.w.TaskStatus(id)
	return ok
}

// stopConnectorLocked stops the connector instance, if the worker has one.
func (h *Standalone) stopConnectorLocked(ctx context.Context, c *conn, deleted bool) error {
	if !c.inWorker {
		return nil
	}
	err := h.w.StopConnector(ctx, c.name, deleted)
	c.inWorker, c.running = false, false
	if err != nil {
		h.logger(c).Warn("connector stop reported an error", "connector_deleted", deleted, "error", err)
	}
	return err
}

// stopAllLocked stops tasks, then the connector, never as a deletion.
func (h *Standalone) stopAllLocked(ctx context.Context, c *conn) {
	h.stopTasksLocked(ctx, c, slices.Clone(c.tasks), false)
	_ = h.stopConnectorLocked(ctx, c, false)
}

// --- Validation

func (h *Standalone) unknownClassMsg(class string) string {
	var names []string
	for _, p := range h.plugins.List() {
		names = append(names, p.Class)
	}
	if class == "" {
		return fmt.Sprintf("Missing required configuration %q; available connector classes: %s", KeyConnectorClass, strings.Join(names, ", "))
	}
	return fmt.Sprintf("Class %s could not be found; available connector classes: %s", class, strings.Join(names, ", "))
}

// validate checks cfg for connector name and returns the plugin, its spec
// and every error per key.
func (h *Standalone) validate(ctx context.Context, name string, cfg connect.Config) (connect.Plugin, connect.Spec, map[string][]string) {
	errs := map[string][]string{}
	if _, ok := cfg[KeyName]; !ok && name != "" {
		cfg = cfg.Clone()
		cfg[KeyName] = name // Kafka Connect keeps the name in the config
	}
	if n, ok := cfg[KeyName]; ok && name != "" && n != name {
		errs[KeyName] = append(errs[KeyName], fmt.Sprintf("Connector name in the config (%q) must match the name in the request (%q)", n, name))
	}
	class := strings.TrimSpace(cfg[KeyConnectorClass])
	p, ok := h.plugins.Lookup(class)
	if !ok {
		mergeErrs(errs, worker.ValidateCommon(connect.TypeUnknown, cfg))
		// "class not found" says more than "missing required".
		errs[KeyConnectorClass] = []string{h.unknownClassMsg(class)}
		return connect.Plugin{}, connect.Spec{Type: connect.TypeUnknown}, errs
	}
	inst := p.NewConnector()
	spec := inst.Spec()
	common := worker.ValidateCommon(spec.Type, cfg)
	mergeErrs(errs, common)
	// A plugin that declares a common key too (tasks.max, topics,
	// errors.tolerance) would report the same problem again in its own
	// words: the runtime's message stands alone.
	for k, msgs := range spec.Config.Validate(cfg) {
		if len(common[k]) == 0 {
			mergeErrs(errs, map[string][]string{k: msgs})
		}
	}
	// The connector's own checks may reach external systems: only worth it
	// once the definition checks pass.
	if v, ok := inst.(connect.Validator); ok && len(errs) == 0 {
		mergeErrs(errs, v.Validate(ctx, spec.Config.WithDefaults(cfg)))
	}
	return p, spec, errs
}

// addNameErr adds what is wrong with a new connector's name to errs, as an
// error of the key "name": Kafka Connect's validate reports a bad name so,
// and a create then names it together with the config's other errors.
// Existing connectors are not checked again (a rule added later must not
// lock their config).
func addNameErr(errs map[string][]string, name string) {
	if msg := ValidateName(name); msg != "" {
		mergeErrs(errs, map[string][]string{KeyName: {msg}})
	}
}

func checkTarget(t worker.TargetState) (worker.TargetState, error) {
	switch t {
	case "":
		return worker.TargetRunning, nil
	case worker.TargetRunning, worker.TargetPaused, worker.TargetStopped:
		return t, nil
	}
	return "", &BadRequestError{Msg: fmt.Sprintf("initial_state %q is invalid; use RUNNING, PAUSED or STOPPED", t)}
}

// --- API: connectors

func (h *Standalone) ClusterInfo(context.Context) (ClusterInfo, error) {
	return ClusterInfo{Version: version.Version, Commit: version.Commit, KafkaClusterID: h.clusterID}, nil
}

func (h *Standalone) Connectors(context.Context) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	names := slices.Collect(maps.Keys(h.conns))
	slices.Sort(names)
	return names, nil
}

func (h *Standalone) mask(c *conn, cfg connect.Config) connect.Config {
	return c.spec.Config.Merge(CommonConfigDef(c.spec.Type)).Mask(cfg)
}

func (h *Standalone) infoLocked(c *conn) ConnectorInfo {
	info := ConnectorInfo{Name: c.name, Config: h.mask(c, c.rec.Config), Type: c.spec.Type, Tasks: []worker.TaskID{}}
	for i := range c.rec.Tasks {
		info.Tasks = append(info.Tasks, worker.TaskID{Connector: c.name, Task: i})
	}
	return info
}

// snapshot reads what GET requests show without c.op: a stop or deletion
// stuck for minutes must not hold up reads (c.rec and c.spec are replaced
// whole under h.mu, never mutated in place).
func (h *Standalone) snapshot(name string) (store.ConnectorRecord, connect.Spec, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.conns[name]
	if c == nil {
		return store.ConnectorRecord{}, connect.Spec{}, false
	}
	return c.rec, c.spec, true
}

func maskWith(spec connect.Spec, cfg connect.Config) connect.Config {
	return spec.Config.Merge(CommonConfigDef(spec.Type)).Mask(cfg)
}

// unmaskWith puts back the stored secrets of old where cfg carries their
// masks (a client that read the masked config and wrote it back).
func unmaskWith(spec connect.Spec, cfg, old connect.Config) connect.Config {
	return spec.Config.Merge(CommonConfigDef(spec.Type)).Unmask(cfg, old)
}

func (h *Standalone) ConnectorInfo(ctx context.Context, name string) (ConnectorInfo, error) {
	rec, spec, ok := h.snapshot(name)
	if !ok {
		return ConnectorInfo{}, ErrNotFound
	}
	info := ConnectorInfo{Name: name, Config: maskWith(spec, rec.Config), Type: spec.Type, Tasks: []worker.TaskID{}}
	for i := range rec.Tasks {
		info.Tasks = append(info.Tasks, worker.TaskID{Connector: name, Task: i})
	}
	return info, nil
}

func (h *Standalone) TaskConfigs(ctx context.Context, name string) ([]TaskInfo, error) {
	rec, spec, ok := h.snapshot(name)
	if !ok {
		return nil, ErrNotFound
	}
	out := []TaskInfo{}
	for i, tc := range rec.Tasks {
		out = append(out, TaskInfo{ID: worker.TaskID{Connector: name, Task: i}, Config: maskWith(spec, tc)})
	}
	return out, nil
}

func (h *Standalone) CreateConnector(ctx context.Context, name string, cfg connect.Config, initial worker.TargetState) (ConnectorInfo, error) {
	// Other bad names are reported by validate, with the config's errors.
	if strings.TrimSpace(name) == "" {
		return ConnectorInfo{}, &BadRequestError{Msg: ValidateName(name)}
	}
	target, err := checkTarget(initial)
	if err != nil {
		return ConnectorInfo{}, err
	}
	if h.get(name) != nil {
		return ConnectorInfo{}, fmt.Errorf("connector %s %w", name, ErrAlreadyExists)
	}
	return h.create(ctx, name, cfg, target)
}

func (h *Standalone) create(ctx context.Context, name string, cfg connect.Config, target worker.TargetState) (ConnectorInfo, error) {
	p, spec, errs := h.validate(ctx, name, cfg)
	addNameErr(errs, name)
	if len(errs) > 0 {
		return ConnectorInfo{}, &ConfigError{Fields: errs}
	}
	cfg = cfg.Clone()
	cfg[KeyName] = name
	now := time.Now().UTC()
	// Created PAUSED, it is dormant: as in Kafka Connect (a WorkerConnector
	// going from INIT to PAUSED never calls start(), and no task configs are
	// generated while the target is not STARTED), nothing starts, neither
	// Start (which may provision) nor tasks, until it is resumed.
	c := &conn{name: name, op: make(chan struct{}, 1), plugin: p, spec: spec, hasPlugin: true,
		rec: store.ConnectorRecord{Name: name, Config: cfg, Target: target, Dormant: target == worker.TargetPaused, CreatedAt: now, UpdatedAt: now}}
	c.op <- struct{}{} // locked until started
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return ConnectorInfo{}, errors.New("herder: the worker is shutting down; retry against the restarted worker")
	}
	if _, exists := h.conns[name]; exists {
		h.mu.Unlock()
		return ConnectorInfo{}, fmt.Errorf("connector %s %w", name, ErrAlreadyExists)
	}
	h.conns[name] = c
	h.mu.Unlock()
	defer c.unlock()
	if err := h.store.PutConnector(ctx, c.rec); err != nil {
		h.mu.Lock()
		delete(h.conns, name)
		h.mu.Unlock()
		return ConnectorInfo{}, fmt.Errorf("herder: persisting connector %s: %w", name, err)
	}
	h.logger(c).Info("connector created", "class", cfg[KeyConnectorClass], "target_state", target, "config", h.mask(c, cfg))
	if target != worker.TargetStopped && !c.rec.Dormant {
		sctx, done := h.startingFor(ctx, c)
		h.startLocked(sctx, c)
		done()
	}
	return h.infoLocked(c), nil
}

func (h *Standalone) PutConnectorConfig(ctx context.Context, name string, cfg connect.Config) (ConnectorInfo, bool, error) {
	// Other bad names are reported by validate, with the config's errors.
	if strings.TrimSpace(name) == "" {
		return ConnectorInfo{}, false, &BadRequestError{Msg: ValidateName(name)}
	}
	var c *conn
	var interrupted bool
	for c == nil {
		if h.get(name) == nil {
			info, err := h.create(ctx, name, cfg, worker.TargetRunning)
			if errors.Is(err, ErrAlreadyExists) {
				// Created concurrently: fall through to reconfigure it.
			} else {
				return info, err == nil, err
			}
		}
		var arrived func()
		var err error
		interrupted, arrived, err = h.interruptStartFor(ctx, name, func(connect.Config) connect.Config { return cfg })
		if err != nil {
			return ConnectorInfo{}, false, err
		}
		c, err = h.lookup(ctx, name)
		arrived()
		if errors.Is(err, ErrNotFound) {
			// Deleted while this waited for it: PUT creates it anew, as
			// Kafka Connect's herder applying the two in order does.
			continue
		}
		if err != nil {
			return ConnectorInfo{}, false, err
		}
	}
	defer c.unlock()
	if h.deletionOf(c) != nil {
		info, err := h.reconfigureDeletingLocked(ctx, c, cfg)
		return info, false, err
	}
	info, err := h.reconfigureLocked(ctx, c, cfg)
	h.resumeIfRefused(name, interrupted, err)
	return info, false, err
}

// resumeIfRefused calls resumeInterruptedStart when a change that
// interrupted a start was refused by validation under the lock.
func (h *Standalone) resumeIfRefused(name string, interrupted bool, err error) {
	var ce *ConfigError
	if interrupted && errors.As(err, &ce) {
		h.resumeInterruptedStart(name)
	}
}

func (h *Standalone) PatchConnectorConfig(ctx context.Context, name string, patch map[string]*string) (ConnectorInfo, error) {
	apply := func(cfg connect.Config) connect.Config {
		for k, v := range patch {
			if v == nil {
				delete(cfg, k)
			} else {
				cfg[k] = *v
			}
		}
		return cfg
	}
	interrupted, arrived, err := h.interruptStartFor(ctx, name, apply)
	if err != nil {
		return ConnectorInfo{}, err
	}
	c, err := h.lookup(ctx, name)
	arrived()
	if err != nil {
		return ConnectorInfo{}, err
	}
	defer c.unlock()
	d := h.deletionOf(c)
	cfg := c.rec.Config.Clone()
	if d != nil && len(d.Config) > 0 {
		cfg = d.Config.Clone()
	}
	cfg = apply(cfg)
	if d != nil {
		return h.reconfigureDeletingLocked(ctx, c, cfg)
	}
	info, err := h.reconfigureLocked(ctx, c, cfg)
	h.resumeIfRefused(name, interrupted, err)
	return info, err
}

// reconfigureDeletingLocked replaces the config of a connector whose
// deletion has not completed, so the operator can fix what makes the
// cleanup fail (a rotated password, a moved server). The connector stays in
// deletion: nothing is started; a connector instance still running with the
// old config is stopped (never as a deletion: its resources stay in the
// ledger) so that the next attempt starts a cleanup-only instance with the
// new config. The intent holds the config durably.
func (h *Standalone) reconfigureDeletingLocked(ctx context.Context, c *conn, cfg connect.Config) (ConnectorInfo, error) {
	d := h.deletionOf(c)
	old := d.Config
	if len(old) == 0 {
		old = c.rec.Config
	}
	if c.hasPlugin {
		cfg = unmaskWith(c.spec, cfg, old)
	}
	p, spec, errs := h.validate(ctx, c.name, cfg)
	if prev, ok := h.plugins.Lookup(old[KeyConnectorClass]); ok && (len(errs[KeyConnectorClass]) > 0 || p.Class != prev.Class) {
		// The cleanup must run the plugin that created the resources.
		errs[KeyConnectorClass] = []string{fmt.Sprintf("connector.class cannot change while the connector is being deleted; keep %s so that its cleanup drops what it created", prev.Class)}
	}
	if len(errs) > 0 {
		return ConnectorInfo{}, &ConfigError{Fields: errs}
	}
	cfg = cfg.Clone()
	cfg[KeyName] = c.name
	now := time.Now().UTC()
	in := *d
	in.Config = cfg
	in.UpdatedAt = now
	if err := h.store.PutIntent(ctx, in); err != nil {
		return ConnectorInfo{}, fmt.Errorf("herder: persisting the new config of connector %s, which is being deleted (nothing changed; retry): %w", c.name, err)
	}
	// The change is made: the client going away cuts neither the record's
	// update nor the stop (decision 0025).
	ctx = context.WithoutCancel(ctx)
	h.setDeletion(c, &in)
	rec := c.rec
	rec.Config = cfg
	rec.UpdatedAt = now
	// The record follows so GET shows what the next attempt uses; a record
	// already forgotten is not brought back (the intent is authoritative).
	if _, ok, err := h.store.Connector(ctx, c.name); err == nil && ok {
		if err := h.store.PutConnector(ctx, rec); err != nil {
			h.logger(c).Warn("could not update the stored config record of a connector being deleted; the deletion uses the new config anyway", "error", err)
		}
	}
	if c.running {
		// Its Stopped would clean up with the old config.
		_ = h.stopConnectorLocked(ctx, c, false)
	}
	h.mu.Lock()
	c.rec, c.plugin, c.spec, c.hasPlugin, c.failure = rec, p, spec, true, ""
	h.mu.Unlock()
	h.logger(c).Info("config of a connector being deleted replaced; the next deletion attempt uses it", "phase", in.Phase, "config", h.mask(c, cfg))
	return h.infoLocked(c), nil
}

// reconfigureLocked validates the new config, stops the running instances
// (never as a deletion), persists and starts them again.
func (h *Standalone) reconfigureLocked(ctx context.Context, c *conn, cfg connect.Config) (ConnectorInfo, error) {
	if c.hasPlugin {
		// A client that read the masked config and wrote it back must not
		// replace the secret with the mask.
		cfg = unmaskWith(c.spec, cfg, c.rec.Config)
	}
	p, spec, errs := h.validate(ctx, c.name, cfg)
	// Named whatever else is wrong: the other errors are the new plugin's,
	// and fixing them would not make the change possible.
	mergeErrs(errs, h.classChangeErrorsFor(ctx, c.name, c.rec.Config, cfg))
	if len(errs) > 0 {
		return ConnectorInfo{}, &ConfigError{Fields: errs}
	}
	cfg = cfg.Clone()
	cfg[KeyName] = c.name
	rec := c.rec
	rec.Config = cfg
	rec.Tasks = nil
	rec.UpdatedAt = time.Now().UTC()
	octx := context.WithoutCancel(ctx) // see startingFor
	sctx, done := h.startingFor(ctx, c)
	defer done()
	h.stopAllLocked(octx, c)
	if err := h.store.PutConnector(octx, rec); err != nil {
		// The old config is still stored: bring the old instances back.
		if c.rec.Target != worker.TargetStopped && !c.rec.Dormant {
			h.startLocked(sctx, c)
		}
		return ConnectorInfo{}, fmt.Errorf("herder: persisting the new config of connector %s: %w", c.name, err)
	}
	h.mu.Lock()
	// The old instance's failure (an unknown class, its task configs) is
	// gone with it; a start below reports its own.
	c.rec, c.plugin, c.spec, c.hasPlugin, c.failure = rec, p, spec, true, ""
	h.mu.Unlock()
	h.logger(c).Info("connector reconfigured", "config", h.mask(c, cfg))
	if rec.Target != worker.TargetStopped && !rec.Dormant {
		h.startLocked(sctx, c)
	}
	return h.infoLocked(c), nil
}

// --- API: target states

func (h *Standalone) setTarget(ctx context.Context, c *conn, t worker.TargetState) error {
	if c.rec.Target == t {
		return nil
	}
	rec := c.rec
	// Paused while STOPPED (or still dormant): not started until resumed.
	rec.Dormant = t == worker.TargetPaused && (c.rec.Target == worker.TargetStopped || c.rec.Dormant)
	rec.Target = t
	rec.UpdatedAt = time.Now().UTC()
	if t == worker.TargetStopped {
		rec.Tasks = nil // as in Kafka Connect: a stopped connector has no tasks
	}
	if err := h.store.PutConnector(ctx, rec); err != nil {
		return fmt.Errorf("herder: persisting the target state of connector %s: %w", c.name, err)
	}
	h.setRec(c, rec)
	return nil
}

func (h *Standalone) Pause(ctx context.Context, name string) error {
	return h.changeTarget(ctx, name, worker.TargetPaused)
}

func (h *Standalone) Resume(ctx context.Context, name string) error {
	return h.changeTarget(ctx, name, worker.TargetRunning)
}

func (h *Standalone) changeTarget(ctx context.Context, name string, t worker.TargetState) error {
	c, err := h.lookupLive(ctx, name)
	if err != nil {
		return err
	}
	defer c.unlock()
	wasStopped := c.rec.Target == worker.TargetStopped
	if err := h.setTarget(ctx, c, t); err != nil {
		return err
	}
	h.logger(c).Info("connector target state changed", "target_state", t)
	ctx, done := h.startingFor(ctx, c)
	defer done()
	if c.rec.Dormant {
		// As Kafka Connect (WorkerConnector.suspend): pausing a STOPPED
		// connector starts nothing, no Start (which may provision) and no
		// tasks; it reads PAUSED, and resume starts it.
		return nil
	}
	if wasStopped || !c.inWorker {
		h.startLocked(ctx, c)
		return nil
	}
	// Pause is no stop: the worker only cancels Poll/Put.
	h.w.SetTargetState(name, t)
	return nil
}

func (h *Standalone) Stop(ctx context.Context, name string) error {
	arrived := h.interruptStart(name)
	c, err := h.lookupLive(ctx, name)
	arrived()
	if err != nil {
		return err
	}
	defer c.unlock()
	if err := h.setTarget(ctx, c, worker.TargetStopped); err != nil {
		return err
	}
	// Not cut by the client going away (see startingFor): the worker would
	// abandon tasks still in Poll or Put and cut their Stopped.
	h.stopAllLocked(context.WithoutCancel(ctx), c)
	h.forgetStatuses(name, 0)
	if c.hasPlugin {
		// A failure of the instance just stopped (its task configs, a
		// start this stop interrupted) is no longer the connector's: it
		// reads STOPPED, as in Kafka Connect. Without a plugin it stays.
		h.setFailure(c, "")
	}
	h.logger(c).Info("connector stopped")
	return nil
}

// --- API: restart

func (h *Standalone) Restart(ctx context.Context, name string, includeTasks, onlyFailed bool) (ConnectorStatus, error) {
	arrived := h.interruptStart(name)
	c, err := h.lookupLive(ctx, name)
	arrived()
	if err != nil {
		return ConnectorStatus{}, err
	}
	defer c.unlock()
	st := h.statusOf(c)
	if c.rec.Target == worker.TargetStopped || c.rec.Dormant {
		// Nothing runs, so nothing restarts: the connector comes back in
		// its target state at once. The answer still shows RESTARTING,
		// as Kafka Connect's restart plan does (AbstractHerder).
		if !onlyFailed || st.Connector.State == worker.StateFailed {
			st.Connector.State = worker.StateRestarting
			st.Connector.Trace = ""
		}
		return st, nil
	}
	restartConn := !onlyFailed || st.Connector.State == worker.StateFailed
	var restartTasks []worker.TaskID
	if includeTasks {
		for i, ts := range st.Tasks {
			if !onlyFailed || ts.State == worker.StateFailed {
				restartTasks = append(restartTasks, worker.TaskID{Connector: name, Task: st.Tasks[i].ID})
				st.Tasks[i].State = worker.StateRestarting
				st.Tasks[i].Trace = ""
			}
		}
	}
	if restartConn {
		st.Connector.State = worker.StateRestarting
		st.Connector.Trace = ""
	}
	log := h.logger(c)
	log.Info("restarting", "connector_restart", restartConn, "tasks", len(restartTasks))
	octx := context.WithoutCancel(ctx) // see startingFor
	sctx, done := h.startingFor(ctx, c)
	defer done()
	h.stopTasksLocked(octx, c, restartTasks, false)
	if restartConn {
		_ = h.stopConnectorLocked(octx, c, false)
		old := c.rec.Tasks
		h.forgetStatuses(name, -1)
		err := h.w.StartConnector(sctx, worker.ConnectorRun{Name: name, Config: c.rec.Config.Clone(), Ledger: h.store.Ledger(name), Target: c.rec.Target})
		c.inWorker = true
		c.running = err == nil
		h.setFailure(c, "")
		if err != nil {
			log.Error("connector failed to start on restart", "error", err)
			h.onStatusIfMissing(name, -1, err)
		} else {
			cfgs, err := h.w.TaskConfigs(sctx, name)
			switch {
			case err != nil:
				h.setFailure(c, fmt.Sprintf("generating task configs: %v", err))
			case !sameConfigs(cfgs, old) || len(c.tasks) < len(old):
				// New task configs: every task restarts with them.
				h.stopTasksLocked(octx, c, slices.Clone(c.tasks), false)
				tasks := make([]connect.Config, len(cfgs))
				for i, tc := range cfgs {
					tasks[i] = connect.Config(tc).Clone()
				}
				rec := c.rec
				rec.Tasks = tasks
				if err := h.store.PutConnector(octx, rec); err != nil {
					h.setFailure(c, fmt.Sprintf("persisting task configs: %v", err))
					break
				}
				h.setRec(c, rec)
				h.forgetStatuses(name, len(tasks))
				for i := range c.rec.Tasks {
					h.startTaskLocked(sctx, c, i)
				}
				restartTasks = nil
			}
		}
	}
	for _, id := range restartTasks {
		if id.Task < len(c.rec.Tasks) {
			h.startTaskLocked(sctx, c, id.Task)
		}
	}
	return st, nil
}

func sameConfigs(a []map[string]string, b []connect.Config) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !maps.Equal(a[i], map[string]string(b[i])) {
			return false
		}
	}
	return true
}

func (h *Standalone) RestartTask(ctx context.Context, id worker.TaskID) error {
	c, err := h.lookupLive(ctx, id.Connector)
	if err != nil {
		return err
	}
	defer c.unlock()
	if id.Task < 0 || id.Task >= len(c.rec.Tasks) {
		return ErrTaskNotFound
	}
	h.logger(c).Info("restarting task", "task", id.Task)
	sctx, done := h.startingFor(ctx, c)
	defer done()
	h.stopTasksLocked(context.WithoutCancel(ctx), c, []worker.TaskID{id}, false) // see startingFor
	h.startTaskLocked(sctx, c, id.Task)
	return nil
}

// --- API: status

func (h *Standalone) ConnectorStatus(ctx context.Context, name string) (ConnectorStatus, error) {
	c := h.get(name)
	if c == nil {
		return ConnectorStatus{}, ErrNotFound
	}
	// Status must answer during a long deletion: read without c.op.
	return h.statusOf(c), nil
}

func (h *Standalone) TaskStatus(ctx context.Context, id worker.TaskID) (TaskStatus, error) {
	c := h.get(id.Connector)
	if c == nil {
		return TaskStatus{}, ErrNotFound
	}
	st := h.statusOf(c)
	for _, t := range st.Tasks {
		if t.ID == id.Task {
			return t, nil
		}
	}
	return TaskStatus{}, ErrTaskNotFound
}

func (h *Standalone) instanceStatus(id worker.TaskID) (worker.Status, bool) {
	var s worker.Status
	var ok bool
	if id.Task < 0 {
		s, ok = h.w.ConnectorStatus(id.Connector)
	} else {
		s, ok = h.w.TaskStatus(id)
	}
	if ok {
		if s.State == "" {
			// Its Start has not returned yet (a start at boot blocked on an
			// unreachable system): not started, so UNASSIGNED, as before
			// the start began (decision 0022), never an empty state;
			// unless the herder gave up on that Start (its caller's
			// context ended) and recorded it FAILED (onStatusIfMissing):
			// that failure is the instance's state.
			h.statusMu.Lock()
			rec, recorded := h.statuses[id]
			h.statusMu.Unlock()
			if recorded && rec.State == worker.StateFailed {
				rec.WorkerID, rec.Abandoned = s.WorkerID, rec.Abandoned || s.Abandoned
				return rec, true
			}
			s.State = worker.StateUnassigned
		}
		return s, true
	}
	h.statusMu.Lock()
	defer h.statusMu.Unlock()
	s, ok = h.statuses[id]
	return s, ok
}

// statusOf builds the status from the worker, the listener's last reports
// and the herder's own knowledge. It reads c.rec without c.op: the fields
// it reads are replaced whole, never mutated in place.
func (h *Standalone) statusOf(c *conn) ConnectorStatus {
	h.mu.Lock()
	rec, failure, spec := c.rec, c.failure, c.spec
	var del *store.DeletionIntent
	if c.deletion != nil {
		d := *c.deletion
		del = &d
	}
	h.mu.Unlock()
	st := ConnectorStatus{Name: c.name, Type: spec.Type, Tasks: []TaskStatus{}}
	s, ok := h.instanceStatus(worker.TaskID{Connector: c.name, Task: -1})
	switch {
	case del != nil && del.Phase != store.PhaseStoppingTasks && del.Phase != store.PhaseStoppingConnector && del.Phase != store.PhaseForgetting:
		trace := del.LastError
		if trace == "" {
			trace = "deletion pending: " + del.Phase
		}
		s = worker.Status{State: worker.StateFailed, Trace: trace}
	case failure != "":
		s = worker.Status{State: worker.StateFailed, Trace: failure}
	case rec.Target == worker.TargetStopped:
		s = worker.Status{State: worker.StateStopped}
	case rec.Dormant || rec.Target == worker.TargetPaused && !ok:
		// Paused while STOPPED (not started), whatever the worker last
		// reported of the instance stopped before.
		s = worker.Status{State: worker.StatePaused}
	case ok:
	default:
		s = worker.Status{State: worker.StateUnassigned}
	}
	if s.WorkerID == "" {
		s.WorkerID = h.workerID
	}
	st.Connector = s
	if del == nil && rec.Target != worker.TargetStopped || del != nil && len(rec.Tasks) > 0 {
		for i := range rec.Tasks {
			ts, ok := h.instanceStatus(worker.TaskID{Connector: c.name, Task: i})
			if !ok || ts.State == worker.StateStopped {
				ts = worker.Status{State: worker.StateUnassigned}
			}
			if ts.WorkerID == "" {
				ts.WorkerID = h.workerID
			}
			st.Tasks = append(st.Tasks, TaskStatus{ID: i, Status: ts})
		}
	}
	if del != nil {
		remaining, _ := h.store.Ledger(c.name).List(context.Background())
		st.Deletion = &Deletion{Phase: del.Phase, Remaining: remaining, Error: del.LastError, Attempts: del.Attempts, StartedAt: del.StartedAt}
	}
	return st
}

// --- API: offsets

func (h *Standalone) Offsets(ctx context.Context, name string) (ConnectorOffsets, error) {
	// Reading works any time, also during a long stop or deletion: no c.op.
	c := h.get(name)
	if c == nil {
		return ConnectorOffsets{}, ErrNotFound
	}
	h.mu.Lock()
	typ := c.spec.Type
	h.mu.Unlock()
	if typ == connect.TypeSink {
		return h.sinkOffsets(ctx, name)
	}
	offs, err := h.store.AllOffsets(ctx, name)
	if err != nil {
		return ConnectorOffsets{}, fmt.Errorf("herder: reading the offsets of connector %s: %w", name, err)
	}
	if offs == nil {
		offs = []worker.SourceOffset{}
	}
	return ConnectorOffsets{Offsets: offs}, nil
}

func (h *Standalone) requireAdmin() error {
	if h.adm == nil {
		return errors.New("herder: no Kafka admin client configured, so sink offsets (consumer group connect-<name>) are unavailable")
	}
	return nil
}

func (h *Standalone) sinkOffsets(ctx context.Context, name string) (ConnectorOffsets, error) {
	if err := h.requireAdmin(); err != nil {
		return ConnectorOffsets{}, err
	}
	resp, err := h.adm.FetchOffsets(ctx, SinkGroup(name))
	if isGroupGone(err) {
		// No group yet (nothing consumed, or the offsets were reset): no
		// offsets, as Kafka Connect answers, not a failure.
		return ConnectorOffsets{Offsets: []worker.SourceOffset{}}, nil
	}
	if err != nil {
		return ConnectorOffsets{}, fmt.Errorf("herder: fetching the offsets of consumer group %s (is Kafka reachable?): %w", SinkGroup(name), err)
	}
	out := ConnectorOffsets{Offsets: []worker.SourceOffset{}}
	for _, o := range resp.Sorted() {
		if o.Err != nil || o.At < 0 {
			continue
		}
		out.Offsets = append(out.Offsets, worker.SourceOffset{
			Partition: map[string]any{"kafka_topic": o.Topic, "kafka_partition": o.Partition},
			Offset:    map[string]any{"kafka_offset": o.At},
		})
	}
	return out, nil
}

// lookupStopped locks a connector whose offsets may change: STOPPED and no
// instance running.
func (h *Standalone) lookupStopped(ctx context.Context, name string) (*conn, error) {
	c, err := h.lookupLive(ctx, name)
	if err != nil {
		return nil, err
	}
	if c.rec.Target == worker.TargetStopped && !c.inWorker && len(c.tasks) > 0 {
		c.unlock()
		return nil, fmt.Errorf("connector %s: %w: task(s) %v did not return from Poll/Put after being stopped and may still commit offsets; retry once they have returned (PUT /connectors/%s/stop retries stopping them)", name, ErrNotStopped, c.tasks, name)
	}
	if c.rec.Target != worker.TargetStopped || c.inWorker || len(c.tasks) > 0 {
		c.unlock()
		return nil, fmt.Errorf("connector %s: %w; stop it with PUT /connectors/%s/stop first", name, ErrNotStopped, name)
	}
	return c, nil
}

func (h *Standalone) AlterOffsets(ctx context.Context, name string, offsets ConnectorOffsets) error {
	c, err := h.lookupStopped(ctx, name)
	if err != nil {
		return err
	}
	defer c.unlock()
	if c.spec.Type == connect.TypeSink {
		return h.alterSinkOffsets(ctx, name, offsets)
	}
	var msgs []string
	for i, o := range offsets.Offsets {
		if len(o.Partition) == 0 {
			msgs = append(msgs, fmt.Sprintf("offsets[%d].partition must be a non-empty object", i))
		}
	}
	if len(msgs) > 0 {
		return &BadRequestError{Msg: "invalid source offsets: " + strings.Join(msgs, "; ")}
	}
	if err := h.store.Put(ctx, name, offsets.Offsets); err != nil {
		return fmt.Errorf("herder: storing offsets of connector %s: %w", name, err)
	}
	h.logger(c).Info("source offsets altered", "partitions", len(offsets.Offsets))
	return nil
}

// asInt reads a sink partition or offset number of at most bits bits: a
// whole number, or a string of one (Kafka Connect accepts both "10" and
// 10). Out of range is refused: a partition of 2^32 must not wrap around
// to partition 0.
func asInt(v any, bits int) (int64, bool) {
	var s string
	switch n := v.(type) {
	case float64:
		if n != math.Trunc(n) || math.Abs(n) >= 1<<63 {
			return 0, false
		}
		s = strconv.FormatInt(int64(n), 10)
	case int:
		s = strconv.Itoa(n)
	case int32:
		s = strconv.FormatInt(int64(n), 10)
	case int64:
		s = strconv.FormatInt(n, 10)
	case json.Number:
		s = n.String()
	case string:
		s = strings.TrimSpace(n)
	default:
		return 0, false
	}
	i, err := strconv.ParseInt(s, 10, bits)
	return i, err == nil
}

func (h *Standalone) alterSinkOffsets(ctx context.Context, name string, offsets ConnectorOffsets) error {
	if err := h.requireAdmin(); err != nil {
		return err
	}
	var msgs []string
	commit := kadm.Offsets{}
	del := kadm.TopicsSet{}
	for i, o := range offsets.Offsets {
		topic, ok := o.Partition["kafka_topic"].(string)
		if !ok || topic == "" {
			msgs = append(msgs, fmt.Sprintf("offsets[%d].partition.kafka_topic must be a topic name", i))
		}
		part, ok := asInt(o.Partition["kafka_partition"], 32)
		if !ok || part < 0 {
			msgs = append(msgs, fmt.Sprintf("offsets[%d].partition.kafka_partition must be a partition number (0 to 2147483647): %v", i, o.Partition["kafka_partition"]))
		}
		if o.Offset == nil {
			del.Add(topic, int32(part))
			continue
		}
		at, ok := asInt(o.Offset["kafka_offset"], 64)
		if !ok || at < 0 {
			msgs = append(msgs, fmt.Sprintf("offsets[%d].offset.kafka_offset must be an offset (0 or more), or the whole offset null to reset", i))
			continue
		}
		commit.Add(kadm.Offset{Topic: topic, Partition: int32(part), At: at, LeaderEpoch: -1})
	}
	if len(msgs) > 0 {
		return &BadRequestError{Msg: "invalid sink offsets: " + strings.Join(msgs, "; ")}
	}
	group := SinkGroup(name)
	if len(commit) > 0 {
		resp, err := h.adm.CommitOffsets(ctx, group, commit)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			return fmt.Errorf("herder: committing offsets for consumer group %s: %w", group, err)
		}
	}
	if len(del) > 0 {
		resp, err := h.adm.DeleteOffsets(ctx, group, del)
		if err == nil {
			err = resp.Error()
		}
		if err != nil && !isGroupGone(err) {
			return fmt.Errorf("herder: deleting offsets of consumer group %s: %w", group, err)
		}
	}
	h.log.Info("sink offsets altered", "connector", name, "group", group, "committed", len(commit), "reset", len(del))
	return nil
}

// dropSinkGroup deletes the consumer group of a sink, its committed
// offsets first, each with OffsetDelete. The embedded broker (kfake) logs an
// offset deletion durably but not a DeleteGroups, which reaches its data
// only at a clean shutdown: after a crash (kill -9) the deleted group came
// back with every offset, so a sink re-created under the name, or one whose
// offsets were reset, resumed where the old one had stopped and never got
// the records before. A real cluster persists both; there the offset
// deletion is merely redundant.
//
// A group with members is left alone, as DeleteGroups leaves it
// (NON_EMPTY_GROUP): OffsetDelete refuses only the topics the members
// subscribe to, and would delete the others' offsets in an operation that
// then fails.
func (h *Standalone) dropSinkGroup(ctx context.Context, group string) error {
	described, err := h.adm.DescribeGroups(ctx, group)
	if err != nil && !isGroupGone(err) {
		return fmt.Errorf("describing it: %w", err)
	}
	if d, ok := described[group]; ok {
		switch {
		case d.Err != nil && !isGroupGone(d.Err):
			return fmt.Errorf("describing it: %w", d.Err)
		case len(d.Members) > 0:
			return fmt.Errorf("the group has %d active member(s) (state %s): %w (a member whose leave timed out stays until its session times out); nothing was deleted, retry once it is empty", len(d.Members), d.State, errGroupHasMembers)
		}
	}
	offs, err := h.adm.FetchOffsets(ctx, group)
	if isGroupGone(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fetching its offsets: %w", err)
	}
	del := kadm.TopicsSet{}
	for _, o := range offs.Sorted() {
		if o.Err == nil && o.At >= 0 {
			del.Add(o.Topic, o.Partition)
		}
	}
	if len(del) > 0 {
		resp, err := h.adm.DeleteOffsets(ctx, group, del)
		if err == nil {
			err = resp.Error()
		}
		if err != nil && !isGroupGone(err) {
			return fmt.Errorf("deleting its offsets: %w", err)
		}
	}
	if _, err := h.adm.DeleteGroup(ctx, group); err != nil && !isGroupGone(err) {
		return err
	}
	return nil
}

// errGroupHasMembers is dropSinkGroup's error for a group a consumer still
// belongs to.
var errGroupHasMembers = errors.New("a consumer still uses it")

func isGroupGone(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "GROUP_ID_NOT_FOUND") || strings.Contains(err.Error(), "does not exist"))
}

func (h *Standalone) ResetOffsets(ctx context.Context, name string) error {
	c, err := h.lookupStopped(ctx, name)
	if err != nil {
		return err
	}
	defer c.unlock()
	if c.spec.Type == connect.TypeSink {
		if err := h.requireAdmin(); err != nil {
			return err
		}
		if err := h.dropSinkGroup(ctx, SinkGroup(name)); err != nil {
			return fmt.Errorf("herder: deleting consumer group %s: %w", SinkGroup(name), err)
		}
	} else if err := h.store.DeleteOffsets(ctx, name); err != nil {
		return fmt.Errorf("herder: resetting the offsets of connector %s: %w", name, err)
	}
	h.logger(c).Info("offsets reset")
	return nil
}

// --- API: topics and resources

func (h *Standalone) Topics(ctx context.Context, name string) ([]string, error) {
	// Never waits for c.op (a stuck stop must not hold up reads). The
	// worker's topics are persisted only if c.op is free at once: unlocked,
	// the write could race a deletion's forget and bring back the
	// connector's directory. The answer is the stored topics plus what the
	// worker saw either way.
	c := h.get(name)
	if c == nil {
		return nil, ErrNotFound
	}
	select {
	case c.op <- struct{}{}:
		if h.get(name) == c && h.deletionOf(c) == nil {
			h.saveTopics(ctx, c)
		}
		c.unlock()
	default:
	}
	t, err := h.store.Topics(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("herder: reading the topics of connector %s: %w", name, err)
	}
	for _, w := range h.w.Topics(name) {
		if !slices.Contains(t, w) {
			t = append(t, w)
		}
	}
	slices.Sort(t)
	if t == nil {
		t = []string{}
	}
	return t, nil
}

func (h *Standalone) ResetTopics(ctx context.Context, name string) error {
	c, err := h.lookup(ctx, name)
	if err != nil {
		return err
	}
	defer c.unlock()
	if r, ok := h.w.(interface{ ResetTopics(string) }); ok {
		r.ResetTopics(name)
	}
	return h.store.ResetTopics(ctx, name)
}

func (h *Standalone) Resources(ctx context.Context, name string) ([]connect.Resource, error) {
	if h.get(name) == nil {
		return nil, ErrNotFound
	}
	r, err := h.store.Ledger(name).List(ctx)
	if r == nil {
		r = []connect.Resource{}
	}
	return r, err
}

// --- API: plugins and validation

func (h *Standalone) Plugins(context.Context) ([]PluginInfo, error) {
	var out []PluginInfo
	for _, p := range h.plugins.List() {
		s := p.NewConnector().Spec()
		out = append(out, PluginInfo{Class: p.Class, Type: s.Type, Version: s.Version})
	}
	return out, nil
}

func (h *Standalone) PluginConfig(_ context.Context, class string) (connect.ConfigDef, error) {
	p, ok := h.plugins.Lookup(class)
	if !ok {
		return nil, ErrNotFound
	}
	return p.NewConnector().Spec().Config, nil
}

// SamePlugin reports whether two connector.class values name the same
// installed plugin (a class and its aliases do).
func (h *Standalone) SamePlugin(a, b string) bool {
	pa, ok := h.plugins.Lookup(strings.TrimSpace(a))
	if !ok {
		return false
	}
	pb, ok := h.plugins.Lookup(strings.TrimSpace(b))
	return ok && pa.Class == pb.Class
}

func (h *Standalone) Validate(ctx context.Context, class string, cfg connect.Config) (Validation, error) {
	p, ok := h.plugins.Lookup(class)
	if !ok {
		return Validation{}, &BadRequestError{Msg: h.unknownClassMsg(class)}
	}
	cfg = cfg.Clone()
	if cfg[KeyConnectorClass] == "" {
		cfg[KeyConnectorClass] = class
	}
	_, spec, errs := h.validate(ctx, "", cfg)
	if n := cfg[KeyName]; strings.TrimSpace(n) != "" { // blank: the required key's error
		addNameErr(errs, n)
	}
	def := CommonConfigDef(spec.Type).Merge(spec.Config)
	masked := def.Mask(cfg)
	v := Validation{Name: p.Class}
	for _, k := range def {
		vk := ValidatedKey{Definition: k, Errors: errs[k.Name], Visible: true}
		if vk.Errors == nil {
			vk.Errors = []string{}
		}
		if val, ok := masked[k.Name]; ok {
			vk.Value = &val
		} else if k.Default != "" {
			d := k.Default
			if k.Type == connect.TypePassword {
				d = connect.HiddenValue
			}
			vk.Value = &d
		}
		v.ErrorCount += len(vk.Errors)
		if k.Group != "" && !slices.Contains(v.Groups, k.Group) {
			v.Groups = append(v.Groups, k.Group)
		}
		v.Configs = append(v.Configs, vk)
	}
	if v.Groups == nil {
		v.Groups = []string{}
	}
	return v, nil
}

// inBackground runs f in a goroutine the herder owns (Close waits for it),
// unless Close has begun: bgWG.Add happens under h.mu, never after Close
// started waiting.
func (h *Standalone) inBackground(f func()) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.bgWG.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.bgWG.Done()
		f()
	}()
}

// requestReconfiguration re-reads a running connector's task configs and
// restarts its tasks if they changed. It runs in a goroutine the herder
// owns (Close waits for it), so the calling connector is never blocked.
//
// Its task starts can be interrupted like a start at boot (interruptStart):
// a task Start blocked on an unreachable system would otherwise hold the
// connector's lock until Close, and every stop, change or deletion would
// time out behind it. Like startHeldBack, it yields to an operation that
// asked for an interrupt before its cancel was registered, and looks again
// afterwards.
func (h *Standalone) requestReconfiguration(name string) {
	h.inBackgroundLocked(name, func(c *conn, seen uint64) (retry bool) {
		if !c.running || c.rec.Target == worker.TargetStopped {
			return false
		}
		return !h.interruptible(c, seen, func(ctx context.Context) {
			cfgs, err := h.w.TaskConfigs(ctx, name)
			if err != nil {
				h.logger(c).Warn("task reconfiguration requested, but the task configs could not be read", "error", err)
				return
			}
			if sameConfigs(cfgs, c.rec.Tasks) {
				return
			}
			h.logger(c).Info("task configs changed; restarting the tasks", "tasks", len(cfgs))
			// Only the starts are interruptible: an interrupt must not cut
			// the stop short (the worker would abandon tasks still in Poll
			// or Put); the worker bounds it by the graceful timeout.
			h.stopTasksLocked(context.WithoutCancel(ctx), c, slices.Clone(c.tasks), false)
			if err := h.startTasksLocked(ctx, c, true); err != nil {
				h.setFailure(c, err.Error())
			}
		})
	})
}

// --- Shutdown

// Close stops the background retries, then every connector (tasks first,
// never as a deletion), then the worker. The store stays open: its owner
// closes it. Background work that does not end by ctx's deadline (a
// connector ignoring its context) is left running and reported in the
// error, like a stuck task.
func (h *Standalone) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	conns := slices.Collect(maps.Values(h.conns))
	h.mu.Unlock()
	h.bgCancel()
	// Background work (a deletion a request gave up waiting for, a retry,
	// a boot start) honours the cancel unless a connector ignores its
	// context; then Close gives up at ctx's deadline, as it does for stuck
	// tasks, rather than hang the process's shutdown.
	var bgErr error
	bgDone := make(chan struct{})
	go func() {
		h.bgWG.Wait()
		close(bgDone)
	}()
	select {
	case <-bgDone:
	case <-ctx.Done():
		h.log.Warn("background work (a deletion, its retry or a start at boot) is still running at shutdown; not waiting for it any longer")
		bgErr = fmt.Errorf("herder: background work still running at shutdown: %w", ctx.Err())
	}
	// Concurrently: one connector whose stop is stuck (a task past its
	// graceful timeout, a slow Stopped) must not use up ctx for the others.
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			if err := c.lock(ctx); err != nil {
				h.log.Warn("connector busy at shutdown; the worker stops it", "connector", c.name, "error", err)
				return
			}
			h.stopAllLocked(ctx, c)
			c.unlock()
		})
	}
	wg.Wait()
	if err := h.w.Close(ctx); err != nil {
		return errors.Join(bgErr, fmt.Errorf("herder: closing the worker: %w", err))
	}
	return bgErr
}
