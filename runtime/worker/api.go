// Package worker runs connector and task instances and enforces the lifecycle
// contract of runtime/connect: Stopped exactly once and last, Stop able to
// interrupt Poll and Put, the graceful timeout, the source path (Poll ->
// produce -> acks -> Commit -> offsets) and the sink path (consumer group ->
// Put -> Flush -> commit only flushed offsets).
//
// The worker does not decide when to start or stop anything, nor whether a
// stop is a deletion: its caller (runtime/herder) does. It keeps no durable
// state of its own; offsets go to an OffsetStore, ownership to the Ledger the
// caller hands over with each instance.
package worker

import (
	"context"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TargetState is what the herder wants an instance to be doing.
type TargetState string

const (
	TargetRunning TargetState = "RUNNING"
	TargetPaused  TargetState = "PAUSED"
	TargetStopped TargetState = "STOPPED"
)

// State is an instance's reported state, using exactly Kafka Connect's names.
type State string

const (
	StateUnassigned State = "UNASSIGNED"
	StateRunning    State = "RUNNING"
	StatePaused     State = "PAUSED"
	StateStopped    State = "STOPPED" // connectors only
	StateFailed     State = "FAILED"
	StateRestarting State = "RESTARTING"
)

// TaskID names one task of a connector.
type TaskID struct {
	Connector string `json:"connector"`
	Task      int    `json:"task"`
}

// Status is an instance's current state as the worker sees it.
type Status struct {
	State    State
	WorkerID string
	// Trace explains a FAILED state (the error text).
	Trace string
	// Abandoned is set for a task that did not return within the graceful
	// timeout: its goroutine is still blocked; Stopped will run when it
	// returns.
	Abandoned bool
}

// ConnectorRun is everything the worker needs to run a connector instance.
type ConnectorRun struct {
	Name   string
	Config connect.Config
	Ledger connect.Ledger
	Target TargetState
	// CleanupOnly starts the instance only to complete a deletion
	// (connect.Host.CleanupOnly).
	CleanupOnly bool
}

// TaskRun is everything the worker needs to run a task instance.
type TaskRun struct {
	ID              TaskID
	ConnectorConfig connect.Config
	TaskConfig      connect.Config
	Ledger          connect.Ledger
	Target          TargetState
	CleanupOnly     bool
}

// SourceOffset is one committed source position.
type SourceOffset struct {
	Partition map[string]any `json:"partition"`
	Offset    map[string]any `json:"offset"`
}

// OffsetStore keeps committed source offsets per connector. Put returns once
// the offsets are durable.
type OffsetStore interface {
	Get(ctx context.Context, connector string, partition map[string]any) (map[string]any, error)
	Put(ctx context.Context, connector string, offsets []SourceOffset) error
}

// StatusListener is told about every state change of every instance. A task
// event has Task >= 0; a connector event has Task == -1. It must not block.
type StatusListener func(connector string, task int, s Status)
