package connect

import (
	"context"
	"fmt"
	"log/slog"
)

// Host is what the runtime hosting an instance provides to it. The runtime
// puts it into the context given to Start and Stopped; HostFrom reads it.
// Connectors may keep the Host (not the context) for the instance's lifetime.
type Host struct {
	// Connector is the connector's name.
	Connector string
	// Task is the task number, or -1 for the connector instance.
	Task int
	// Logger carries connector (and task) attributes. Never nil.
	Logger *slog.Logger
	// Ledger records the external resources this connector owns. One ledger
	// is shared by the connector and its tasks. Never nil.
	Ledger Ledger
	// Offsets reads the committed source offsets. Set for source tasks (and
	// source connectors); nil otherwise.
	Offsets OffsetReader
	// Errors reports records a sink task could not deliver (dead-letter
	// queue, errors.tolerance). Set for sink tasks; nil otherwise.
	Errors ErrantRecordReporter
	// RequestTaskReconfiguration asks the runtime to call TaskConfigs again
	// and restart the tasks if their configurations changed. Set for
	// connector instances.
	RequestTaskReconfiguration func()
	// CleanupOnly is true when the instance is started only to complete an
	// interrupted or failed deletion: Start should connect but need not
	// provision, because Stop(true) and Stopped follow at once.
	CleanupOnly bool
}

type hostKey struct{}

// WithHost returns a context carrying h.
func WithHost(ctx context.Context, h *Host) context.Context {
	return context.WithValue(ctx, hostKey{}, h)
}

// HostFrom returns the Host in ctx. Outside a runtime (a plain unit test) it
// returns a Host with a discarding logger and an in-memory ledger, so
// connectors need no nil checks for Logger and Ledger.
func HostFrom(ctx context.Context) *Host {
	if h, ok := ctx.Value(hostKey{}).(*Host); ok && h != nil {
		return h
	}
	return &Host{Task: -1, Logger: slog.New(slog.DiscardHandler), Ledger: NewMemoryLedger()}
}

// Resource is one external object a connector owns.
type Resource struct {
	// Kind is the type of object, e.g. "postgres.table", "rabbitmq.queue".
	Kind string `json:"kind"`
	// Name is the object's name as the external system knows it.
	Name string `json:"name"`
	// Location says where the object lives: a database and schema, a
	// RabbitMQ vhost. Kind, Location and Name together identify a resource.
	Location string `json:"location"`
}

func (r Resource) String() string {
	return fmt.Sprintf("%s %s at %s", r.Kind, r.Name, r.Location)
}

// Ledger is the durable record of what a connector owns.
//
// Own must be called before the resource is created, so that a crash between
// the two leaves an entry whose drop finds nothing (harmless) rather than an
// object nobody remembers (a leak). Own, Release and List are safe for
// concurrent use and idempotent.
type Ledger interface {
	Own(ctx context.Context, r Resource) error
	Release(ctx context.Context, r Resource) error
	List(ctx context.Context) ([]Resource, error)
}

// OffsetReader reads committed source offsets.
type OffsetReader interface {
	// Offset returns the last committed offset for a source partition, or
	// nil when there is none. It comes back as stored JSON reads back: a
	// whole number as an exact int64 (Kafka Connect's Long), any other
	// number as float64, strings, booleans, nested maps and slices.
	Offset(ctx context.Context, partition map[string]any) (map[string]any, error)
}

// ErrantRecordReporter sends a record that could not be delivered to the
// dead-letter topic, as errors.tolerance and errors.deadletterqueue.* say.
// It returns nil when the record was tolerated (and so may be skipped), or an
// error (wrapping err) when the task must fail instead.
type ErrantRecordReporter interface {
	Report(ctx context.Context, record SinkRecord, err error) error
}
