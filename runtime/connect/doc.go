// Package connect is the API a connector author implements and imports.
//
// It depends on nothing else in tidyconnect. The runtime (runtime/worker and
// runtime/herder) drives the interfaces declared here and guarantees the
// lifecycle contract below; connectors rely on it.
//
// # The lifecycle contract
//
// For every Connector and every Task instance the runtime guarantees:
//
//  1. Start is called at most once per instance. It provisions what the
//     instance needs, idempotently. A resource is recorded as owned (Ledger.Own)
//     only if the instance is about to create it; a resource that already
//     existed is used but never owned.
//  2. Stop(connectorDeleted) is a signal. It may be called more than once, and
//     concurrently with Poll, Put, Flush or Commit. It must return quickly and
//     must not close a connection that another call is using. Before calling
//     Stop the runtime cancels the context of any in-flight Poll or Put, so a
//     task blocked in I/O is interrupted (KAFKA-15090).
//  3. Stopped is the last call the runtime ever makes on the instance. It is
//     called exactly once, after Poll, Put, Flush and Commit have returned for
//     good and the final offset commit is done. It is called even when Start
//     returned an error; it is never called when Start was never called.
//     Connections are released in Stopped. If any Stop call said
//     connectorDeleted == true, Stopped first drops the owned resources that
//     the Ledger lists (idempotently: a resource already gone counts as
//     dropped), releasing each ledger entry as it goes, and returns an error
//     naming what remains when it cannot drop everything.
//  4. connectorDeleted is true only for a real deletion of the connector.
//     Pause, the STOPPED target state, restart, reconfiguration, rebalance,
//     worker shutdown and crashes are never deletions.
//  5. On deletion every task of the connector finishes (Stop(true), then
//     Stopped) before the connector gets Stop(true), so shared resources are
//     dropped after no task can touch them.
//  6. Deletion is durable: if the process dies half-way, or Stopped returns an
//     error, the runtime retries later by creating a fresh instance, calling
//     Start (with Host.CleanupOnly set), Stop(true) and Stopped. Stopped must
//     therefore drop what the Ledger lists, not what this instance happened to
//     create.
//  7. Every stop is bounded by a graceful timeout. A task that does not return
//     in time is reported and abandoned; its Stopped still runs once its
//     blocked call returns.
//
// # Threading
//
// A task's Poll (source) or Put and Flush (sink) are never called
// concurrently with each other. SourceTask.Commit is called from the same
// goroutine as Poll, between Poll calls. Stop may be called from any
// goroutine at any time after Start began.
package connect
