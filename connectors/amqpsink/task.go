package amqpsink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Task publishes records with pipelined publisher confirms. Put returns as
// soon as the records are published (waiting only when max.in.flight are
// unconfirmed); Flush waits for the confirms and reports, per partition, the
// offset below which every record is confirmed (or was reported as errant and
// tolerated).
//
// Put, Flush, Open and Close run on the runtime's task goroutine; the only
// other goroutine is each session's pump, which records confirms and returns.
type Task struct {
	s    *settings
	host *connect.Host
	log  *slog.Logger

	stopOnce sync.Once
	stopCh   chan struct{}

	// Owned by the task goroutine (Put/Flush/Stopped).
	known   map[string]bool // topics whose queue and binding are declared
	topo    *topology
	fatal   error
	backlog []*entry // unconfirmed entries waiting for a session to publish on
	// Counters for tests and logs.
	reconnects, republished int
	// resume holds, per partition, the next offset an interrupted Put had
	// taken: the runtime puts the same batch again, and those records must
	// not be published twice. Cleared by the next Put that completes.
	resume map[connect.TopicPartition]int64

	mu      sync.Mutex // guards what the pump touches: below, and session.pending
	sess    *session
	parts   map[connect.TopicPartition]*partState
	failed  []*entry
	changed chan struct{} // closed and replaced when a waiter must look again
	// wakeAt is how few unconfirmed messages the waiting call waits for (-1:
	// nobody waits). The pump wakes it only then, or on a failure, so a full
	// window refills in bursts instead of one wake-up per confirm.
	wakeAt  int
	deleted bool
}

type entryState uint8

const (
	statePending entryState = iota
	stateConfirmed
	stateFailed  // nacked or returned; waiting to be reported
	stateSkipped // reported and tolerated
)

type entry struct {
	rec   connect.SinkRecord
	msgID string
	state entryState
	err   error
	part  *partState
}

func (e *entry) resolved() bool { return e.state == stateConfirmed || e.state == stateSkipped }

type partState struct {
	entries []*entry // in offset order; resolved ones are trimmed from the front
	next    int64    // offset after the last record Put
}

// trimLocked drops the resolved prefix, so memory follows the unconfirmed
// messages, not the time since the last Flush. Re-slicing keeps the array;
// append reallocates it with only the live part once it is full.
func (p *partState) trimLocked() {
	i := 0
	for i < len(p.entries) && p.entries[i].resolved() {
		p.entries[i] = nil
		i++
	}
	p.entries = p.entries[i:]
}

// session is one connection, its confirm-mode channel and the pump reading
// its confirms and returns.
type session struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	pending  map[uint64]*entry // by delivery tag; guarded by Task.mu
	returned map[string]string // message-id -> reply text; pump only
	done     chan struct{}     // closed when the pump ends: the channel is gone
	closeErr error             // why the channel closed; guarded by Task.mu
}

var errStopping = errors.New("amqpsink task is stopping")

func (t *Task) Start(ctx context.Context, cfg connect.Config) error {
	t.init()
	h := connect.HostFrom(ctx)
	t.host, t.log = h, h.Logger
	s, err := parse(cfg, h.Connector)
	if err != nil {
		return err
	}
	t.s = s
	if err := t.connect(ctx); err != nil {
		return err
	}
	for _, topic := range s.topics {
		if err := t.ensureTopic(ctx, topic); err != nil {
			return err
		}
	}
	return nil
}

func (t *Task) init() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopCh == nil {
		t.stopCh = make(chan struct{})
	}
	if t.changed == nil {
		t.changed = make(chan struct{})
	}
	t.wakeAt = -1
	if t.parts == nil {
		t.parts = map[connect.TopicPartition]*partState{}
	}
	t.known = map[string]bool{}
}

// connect opens a session and declares the exchange and every topic seen so
// far, then republishes the backlog.
func (t *Task) connect(ctx context.Context) error {
	conn, err := dial(ctx, t.s, ConnectionName(t.s.connector, t.host.Task))
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return fmt.Errorf("opening a confirm-mode channel on RabbitMQ at %s: %w", connect.MaskCredentials(t.s.url), err)
	}
	sess := &session{conn: conn, ch: ch, pending: map[uint64]*entry{}, returned: map[string]string{}, done: make(chan struct{})}
	// Big enough that amqp091's reader never waits on us (it drops a
	// notification that blocks for 5s).
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, t.s.maxInFlight+64))
	returns := ch.NotifyReturn(make(chan amqp.Return, t.s.maxInFlight+64))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go t.pump(sess, confirms, returns, closes)

	t.mu.Lock()
	t.sess = sess
	t.mu.Unlock()
	t.topo = &topology{s: t.s, conn: conn, ledger: t.host.Ledger, log: t.log}
	if err := t.topo.ensureExchange(ctx); err != nil {
		return err
	}
	for _, topic := range slices.Sorted(maps.Keys(t.known)) {
		if err := t.topo.ensureTopic(ctx, topic); err != nil {
			return err
		}
	}
	backlog := t.backlog
	t.backlog = nil
	for i, e := range backlog {
		if err := t.publish(ctx, sess, e); err != nil {
			t.backlog = append(t.backlog, backlog[i+1:]...)
			return err
		}
	}
	t.republished += len(backlog)
	if len(backlog) > 0 {
		t.log.Info("republished unconfirmed messages after reconnecting", "count", len(backlog))
	}
	return nil
}

// pump records the broker's confirms and returns for one session. A return
// is always sent before the confirm of the same message, so draining the
// returns before handling a confirm sees it.
func (t *Task) pump(sess *session, confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	var closeErr error
	defer func() {
		t.mu.Lock()
		sess.closeErr = closeErr
		close(sess.done)
		t.signalLocked()
		t.mu.Unlock()
	}()
	drain := func() {
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					return
				}
				sess.returned[r.MessageId] = fmt.Sprintf("%d %s (exchange %q, routing key %q)", r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
			default:
				return
			}
		}
	}
	for {
		select {
		case c, ok := <-confirms:
			if !ok {
				select {
				case e := <-closes:
					if e != nil {
						closeErr = e
					}
				case <-time.After(time.Second): // closed by us: no error follows
				}
				return
			}
			drain()
			t.resolve(sess, c)
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			sess.returned[r.MessageId] = fmt.Sprintf("%d %s (exchange %q, routing key %q)", r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey)
		}
	}
}

func (t *Task) resolve(sess *session, c amqp.Confirmation) {
	var reason string
	t.mu.Lock()
	defer t.mu.Unlock()
	e := sess.pending[c.DeliveryTag]
	if e == nil {
		return
	}
	delete(sess.pending, c.DeliveryTag)
	if r, ok := sess.returned[e.msgID]; ok {
		delete(sess.returned, e.msgID)
		reason = "unroutable: the broker returned it: " + r
	} else if !c.Ack {
		reason = "the broker nacked it (it could not store the message)"
	}
	if reason == "" {
		e.state = stateConfirmed
		e.rec = connect.SinkRecord{Offset: e.rec.Offset} // the payload is no longer needed
		e.part.trimLocked()
	} else {
		e.state, e.err = stateFailed, fmt.Errorf("message %s %s", e.msgID, reason)
		t.failed = append(t.failed, e)
	}
	if reason != "" || len(sess.pending) <= t.wakeAt {
		t.signalLocked()
	}
}

func (t *Task) signalLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

func (t *Task) ensureTopic(ctx context.Context, topic string) error {
	if t.known[topic] {
		return nil
	}
	if err := t.topo.ensureTopic(ctx, topic); err != nil {
		return err
	}
	t.known[topic] = true
	return nil
}

func (t *Task) message(r connect.SinkRecord, msgID string) amqp.Publishing {
	h := make(amqp.Table, len(r.Headers)+4)
	for _, hd := range r.Headers {
		h[hd.Key] = hd.Value
	}
	h[HeaderTopic] = r.Topic
	h[HeaderPartition] = r.Partition
	h[HeaderOffset] = r.Offset
	if r.Key != nil {
		h[HeaderKey] = r.Key
	}
	ts := r.Timestamp
	if ts.IsZero() {
		ts = time.Now()
	}
	return amqp.Publishing{
		ContentType:  t.s.contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    msgID,
		Timestamp:    ts,
		Headers:      h,
		Body:         r.Value,
	}
}

// publish sends e on sess. On failure the entry goes to the backlog and the
// session is treated as lost.
func (t *Task) publish(ctx context.Context, sess *session, e *entry) error {
	r := e.rec
	t.mu.Lock()
	tag := sess.ch.GetNextPublishSeqNo()
	sess.pending[tag] = e
	t.mu.Unlock()
	err := sess.ch.Publish(t.s.exchange, t.s.routingKey(r.Topic, r.Partition, r.Key), true, false, t.message(r, e.msgID))
	if err != nil {
		t.mu.Lock()
		if sess.pending[tag] == e {
			delete(sess.pending, tag)
			t.backlog = append(t.backlog, e)
		}
		t.mu.Unlock()
		return fmt.Errorf("publishing to exchange %q: %w", t.s.exchange, err)
	}
	return nil
}

func (t *Task) stopping() bool {
	select {
	case <-t.stopCh:
		return true
	default:
		return false
	}
}

// reconnect replaces a lost session: close it, then dial, declare and
// republish with capped exponential backoff until it works, the reconnect
// timeout passes (an error: the task fails) or the task stops.
func (t *Task) reconnect(ctx context.Context) error {
	if err := t.closeSession(); err != nil {
		return err
	}
	deadline := time.Now().Add(t.s.reconnect)
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := t.connect(ctx)
		if err == nil {
			t.reconnects++
			t.log.Info("reconnected to RabbitMQ", "attempt", attempt)
			return nil
		}
		if refused := t.closeSession(); refused != nil {
			return refused
		}
		if ctx.Err() != nil || t.stopping() {
			return errStopping
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("RabbitMQ has been unreachable for %v (%s), giving up: %w", t.s.reconnect, KeyReconnectTimeout, err)
		}
		t.log.Warn("reconnecting to RabbitMQ failed; retrying", "attempt", attempt, "backoff", backoff, "err", err)
		if err := t.sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// sleep waits d, or returns errStopping when the task stops or ctx ends.
func (t *Task) sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return errStopping
	case <-t.stopCh:
		return errStopping
	}
}

// closeSession closes the connection, waits for the pump and moves the
// unconfirmed messages to the backlog, oldest first. It returns the task's fatal error when the broker had closed the channel
// because it refuses publishing (403): reconnecting cannot help, and every
// republish would be refused again.
func (t *Task) closeSession() error {
	t.mu.Lock()
	sess := t.sess
	t.sess = nil
	t.mu.Unlock()
	if sess == nil {
		return nil
	}
	_ = sess.conn.CloseDeadline(time.Now().Add(closeTimeout))
	<-sess.done
	t.mu.Lock()
	defer t.mu.Unlock()
	tags := slices.Sorted(maps.Keys(sess.pending))
	requeue := make([]*entry, 0, len(tags)+len(t.backlog))
	for _, tag := range tags {
		requeue = append(requeue, sess.pending[tag])
	}
	clear(sess.pending)
	// Entries that failed to publish are newer than every pending one.
	t.backlog = append(requeue, t.backlog...)
	var ae *amqp.Error
	if errors.As(sess.closeErr, &ae) && ae.Code == amqp.AccessRefused {
		t.fatal = fmt.Errorf("RabbitMQ refused a publish to exchange %q: grant the user in %s write permission on it (and on the routing keys, where topic permissions apply): %w", t.s.exchange, KeyURL, sess.closeErr)
		return t.fatal
	}
	return nil
}

// live returns the current session if its channel is still open.
func (t *Task) live() *session {
	t.mu.Lock()
	sess := t.sess
	t.mu.Unlock()
	if sess == nil {
		return nil
	}
	select {
	case <-sess.done:
		return nil
	default:
		return sess
	}
}

// ensureLive reconnects when the session is gone.
func (t *Task) ensureLive(ctx context.Context) (*session, error) {
	if sess := t.live(); sess != nil && len(t.backlog) == 0 {
		return sess, nil
	}
	t.mu.Lock()
	var why error = errors.New("no connection")
	if t.sess != nil && t.sess.closeErr != nil {
		why = t.sess.closeErr
	}
	t.mu.Unlock()
	t.log.Warn("lost the RabbitMQ channel; reconnecting and republishing unconfirmed messages", "err", why)
	if err := t.reconnect(ctx); err != nil {
		return nil, err
	}
	return t.live(), nil
}

// reportFailed hands nacked and returned records to Host.Errors. A tolerated
// record counts as done; otherwise the task fails.
func (t *Task) reportFailed(ctx context.Context) error {
	t.mu.Lock()
	failed := t.failed
	t.failed = nil
	t.mu.Unlock()
	for i, e := range failed {
		var err error
		if t.host.Errors == nil {
			err = fmt.Errorf("record %s could not be delivered and there is no error reporter: %w", e.msgID, e.err)
		} else {
			err = t.host.Errors.Report(ctx, e.rec, e.err)
		}
		if err != nil {
			t.mu.Lock()
			t.failed = append(failed[i:], t.failed...)
			t.mu.Unlock()
			if errors.Is(ctx.Err(), context.Canceled) {
				// Interrupted (a pause cancels Put): report them next time.
				// A deadline that passed is a failure like any other.
				return ctx.Err()
			}
			t.fatal = fmt.Errorf("delivering to RabbitMQ failed (set %s=all to send such records to the dead-letter topic instead): %w", KeyErrorsTolerance, err)
			return t.fatal
		}
		t.mu.Lock()
		e.state = stateSkipped
		e.part.trimLocked()
		t.signalLocked()
		t.mu.Unlock()
		t.log.Warn("undeliverable record reported to the error handler", "message_id", e.msgID, "err", e.err)
	}
	return nil
}

func (t *Task) inflight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.backlog)
	if t.sess != nil {
		n += len(t.sess.pending)
	}
	return n
}

// wait blocks until at most wakeAt messages of sess are unconfirmed, a
// message failed, the session ends, ctx ends or the task stops.
func (t *Task) wait(ctx context.Context, sess *session, wakeAt int) error {
	return t.waitStop(ctx, sess, wakeAt, t.stopCh)
}

// waitStop is wait with the stop signal given explicitly (nil: only ctx
// ends the wait).
func (t *Task) waitStop(ctx context.Context, sess *session, wakeAt int, stop <-chan struct{}) error {
	t.mu.Lock()
	if len(t.failed) > 0 || (sess != nil && len(sess.pending) <= wakeAt) {
		t.mu.Unlock()
		return nil
	}
	t.wakeAt = wakeAt
	changed := t.changed
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.wakeAt = -1
		t.mu.Unlock()
	}()
	var done chan struct{}
	if sess != nil {
		done = sess.done
	}
	select {
	case <-changed:
		return nil
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return errStopping
	}
}

func (t *Task) Put(ctx context.Context, records []connect.SinkRecord) (err error) {
	if t.fatal != nil {
		return t.fatal
	}
	defer func() {
		if err == nil || t.fatal != nil {
			t.resume = nil
			return
		}
		// Interrupted: the runtime puts the batch again.
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.resume == nil {
			t.resume = map[connect.TopicPartition]int64{}
		}
		for _, r := range records {
			if p := t.parts[r.TopicPartition()]; p != nil {
				t.resume[r.TopicPartition()] = p.next
			}
		}
	}()
	for _, r := range records {
		if t.taken(r) {
			// The runtime puts a batch again after a Put that a pause or
			// stop interrupted halfway: its first records are published.
			continue
		}
		if err := t.reportFailed(ctx); err != nil {
			return err
		}
		sess, err := t.waitWindow(ctx)
		if err != nil {
			return t.interrupted(ctx, err)
		}
		if !t.known[r.Topic] {
			err := t.ensureTopic(ctx, r.Topic)
			if err != nil && t.topo.conn.IsClosed() {
				// The connection went away under the declare: reconnect
				// (which republishes) and try once more.
				if err := t.reconnect(ctx); err != nil {
					return t.interrupted(ctx, err)
				}
				if sess = t.live(); sess == nil {
					return fmt.Errorf("provisioning the queue for topic %q: the new RabbitMQ connection closed at once", r.Topic)
				}
				err = t.ensureTopic(ctx, r.Topic)
			}
			if err != nil {
				return fmt.Errorf("provisioning the queue for topic %q: %w", r.Topic, err)
			}
		}
		e := &entry{rec: r, msgID: messageID(r)}
		tp := r.TopicPartition()
		t.mu.Lock()
		p := t.parts[tp]
		if p == nil {
			p = &partState{}
			t.parts[tp] = p
		}
		e.part = p
		p.entries = append(p.entries, e)
		p.next = r.Offset + 1
		t.mu.Unlock()
		if reason := t.unpublishable(r); reason != "" {
			// The client would fail the frame and close the connection:
			// every reconnect would republish and fail again.
			t.mu.Lock()
			e.state, e.err = stateFailed, fmt.Errorf("message %s cannot be published: %s", e.msgID, reason)
			t.failed = append(t.failed, e)
			t.mu.Unlock()
			continue
		}
		if err := t.publish(ctx, sess, e); err != nil {
			t.log.Debug("publish failed; will reconnect", "err", err)
		}
	}
	return t.reportFailed(ctx)
}

// taken reports whether an interrupted Put of this instance already took r
// (published, confirmed or reported it). Only that Put's records count: a
// lower offset otherwise means the consumer went back, and is delivered.
func (t *Task) taken(r connect.SinkRecord) bool {
	next, ok := t.resume[r.TopicPartition()]
	return ok && r.Offset < next
}

// maxShortString is AMQP 0-9-1's limit for a routing key, a message-id and
// a header name.
const maxShortString = 255

// messageID is <topic>-<partition>-<offset>; a topic too long for that to
// fit a short string is cut and given a hash of its full name.
func messageID(r connect.SinkRecord) string {
	suffix := "-" + strconv.Itoa(int(r.Partition)) + "-" + strconv.FormatInt(r.Offset, 10)
	if len(r.Topic)+len(suffix) <= maxShortString {
		return r.Topic + suffix
	}
	sum := sha256.Sum256([]byte(r.Topic))
	hash := "~" + hex.EncodeToString(sum[:8])
	return r.Topic[:maxShortString-len(suffix)-len(hash)] + hash + suffix
}

// unpublishable says why r cannot be published at all, or "".
func (t *Task) unpublishable(r connect.SinkRecord) string {
	if len(r.Value) > t.s.maxMessage {
		return fmt.Sprintf("its value has %d bytes, more than %s=%d (the broker's max_message_size)", len(r.Value), KeyMaxMessageBytes, t.s.maxMessage)
	}
	if rk := t.s.routingKey(r.Topic, r.Partition, r.Key); len(rk) > maxShortString {
		return fmt.Sprintf("its routing key (from %s) has %d bytes, more than AMQP's %d", KeyRoutingKey, len(rk), maxShortString)
	}
	for _, h := range r.Headers {
		if len(h.Key) > maxShortString {
			return fmt.Sprintf("its header %q… has a name of %d bytes, more than AMQP's %d", h.Key[:32], len(h.Key), maxShortString)
		}
	}
	return ""
}

// interrupted maps a stop or cancellation to a quiet return: nothing
// unconfirmed is ever flushed, so the records are simply delivered again.
func (t *Task) interrupted(ctx context.Context, err error) error {
	if errors.Is(err, errStopping) || ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// waitWindow waits until fewer than max.in.flight messages are unconfirmed
// and returns a live session.
func (t *Task) waitWindow(ctx context.Context) (*session, error) {
	for {
		if t.stopping() {
			return nil, errStopping
		}
		sess, err := t.ensureLive(ctx)
		if err != nil {
			return nil, err
		}
		if sess == nil {
			continue // the new channel closed at once: reconnect again
		}
		if t.inflight() < t.s.maxInFlight {
			return sess, nil
		}
		if err := t.reportFailed(ctx); err != nil {
			return nil, err
		}
		if err := t.wait(ctx, sess, t.s.maxInFlight/2); err != nil {
			return nil, err
		}
	}
}

func (t *Task) Flush(ctx context.Context) (map[connect.TopicPartition]int64, error) {
	if t.fatal != nil {
		return t.offsets(), t.fatal
	}
	// The runtime's final Flush comes after Stop: it still waits for the
	// confirms of what is in flight, bounded by its ctx, so that a plain
	// stop does not turn them into duplicates after the restart. It does
	// not reconnect. A Flush that began before Stop is interrupted by it.
	final := t.stopping()
	for {
		if err := t.reportFailed(ctx); err != nil {
			return t.offsets(), err
		}
		if t.inflight() == 0 {
			// The last confirms may have brought failures after the report
			// above; with nothing in flight no more can come.
			if !t.pendingFailures() {
				break
			}
			continue
		}
		var sess *session
		if final {
			if sess = t.live(); sess == nil {
				break
			}
			if err := t.waitStop(ctx, sess, 0, nil); err != nil {
				break
			}
			continue
		}
		sess, err := t.ensureLive(ctx)
		if err != nil {
			if errors.Is(err, errStopping) || ctx.Err() != nil {
				break // report what is confirmed so far
			}
			return t.offsets(), err
		}
		if err := t.wait(ctx, sess, 0); err != nil {
			break
		}
	}
	return t.offsets(), nil
}

func (t *Task) pendingFailures() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.failed) > 0
}

// offsets returns, per partition, the offset below which every record is
// confirmed or tolerated.
func (t *Task) offsets() map[connect.TopicPartition]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[connect.TopicPartition]int64, len(t.parts))
	for tp, p := range t.parts {
		p.trimLocked()
		if len(p.entries) > 0 {
			out[tp] = p.entries[0].rec.Offset
		} else {
			out[tp] = p.next
		}
	}
	return out
}

// Open implements connect.PartitionAware.
func (t *Task) Open(context.Context, []connect.TopicPartition) error { return nil }

// Close forgets revoked partitions after their final flush; unconfirmed
// messages of theirs are still republished but no longer reported.
func (t *Task) Close(_ context.Context, partitions []connect.TopicPartition) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tp := range partitions {
		delete(t.parts, tp)
		delete(t.resume, tp)
	}
	return nil
}

func (t *Task) Stop(connectorDeleted bool) {
	t.mu.Lock()
	t.deleted = t.deleted || connectorDeleted
	if t.stopCh == nil {
		t.stopCh = make(chan struct{})
	}
	ch := t.stopCh
	t.mu.Unlock()
	t.stopOnce.Do(func() { close(ch) })
}

// Stopped closes the channel and the connection. A task drops nothing: the
// connector's Stopped deletes the owned resources after every task stopped.
func (t *Task) Stopped(context.Context) error {
	_ = t.closeSession()
	return nil
}
