package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/runtime/plugins"
)

// Worker runs connector and task instances. Create it with New; Close stops
// everything it runs (never as a deletion) and waits.
type Worker struct {
	id      string
	plugins *plugins.Registry
	offsets OffsetStore
	seeds   []string
	kopts   []kgo.Opt
	logger  *slog.Logger
	listen  StatusListener
	grace   time.Duration
}

// Opt configures a Worker.
type Opt func(*Worker)

// WithID sets the worker_id reported in statuses (Kafka Connect uses the REST
// host:port).
func WithID(id string) Opt { return func(w *Worker) { w.id = id } }

// WithPlugins sets the plugin registry. Required.
func WithPlugins(r *plugins.Registry) Opt { return func(w *Worker) { w.plugins = r } }

// WithOffsetStore sets where source offsets are stored. Required.
func WithOffsetStore(s OffsetStore) Opt { return func(w *Worker) { w.offsets = s } }

// WithKafka sets the Kafka seed brokers and extra client options. Required.
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

var errNotImplemented = errors.New("worker: not implemented yet")

// New returns a Worker.
func New(opts ...Opt) (*Worker, error) {
	w := &Worker{grace: 5 * time.Second, logger: slog.Default()}
	for _, o := range opts {
		o(w)
	}
	return w, errNotImplemented
}

// StartConnector creates a connector instance and calls Start. It returns
// Start's error (the instance is then FAILED, and its Stopped has been
// called). The instance runs until StopConnector.
func (w *Worker) StartConnector(ctx context.Context, run ConnectorRun) error {
	return errNotImplemented
}

// TaskConfigs asks a running connector for its task configurations, honouring
// tasks.max.
func (w *Worker) TaskConfigs(ctx context.Context, connector string) ([]map[string]string, error) {
	return nil, errNotImplemented
}

// StartTask creates a task instance and runs it in its own goroutine: Start,
// then the source or sink loop. It returns once Start has been attempted.
func (w *Worker) StartTask(ctx context.Context, run TaskRun) error { return errNotImplemented }

// SetTargetState pauses or resumes a connector and its tasks. A paused task
// gets no Stop call; its Poll context is cancelled and Poll/Put are not called
// until it is resumed.
func (w *Worker) SetTargetState(connector string, target TargetState) {}

// StopTasks stops tasks concurrently: Stop(connectorDeleted), wait for the
// loop to end within the graceful timeout, final offset commit, Stopped. It
// returns Stopped's error per task (a failed cleanup), and an error for a task
// abandoned after the graceful timeout.
func (w *Worker) StopTasks(ctx context.Context, ids []TaskID, connectorDeleted bool) map[TaskID]error {
	return nil
}

// StopConnector calls Stop(connectorDeleted) and Stopped on the connector
// instance and forgets it. It returns Stopped's error.
func (w *Worker) StopConnector(ctx context.Context, name string, connectorDeleted bool) error {
	return errNotImplemented
}

// ConnectorStatus returns the status of a connector instance on this worker.
func (w *Worker) ConnectorStatus(name string) (Status, bool) { return Status{}, false }

// TaskStatus returns the status of a task instance on this worker.
func (w *Worker) TaskStatus(id TaskID) (Status, bool) { return Status{}, false }

// Topics returns the topics a connector's tasks produced to or consumed from
// since they started on this worker.
func (w *Worker) Topics(connector string) []string { return nil }

// Close stops every instance with connectorDeleted == false, as on worker
// shutdown, and waits for them.
func (w *Worker) Close(ctx context.Context) error { return errNotImplemented }
