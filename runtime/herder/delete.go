package herder

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// DeleteConnector deletes durably: the intent is recorded before anything
// stops; tasks get Stop(true) and finish; then the connector gets Stop(true)
// (a fresh cleanup-only instance if none is running) and its Stopped drops
// what the ledger lists. Only when that succeeded is the connector
// forgotten. A failure leaves it visible (FAILED, with Deletion set), returns
// a *DeletionError and is retried in the background and by another DELETE.
//
// The deletion runs in a goroutine the herder owns: if ctx ends first,
// DeleteConnector returns while the deletion carries on (its progress shows
// in the status's Deletion); Close interrupts it, and the recorded intent
// makes the next start complete it.
func (h *Standalone) DeleteConnector(ctx context.Context, name string) error {
	arrived := h.interruptStart(name)
	c, err := h.lookup(ctx, name)
	arrived()
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ErrNotFound) {
			if c := h.get(name); c != nil && h.deletionOf(c) != nil {
				// An earlier DELETE's attempt held it all along.
				return fmt.Errorf("%w: a deletion of connector %s is already running (GET /connectors/%s/status shows its progress); retry DELETE to wait for it: %w", ErrRebalance, name, name, err)
			}
			// Another operation held the connector all along: the deletion
			// did not begin, and nothing will carry it on.
			return fmt.Errorf("%w: another operation on connector %s is still running, so its deletion did not start; retry DELETE: %w", ErrRebalance, name, err)
		}
		return err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		c.unlock()
		return errors.New("herder: the worker is shutting down; retry DELETE against the restarted worker")
	}
	h.bgWG.Add(1)
	h.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		defer h.bgWG.Done()
		defer c.unlock()
		done <- h.deleteLocked(h.bgCtx, c)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("deletion of connector %s is still running (see its status for progress; retry DELETE to wait again): %w", name, ctx.Err())
	}
}

func (h *Standalone) deleteLocked(ctx context.Context, c *conn) error {
	log := h.logger(c)
	ctx, cancel := context.WithTimeout(ctx, h.attemptTimeout)
	defer cancel()
	now := time.Now().UTC()
	in := store.DeletionIntent{Connector: c.name, Config: c.rec.Config.Clone(), StartedAt: now}
	if d := h.deletionOf(c); d != nil {
		in = *d
	}
	in.Attempts++
	in.Phase = store.PhaseStoppingTasks
	in.UpdatedAt = now
	// The intent is durable before anything stops (contract rule 6).
	if err := h.store.PutIntent(ctx, in); err != nil {
		return fmt.Errorf("herder: recording the deletion of connector %s (nothing was stopped; retry DELETE): %w", c.name, err)
	}
	h.setDeletion(c, &in)
	log.Info("deleting connector", "attempt", in.Attempts)
	h.runHook(hookIntentWritten, c.name)

	// Tasks first, each Stop(true) then Stopped, all before the connector's
	// Stop(true) (contract rule 5). Stuck tasks from an earlier attempt
	// are still in c.tasks: they get Stop(true) and another graceful period.
	taskErrs := h.stopTasksLocked(ctx, c, slices.Clone(c.tasks), true)
	h.runHook(hookTasksStopped, c.name)
	if taskErr := h.taskStopFailure(c, taskErrs); taskErr != nil {
		// A task that has not finished may still touch the shared
		// resources (an abandoned Put resuming, say): the connector keeps
		// running and gets no Stop(true) until every task has finished.
		return h.failAttempt(ctx, c, &in, taskErr)
	}
	in.Phase = store.PhaseStoppingConnector
	h.putPhase(ctx, c, &in)

	var connErr error
	switch {
	case c.running:
		connErr = h.stopConnectorLocked(ctx, c, true)
		if errors.Is(connErr, worker.ErrAlreadyStopped) {
			// Its Stopped ran without the deletion: a cleanup instance
			// drops what remains (nothing to do if the ledger is empty).
			connErr = nil
			if !h.ledgerEmpty(ctx, c) {
				connErr = h.cleanupOnlyLocked(ctx, c, in.Config)
			}
		}
	case h.ledgerEmpty(ctx, c):
		// Nothing to drop: no cleanup-only instance, whose Start could fail
		// forever against a decommissioned system.
		if c.inWorker {
			_ = h.stopConnectorLocked(ctx, c, true) // a FAILED instance: only forgotten
		}
		log.Info("the connector owns nothing; completing the deletion without a cleanup instance")
	default:
		connErr = h.cleanupOnlyLocked(ctx, c, in.Config)
	}
	remaining, lerr := h.store.Ledger(c.name).List(ctx)
	if connErr == nil && lerr != nil {
		connErr = fmt.Errorf("reading the ledger: %w", lerr)
	}
	if connErr == nil && len(remaining) > 0 {
		connErr = fmt.Errorf("the connector's cleanup returned without dropping %d owned resource(s)", len(remaining))
	}
	if connErr != nil {
		return h.failAttempt(ctx, c, &in, connErr)
	}

	in.Phase = store.PhaseForgetting
	h.putPhase(ctx, c, &in)
	if err := h.forget(ctx, c); err != nil {
		in.Phase = store.PhaseCleanupFailed
		in.LastError = err.Error()
		h.putPhase(ctx, c, &in)
		h.scheduleRetry(c, in.Attempts)
		return &DeletionError{Connector: c.name, Err: err}
	}
	log.Info("connector deleted", "attempts", in.Attempts)
	return nil
}

// taskStopFailure turns what stopping the tasks of a deletion reported
// into the error of the attempt, or nil when every task has finished
// cleanly. Tasks still running are named first.
func (h *Standalone) taskStopFailure(c *conn, taskErrs map[worker.TaskID]error) error {
	var errs []error
	for _, id := range c.tasks {
		if h.taskAlive(id) {
			errs = append(errs, fmt.Errorf("task %d has not finished: it is still blocked in Poll/Put (or its final commit or Stopped) past the graceful timeout (abandoned); the connector keeps its shared resources until it returns", id.Task))
		}
	}
	ids := slices.Collect(maps.Keys(taskErrs))
	slices.SortFunc(ids, func(a, b worker.TaskID) int { return a.Task - b.Task })
	for _, id := range ids {
		// A task whose Stopped already ran without the deletion (it had
		// failed) is finished: the connector's cleanup drops what the
		// ledger lists, the task's entries included.
		if err := taskErrs[id]; err != nil && !h.taskAlive(id) && !errors.Is(err, worker.ErrAlreadyStopped) {
			errs = append(errs, fmt.Errorf("task %d: %w", id.Task, err))
		}
	}
	if len(c.tasks) > 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("tasks %v have not finished", c.tasks))
	}
	return errors.Join(errs...)
}

// failAttempt records a failed deletion attempt (it stays visible, FAILED
// with the cleanup-failed phase) and schedules the background retry.
func (h *Standalone) failAttempt(ctx context.Context, c *conn, in *store.DeletionIntent, err error) error {
	remaining, _ := h.store.Ledger(c.name).List(ctx)
	in.Phase = store.PhaseCleanupFailed
	in.LastError = err.Error()
	h.putPhase(ctx, c, in)
	h.logger(c).Error("connector deletion failed; it stays visible and is retried", "attempt", in.Attempts, "remaining", len(remaining), "error", err)
	h.scheduleRetry(c, in.Attempts)
	return &DeletionError{Connector: c.name, Remaining: remaining, Err: err}
}

func (h *Standalone) ledgerEmpty(ctx context.Context, c *conn) bool {
	r, err := h.store.Ledger(c.name).List(ctx)
	return err == nil && len(r) == 0
}

// cleanupOnlyLocked completes a deletion when no connector instance runs
// (STOPPED, FAILED, or after a crash): a fresh instance with CleanupOnly
// gets Start, Stop(true) and Stopped, which drops what the ledger lists.
func (h *Standalone) cleanupOnlyLocked(ctx context.Context, c *conn, cfg connect.Config) error {
	if c.inWorker {
		// A FAILED instance whose Stopped already ran: forget it.
		_ = h.stopConnectorLocked(ctx, c, true)
	}
	if !c.hasPlugin {
		return fmt.Errorf("cannot clean up: %s; install the plugin and retry DELETE", c.failure)
	}
	if len(cfg) == 0 {
		cfg = c.rec.Config
	}
	err := h.w.StartConnector(ctx, worker.ConnectorRun{Name: c.name, Config: cfg.Clone(), Ledger: h.store.Ledger(c.name), Target: worker.TargetRunning, CleanupOnly: true})
	c.inWorker = true
	if err != nil {
		_ = h.stopConnectorLocked(ctx, c, true)
		return fmt.Errorf("starting a cleanup-only instance: %w", err)
	}
	c.running = true
	return h.stopConnectorLocked(ctx, c, true)
}

// forget removes everything the herder keeps about a deleted connector, the
// intent last.
func (h *Standalone) forget(ctx context.Context, c *conn) error {
	name := c.name
	// The config record first: the store refuses ledger entries and
	// offsets for a connector without one, so a late Own or commit of an
	// instance that outlived its Stopped cannot leave an orphan ledger or
	// stale offsets for a connector created later under the name. The
	// intent, removed last, still finishes a forget cut short by a crash.
	if err := h.store.DeleteConnector(ctx, name); err != nil {
		return err
	}
	if err := h.store.DeleteOffsets(ctx, name); err != nil {
		return err
	}
	if h.adm != nil {
		// Best effort: a leftover group only holds offsets, but a sink
		// created later under the name would resume from them.
		wait := time.Duration(0)
		if c.spec.Type == connect.TypeSink {
			wait = sinkGroupMemberWait // members left are its own gone consumers
		}
		if err := h.dropSinkGroupOnceEmpty(ctx, SinkGroup(name), wait); err != nil {
			if ctx.Err() != nil {
				// Cut short (a shutdown), not given up: the intent stays,
				// and the next start deletes the group.
				return fmt.Errorf("deleting the sink consumer group %s: %w", SinkGroup(name), errors.Join(err, ctx.Err()))
			}
			h.logger(c).Warn("could not delete the sink consumer group; delete it by hand if it matters", "group", SinkGroup(name), "error", err)
		}
	}
	// The worker's in-memory topics too: a connector created later under
	// the same name starts with none (KIP-558 resets them on deletion).
	if r, ok := h.w.(interface{ ResetTopics(string) }); ok {
		r.ResetTopics(name)
	}
	for _, step := range []func(context.Context, string) error{h.store.DeleteLedger, h.store.ResetTopics, h.store.DeleteIntent} {
		if err := step(ctx, name); err != nil {
			return err
		}
	}
	h.mu.Lock()
	if h.conns[name] == c {
		delete(h.conns, name)
	}
	h.mu.Unlock()
	h.forgetStatuses(name, -1)
	return nil
}

// sinkGroupMemberWait bounds how long a deletion waits for the members
// left in its sink's consumer group to go: a consumer of a killed worker
// never leaves, and the group keeps it until its session times out (10 s,
// decision 0013); the stopped task's consumer, whose leave timed out
// behind that rebalance, goes after it (about 15 s after the stop in the
// integration suite). Right after a crash that is the common case, and
// deleting nothing then left the committed offsets to a sink created later
// under the name. With a Kafka client (WithKafkaClient) the deletion
// removes such members first, and waits only if they come back.
const sinkGroupMemberWait = 25 * time.Second

// dropSinkGroupOnceEmpty is dropSinkGroup, waiting (at most wait) while
// the group still has members: a sink's own tasks have stopped, so they are
// gone consumers waiting out their session, and are removed from the group
// once (removeGroupMembers) before any wait.
func (h *Standalone) dropSinkGroupOnceEmpty(ctx context.Context, group string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	removed := false
	for {
		err := h.dropSinkGroup(ctx, group)
		if !errors.Is(err, errGroupHasMembers) || wait <= 0 {
			return err
		}
		if !removed && h.kafka != nil {
			removed = true
			if rerr := h.removeGroupMembers(ctx, group); rerr == nil {
				continue
			} else {
				err = fmt.Errorf("%w; removing its members: %w", err, rerr)
			}
		}
		if !time.Now().Before(deadline) {
			return err
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// removeGroupMembers removes every member of group with LeaveGroup by
// member id (version 3 and later, as an administrator removes a member):
// called only once the group's connector is stopped, when its members are
// consumers that are gone but whose sessions have not timed out yet. A
// member already gone counts as removed.
func (h *Standalone) removeGroupMembers(ctx context.Context, group string) error {
	described, err := h.adm.DescribeGroups(ctx, group)
	if err != nil {
		return fmt.Errorf("describing it: %w", err)
	}
	d, ok := described[group]
	if !ok || len(d.Members) == 0 {
		return nil
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	for _, m := range d.Members {
		member := kmsg.NewLeaveGroupRequestMember()
		member.MemberID = m.MemberID
		reason := "its connector was deleted"
		member.Reason = &reason
		req.Members = append(req.Members, member)
	}
	resp, err := req.RequestWith(ctx, h.kafka)
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return err
	}
	for _, m := range resp.Members {
		if err := kerr.ErrorForCode(m.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
			return fmt.Errorf("member %s: %w", m.MemberID, err)
		}
	}
	return nil
}

func (h *Standalone) putPhase(ctx context.Context, c *conn, in *store.DeletionIntent) {
	in.UpdatedAt = time.Now().UTC()
	if err := h.store.PutIntent(ctx, *in); err != nil {
		// The intent itself is durable already; only the phase is stale.
		h.logger(c).Warn("could not persist the deletion phase", "phase", in.Phase, "error", err)
	}
	h.setDeletion(c, in)
}

func (h *Standalone) runHook(point, connector string) {
	if h.hook != nil {
		h.hook(point, connector)
	}
}

// scheduleRetry retries a failed deletion in the background with
// exponential backoff. The goroutine is owned by the herder: Close cancels
// and waits for it.
func (h *Standalone) scheduleRetry(c *conn, attempts int) {
	h.mu.Lock()
	if c.retryScheduled || h.closed {
		h.mu.Unlock()
		return
	}
	c.retryScheduled = true
	h.bgWG.Add(1) // under h.mu, so never after Close began waiting
	h.mu.Unlock()
	delay := h.retryMin
	for i := 1; i < attempts && delay < h.retryMax; i++ {
		delay *= 2
	}
	delay = min(delay, h.retryMax)
	go func() {
		defer h.bgWG.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-h.bgCtx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		c.retryScheduled = false
		current := h.conns[c.name] == c
		h.mu.Unlock()
		if !current {
			return
		}
		if err := c.lock(h.bgCtx); err != nil {
			return
		}
		defer c.unlock()
		if h.get(c.name) != c || h.deletionOf(c) == nil {
			return // deleted or retried by a DELETE meanwhile
		}
		h.logger(c).Info("retrying a failed deletion")
		_ = h.deleteLocked(h.bgCtx, c)
	}()
}
