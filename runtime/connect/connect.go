package connect

import (
	"context"
	"time"
)

// Connector is the instance that owns a connector's shared resources and
// splits its work into task configurations. See the package documentation for
// the lifecycle contract.
type Connector interface {
	// Spec describes the connector: type, version and configuration keys.
	// It may be called on an instance that was never started.
	Spec() Spec
	// Start provisions the connector's shared resources. ctx carries the Host
	// (see HostFrom) and is cancelled when Stop is called.
	Start(ctx context.Context, cfg Config) error
	// TaskConfigs returns at most maxTasks task configurations. It is called
	// only after Start succeeded.
	TaskConfigs(maxTasks int) ([]Config, error)
	// Stop signals the connector to stop. It may be called more than once.
	Stop(connectorDeleted bool)
	// Stopped is the final call; see the package documentation.
	Stopped(ctx context.Context) error
}

// Task is the common part of SourceTask and SinkTask.
type Task interface {
	// Start prepares the task. ctx carries the Host and is cancelled when
	// Stop is called.
	Start(ctx context.Context, cfg Config) error
	// Stop signals the task to stop. It may be called more than once and
	// concurrently with Poll, Put, Flush or Commit.
	Stop(connectorDeleted bool)
	// Stopped is the final call; see the package documentation.
	Stopped(ctx context.Context) error
}

// SourceTask reads from an external system.
type SourceTask interface {
	Task
	// Poll returns the next batch of records, or nil when there is nothing
	// yet. It may block; ctx is cancelled when the task is stopped or paused,
	// and also when acknowledged records are waiting for Commit (Commit runs
	// between Poll calls, so a Poll blocked on an idle source would hold it
	// back). Returning nil or ctx.Err() after cancellation is not a failure.
	Poll(ctx context.Context) ([]SourceRecord, error)
	// Commit is called with records that Kafka has acknowledged (acks=all),
	// in the order Poll returned them. Every record Poll returned is either
	// committed or, if the runtime stops before the acknowledgement, never
	// committed: the task must then deliver it again after a restart.
	Commit(ctx context.Context, acked []SourceRecord) error
}

// SinkTask writes Kafka records to an external system.
type SinkTask interface {
	Task
	// Put delivers records. It may return before they are durable; Flush
	// reports what is. The slice is the task's to keep: the runtime never
	// reuses it after a Put that returned nil.
	Put(ctx context.Context, records []SinkRecord) error
	// Flush makes delivered records durable where it can within ctx and
	// returns, per partition, the offset of the next record to consume: every
	// record below it is durable in the external system. The runtime commits
	// exactly these offsets (never more) to the consumer group. A partition
	// missing from the result is not committed. An error commits nothing
	// and, unless ctx had ended or the task is paused, fails the task (Put is not called while
	// no records arrive, so Flush is where a task idle on its topics fails).
	Flush(ctx context.Context) (map[TopicPartition]int64, error)
}

// PartitionAware is implemented by a SinkTask that wants to know when it gains
// or loses partitions in a consumer-group rebalance. Close is called after the
// final Flush and offset commit for those partitions.
type PartitionAware interface {
	Open(ctx context.Context, partitions []TopicPartition) error
	Close(ctx context.Context, partitions []TopicPartition) error
}

// Validator is implemented by a Connector whose configuration needs checks
// beyond its ConfigDef (for example: does the table exist, can the broker be
// reached). It is called on a fresh, unstarted instance after the ConfigDef
// checks passed, and returns error messages per configuration key.
type Validator interface {
	Validate(ctx context.Context, cfg Config) map[string][]string
}

// Plugin is a connector implementation that a worker can run.
type Plugin struct {
	// Class is the value of connector.class that selects this plugin.
	Class string
	// Aliases are other accepted values of connector.class.
	Aliases []string
	// NewConnector returns a fresh, unstarted connector instance.
	NewConnector func() Connector
	// NewTask returns a fresh, unstarted task instance: a SourceTask for a
	// source connector, a SinkTask for a sink connector.
	NewTask func() Task
}

// ConnectorType is the direction of a connector.
type ConnectorType string

const (
	TypeSource  ConnectorType = "source"
	TypeSink    ConnectorType = "sink"
	TypeUnknown ConnectorType = "unknown"
)

// Spec describes a connector plugin.
type Spec struct {
	Type    ConnectorType
	Version string
	// Doc is a one-paragraph description shown in listings.
	Doc    string
	Config ConfigDef
}

// TopicPartition names one Kafka partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// SourceRecord is a record produced by a SourceTask.
type SourceRecord struct {
	// SourcePartition and SourceOffset locate the record in the external
	// system. They are stored as JSON once Kafka acknowledges the record and
	// given back through Host.Offsets after a restart. Values must be JSON
	// encodable (string, float64, int64, bool, nil, nested maps and slices).
	// The runtime keeps both maps until the record is committed: reuse one
	// SourcePartition map per partition freely, but never mutate a map (or
	// Key/Value bytes) after Poll returned it.
	SourcePartition map[string]any
	SourceOffset    map[string]any

	Topic string
	// Partition is the Kafka partition, or -1 to let the producer's
	// partitioner choose by key.
	Partition int32
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
}

// SinkRecord is a record consumed from Kafka and given to a SinkTask.
type SinkRecord struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
}

// TopicPartition returns where the record came from.
func (r SinkRecord) TopicPartition() TopicPartition {
	return TopicPartition{Topic: r.Topic, Partition: r.Partition}
}
