// Package store keeps the herder's durable state: connector configs and
// target states with their task configs, source offsets, the resource ledger
// of each connector, the topics each connector used, and deletion intents.
//
// The interfaces here are what the herder consumes; File implements them on
// a local directory for standalone mode, and a Kafka-topic-backed
// implementation can implement them for distributed mode.
package store

import (
	"context"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// ConnectorRecord is a connector's durable configuration.
type ConnectorRecord struct {
	Name   string             `json:"name"`
	Config connect.Config     `json:"config"`
	Target worker.TargetState `json:"target_state"`
	// Tasks are the task configs the connector generated last; empty while
	// STOPPED (as in Kafka Connect, a stopped connector has no tasks).
	Tasks []connect.Config `json:"tasks"`
	// Dormant is set for a connector paused while STOPPED or created
	// PAUSED: as in Kafka Connect, it is not started (no Start, no tasks)
	// until it is resumed, also after a restart of the worker or a config
	// change.
	Dormant bool `json:"dormant,omitempty"`
	// CreatedAt and UpdatedAt are informational.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Deletion phases.
const (
	PhasePending           = "pending"
	PhaseStoppingTasks     = "stopping-tasks"
	PhaseStoppingConnector = "stopping-connector"
	PhaseCleanupFailed     = "cleanup-failed"
	PhaseForgetting        = "forgetting"
)

// DeletionIntent is the durable record that the deletion of a connector has
// begun. It is written before anything stops and removed only after cleanup
// succeeded and everything else about the connector was forgotten.
type DeletionIntent struct {
	Connector string `json:"connector"`
	// Config is the connector config at the time of the DELETE, so that a
	// cleanup-only instance can be started even if the config record was
	// already forgotten.
	Config    connect.Config `json:"config"`
	Phase     string         `json:"phase"`
	Attempts  int            `json:"attempts"`
	LastError string         `json:"last_error,omitempty"`
	StartedAt time.Time      `json:"started_at"`
	UpdatedAt time.Time      `json:"updated_at"`
}

// Configs stores connector records.
type Configs interface {
	PutConnector(ctx context.Context, rec ConnectorRecord) error
	Connector(ctx context.Context, name string) (ConnectorRecord, bool, error)
	// Connectors returns every record, sorted by name.
	Connectors(ctx context.Context) ([]ConnectorRecord, error)
	DeleteConnector(ctx context.Context, name string) error
}

// Offsets stores committed source offsets per connector. It implements
// worker.OffsetStore (Get and Put; Put merges, and fails for a connector
// without a config record, as Ledger.Own does).
type Offsets interface {
	worker.OffsetStore
	// AllOffsets returns every partition's offset of a connector, sorted by
	// partition.
	AllOffsets(ctx context.Context, connector string) ([]worker.SourceOffset, error)
	// DeleteOffsets forgets every offset of a connector.
	DeleteOffsets(ctx context.Context, connector string) error
}

// Ledgers gives each connector a durable connect.Ledger.
type Ledgers interface {
	// Ledger returns the connector's ledger; Own and Release are durable on
	// return. Own fails for a connector without a config record (deleted):
	// a late Own must not recreate a forgotten connector's state.
	Ledger(connector string) connect.Ledger
	// DeleteLedger forgets a connector's ledger (after its resources were
	// dropped).
	DeleteLedger(ctx context.Context, connector string) error
}

// OrphanLister is implemented by stores that can list orphan ledgers:
// a ledger with owned resources whose connector has neither a config record
// nor a deletion intent. The herder reports them at start-up.
type OrphanLister interface {
	OrphanLedgers(ctx context.Context) (map[string][]connect.Resource, error)
}

// Topics records the topics each connector used.
type Topics interface {
	AddTopics(ctx context.Context, connector string, topics []string) error
	Topics(ctx context.Context, connector string) ([]string, error)
	ResetTopics(ctx context.Context, connector string) error
}

// Intents stores deletion intents.
type Intents interface {
	PutIntent(ctx context.Context, in DeletionIntent) error
	Intent(ctx context.Context, connector string) (DeletionIntent, bool, error)
	// Intents returns every pending intent, sorted by connector.
	Intents(ctx context.Context) ([]DeletionIntent, error)
	DeleteIntent(ctx context.Context, connector string) error
}

// Store is everything the herder persists.
type Store interface {
	Configs
	Offsets
	Ledgers
	Topics
	Intents
}
