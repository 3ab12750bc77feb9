// Package herder turns intents (create, reconfigure, pause, stop, restart,
// delete) into worker actions, persists them through runtime/store, and is
// the only place that decides connectorDeleted: true for a real deletion and
// nothing else.
package herder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// API is what the REST layer drives. The standalone herder implements it (and
// a distributed one will). Configs it returns are masked (connect.ConfigDef.Mask).
type API interface {
	ClusterInfo(ctx context.Context) (ClusterInfo, error)
	Connectors(ctx context.Context) ([]string, error)
	ConnectorInfo(ctx context.Context, name string) (ConnectorInfo, error)
	ConnectorStatus(ctx context.Context, name string) (ConnectorStatus, error)
	TaskStatus(ctx context.Context, id worker.TaskID) (TaskStatus, error)
	TaskConfigs(ctx context.Context, name string) ([]TaskInfo, error)

	// CreateConnector validates and creates; ErrAlreadyExists if present.
	CreateConnector(ctx context.Context, name string, cfg connect.Config, initial worker.TargetState) (ConnectorInfo, error)
	// PutConnectorConfig creates or replaces; created reports which. On a
	// connector whose deletion failed it replaces the config the next
	// deletion attempt uses (the connector stays in deletion).
	PutConnectorConfig(ctx context.Context, name string, cfg connect.Config) (info ConnectorInfo, created bool, err error)
	// PatchConnectorConfig merges patch into the stored config; a key with a
	// nil value is removed.
	PatchConnectorConfig(ctx context.Context, name string, patch map[string]*string) (ConnectorInfo, error)
	// DeleteConnector deletes durably and waits (bounded by ctx) for cleanup.
	// On a cleanup failure it returns a *DeletionError; the connector stays
	// visible until a retried DeleteConnector succeeds.
	DeleteConnector(ctx context.Context, name string) error

	Pause(ctx context.Context, name string) error
	Resume(ctx context.Context, name string) error
	Stop(ctx context.Context, name string) error
	// Restart restarts the connector and, with includeTasks, its tasks;
	// onlyFailed limits it to FAILED instances. It returns the status with
	// RESTARTING for what will restart (Kafka's 202 case) and whether
	// anything was restarted.
	Restart(ctx context.Context, name string, includeTasks, onlyFailed bool) (ConnectorStatus, error)
	RestartTask(ctx context.Context, id worker.TaskID) error

	// Offsets, AlterOffsets and ResetOffsets require the STOPPED target state
	// for the changes (ErrNotStopped otherwise).
	Offsets(ctx context.Context, name string) (ConnectorOffsets, error)
	AlterOffsets(ctx context.Context, name string, offsets ConnectorOffsets) error
	ResetOffsets(ctx context.Context, name string) error

	Topics(ctx context.Context, name string) ([]string, error)
	ResetTopics(ctx context.Context, name string) error

	// Resources lists what the connector owns: what deleting it would drop.
	Resources(ctx context.Context, name string) ([]connect.Resource, error)

	Plugins(ctx context.Context) ([]PluginInfo, error)
	PluginConfig(ctx context.Context, class string) (connect.ConfigDef, error)
	Validate(ctx context.Context, class string, cfg connect.Config) (Validation, error)
}

// ClusterInfo answers GET /.
type ClusterInfo struct {
	Version        string
	Commit         string
	KafkaClusterID string
}

// ConnectorInfo is a connector's config and tasks.
type ConnectorInfo struct {
	Name   string
	Config connect.Config
	Tasks  []worker.TaskID
	Type   connect.ConnectorType
}

// TaskInfo is one task's config.
type TaskInfo struct {
	ID     worker.TaskID
	Config connect.Config
}

// ConnectorStatus is GET /connectors/{c}/status.
type ConnectorStatus struct {
	Name      string
	Connector worker.Status
	Tasks     []TaskStatus
	Type      connect.ConnectorType
	// Deletion is set while a deletion is pending or has failed.
	Deletion *Deletion
}

// TaskStatus is one task's status.
type TaskStatus struct {
	ID int
	worker.Status
}

// Deletion reports a deletion that has begun but not finished.
type Deletion struct {
	// Phase is "stopping-tasks", "stopping-connector", "cleanup-failed" or
	// "pending" (recorded, not started yet, e.g. after a crash).
	Phase     string
	Remaining []connect.Resource
	Error     string
	Attempts  int
	StartedAt time.Time
}

// ConnectorOffsets is GET /connectors/{c}/offsets: source partitions and
// offsets, or for a sink {"kafka_topic","kafka_partition"} ->
// {"kafka_offset"}, as Kafka Connect represents them.
type ConnectorOffsets struct {
	Offsets []worker.SourceOffset
}

// PluginInfo is one entry of GET /connector-plugins.
type PluginInfo struct {
	Class   string
	Type    connect.ConnectorType
	Version string
}

// Validation is the result of validating a config against a plugin: the
// plugin's keys plus the runtime's common keys, each with its value and
// errors.
type Validation struct {
	Name       string // the plugin class
	ErrorCount int
	Groups     []string
	Configs    []ValidatedKey
}

// ValidatedKey is one key's definition, value and errors.
type ValidatedKey struct {
	Definition connect.ConfigKey
	Value      *string // nil when absent and without default; masked if secret
	Errors     []string
	Visible    bool
}

// Errors the REST layer maps to status codes.
var (
	ErrNotFound      = errors.New("not found")                             // 404
	ErrAlreadyExists = errors.New("already exists")                        // 409
	ErrNotStopped    = errors.New("connector is not in the STOPPED state") // 400 for offsets changes
	// ErrTaskNotFound is a task id the connector does not have (it is an
	// ErrNotFound; an unknown connector is ErrNotFound itself).
	ErrTaskNotFound = fmt.Errorf("%w: the connector has no such task", ErrNotFound)
	ErrRebalance    = errors.New("rebalance in progress") // 409
)

// ConfigError is a rejected configuration: every bad field with its
// messages. It maps to 400.
type ConfigError struct {
	Fields map[string][]string
}

func (e *ConfigError) Error() string {
	var parts []string
	for k, msgs := range e.Fields {
		parts = append(parts, fmt.Sprintf("%s: %s", k, strings.Join(msgs, "; ")))
	}
	return fmt.Sprintf("connector configuration is invalid and contains %d error(s): %s", len(e.Fields), strings.Join(parts, "; "))
}

// BadRequestError is any other request the caller must fix (a bad name, a
// malformed offsets body). It maps to 400.
type BadRequestError struct{ Msg string }

func (e *BadRequestError) Error() string { return e.Msg }

// DeletionError is a deletion whose cleanup did not finish.
type DeletionError struct {
	Connector string
	Remaining []connect.Resource
	Err       error
}

func (e *DeletionError) Error() string {
	names := make([]string, len(e.Remaining))
	for i, r := range e.Remaining {
		names[i] = r.String()
	}
	return fmt.Sprintf("deletion of connector %s is incomplete; remaining: [%s]: %v; it is retried in the background; fix the cause (if it is the configuration, e.g. a rotated password or a moved server, fix the configuration with PUT /connectors/%s/config), then retry DELETE", e.Connector, strings.Join(names, ", "), e.Err, e.Connector)
}

func (e *DeletionError) Unwrap() error { return e.Err }
