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
// Put, Flush, Open and Close run on the runtime's task goroutine; the other
// goroutines are each session's pump, which records confirms, returns and
// the broker's connection.blocked notifications, and the watcher of each Put
// and Flush (guard), which cuts session I/O that Stop or the call's context
// cannot reach otherwise.
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
	// out is the latest outage: when it began and the next backoff. A
	// reconnect continues it (instead of starting a fresh one) while the
	// sessions it opens are lost before the broker answered anything
	// republished on them.
	out outage
	// io is the session I/O under way on the task goroutine.
	io ioGuard
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
	wakeAt int
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
	// republished counts the backlog messages connect published on it
	// (task goroutine only); answered is set when the broker confirmed or
	// nacked any message on it, cut when the task closed it because its I/O
	// was stuck after a stop or the end of a call (both guarded by Task.mu).
	republished int
	answered    bool
	cut         bool
	// opened is when connect finished with it (declared and republished),
	// lost when its channel closed (the pump ended); both guarded by
	// Task.mu: see refusedWithin.
	opened, lost time.Time
	// blocked is the broker's reason while it blocks the connection
	// (connection.blocked: a memory or disk alarm), "" otherwise; guarded by
	// Task.mu.
	blocked string
}

// outage is the state of the reconnect loop carried from one reconnect to
// the next.
type outage struct {
	since   time.Time // when it began; the reconnect timeout counts from here
	backoff time.Duration
}

const (
	minReconnectBackoff = 100 * time.Millisecond
	maxReconnectBackoff = 5 * time.Second
	// stuckIOGrace is how long a publish or declare under way may go on
	// after the task was stopped or its call's context ended before the
	// task closes the connection under it. A healthy broker finishes one in
	// far less; a broker that blocks the connection never does.
	stuckIOGrace = time.Second
	// refusedWithin is how soon a session that republished and got no
	// answer must be lost to continue the outage: a broker refusing what
	// was republished closes the channel within moments, while a session
	// that lived longer (blocked, then the broker restarted) ended for
	// another reason and starts a fresh outage.
	refusedWithin = time.Second
)

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
	// Registered before anything is sent, so a broker already blocking
	// publishers is reported.
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	var ch *amqp.Channel
	err = t.onConn(conn, "opening a confirm-mode channel", func() error {
		var err error
		if ch, err = conn.Channel(); err == nil {
			err = ch.Confirm(false)
		}
		return err
	})
	if err != nil {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return fmt.Errorf("opening a confirm-mode channel on RabbitMQ at %s: %w", connect.MaskCredentials(t.s.url), err)
	}
	sess := &session{conn: conn, ch: ch, opened: time.Now(), pending: map[uint64]*entry{}, returned: map[string]string{}, done: make(chan struct{})}
	// Big enough that amqp091's reader never waits on us (it drops a
	// notification that blocks for 5s).
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, t.s.maxInFlight+64))
	returns := ch.NotifyReturn(make(chan amqp.Return, t.s.maxInFlight+64))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go t.pump(sess, confirms, returns, closes, blocks)

	t.mu.Lock()
	t.sess = sess
	t.mu.Unlock()
	t.topo = &topology{s: t.s, conn: conn, ledger: t.host.Ledger, log: t.log,
		io: func(fn func() error) error { return t.onConn(conn, "declaring the exchange, queues and bindings", fn) }}
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
		sess.republished++
	}
	t.republished += len(backlog)
	if len(backlog) > 0 {
		t.log.Info("republished unconfirmed messages after reconnecting", "count", len(backlog))
	}
	// Counted from here: republishing a large backlog may take longer
	// than refusedWithin by itself.
	t.mu.Lock()
	sess.opened = time.Now()
	t.mu.Unlock()
	return nil
}

// pump records the broker's confirms and returns for one session. A return
// is always sent before the confirm of the same message, so draining the
// returns before handling a confirm sees it.
func (t *Task) pump(sess *session, confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error, blocks <-chan amqp.Blocking) {
	var closeErr error
	defer func() {
		t.mu.Lock()
		sess.closeErr = closeErr
		sess.lost = time.Now()
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
		case b, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			t.mu.Lock()
			sess.blocked = ""
			if b.Active {
				sess.blocked = b.Reason
				if sess.blocked == "" {
					sess.blocked = "no reason given"
				}
			}
			t.mu.Unlock()
			if b.Active {
				t.log.Warn("RabbitMQ blocked the connection: publishing waits until the broker unblocks it (a memory or disk alarm); Stop or the end of a call closes the connection and the unconfirmed messages are republished later", "reason", b.Reason)
			} else {
				t.log.Info("RabbitMQ unblocked the connection")
			}
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
	sess.answered = true
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
	t.io.begin(sess.conn, "publishing")
	err := sess.ch.Publish(t.s.exchange, t.s.routingKey(r.Topic, r.Partition, r.Key), true, false, t.message(r, e.msgID))
	t.io.end()
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
//
// A reconnect that works can still be followed at once by the loss of the
// new channel, when the broker refuses what was republished on it for a
// reason not classified as fatal (each republish closes the channel again).
// So when the lost session was opened by a reconnect, had republished
// messages and was lost before the broker answered any of them, the outage
// goes on: the backoff continues where it was and the reconnect timeout
// still counts from the outage's start. Any other loss, e.g. of a session
// that got a confirm, that republished nothing, or that the task cut
// itself, starts a fresh outage, so two unrelated outages close together
// never add up. A reconnect that was interrupted before it connected (no
// session since) is continued by the next one: same outage, same timeout.
func (t *Task) reconnect(ctx context.Context) error {
	t.mu.Lock()
	lost := t.sess
	t.mu.Unlock()
	if err := t.closeSession(); err != nil {
		return err
	}
	var wait time.Duration
	goesOn, why := t.outageGoesOn(lost)
	switch {
	case goesOn:
		if time.Since(t.out.since) > t.s.reconnect {
			return fmt.Errorf("RabbitMQ has answered none of the republished messages for %v (%s): every reconnect since lost its channel before the broker confirmed anything, giving up: %w", t.s.reconnect, KeyReconnectTimeout, why)
		}
		wait = t.out.backoff
		t.out.backoff = min(wait*2, maxReconnectBackoff)
		t.log.Warn("the channel opened by the last reconnect was lost before RabbitMQ answered any republished message; backing off", "backoff", wait, "err", why)
	case lost == nil && !t.out.since.IsZero():
		// No session: the last reconnect ended before it connected (a pause
		// cancelled its Put, a Flush's context ended). The outage goes on,
		// so the timeout still counts from its start: a fresh one on every
		// resume kept a task paused and resumed more often than the timeout
		// RUNNING forever against a broker that never came back. The first
		// attempt is made at once: the broker may be back.
	default:
		t.out = outage{since: time.Now(), backoff: minReconnectBackoff}
	}
	deadline := t.out.since.Add(t.s.reconnect)
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil || t.stopping() {
			return errStopping
		}
		if wait > 0 {
			if err := t.sleep(ctx, wait); err != nil {
				return err
			}
		}
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
		wait = t.out.backoff
		t.out.backoff = min(wait*2, maxReconnectBackoff)
		t.log.Warn("reconnecting to RabbitMQ failed; retrying", "attempt", attempt, "backoff", wait, "err", err)
	}
}

// outageGoesOn reports whether the loss of lost (closed, its pump ended)
// continues the latest outage, and why it was lost.
func (t *Task) outageGoesOn(lost *session) (goesOn bool, why error) {
	if lost == nil || t.out.since.IsZero() {
		return false, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	why = lost.closeErr
	if why == nil {
		why = errors.New("the connection was lost")
	}
	return lost.republished > 0 && !lost.answered && !lost.cut && lost.lost.Sub(lost.opened) < refusedWithin, why
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
			if errors.Is(err, e.err) {
				// Refused: errors.tolerance is none.
				t.fatal = fmt.Errorf("delivering to RabbitMQ failed (set %s=all to send such records to the dead-letter topic instead): %w", KeyErrorsTolerance, err)
			} else {
				// Tolerated, but the report itself failed (the dead-letter
				// topic could not be written in time): advice to tolerate
				// would mislead.
				t.fatal = fmt.Errorf("record %s could not be delivered to RabbitMQ (%v), and reporting it to the error handler failed: %w", e.msgID, e.err, err)
			}
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
	// Stop ends the call's waits that only ctx bounds (the provisioning
	// lock of a new topic's queue) as the end of ctx does.
	ctx, release := t.guard(ctx, true)
	defer release()
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
			if err != nil && (t.stopping() || ctx.Err() != nil) {
				// A stop or the end of the call cut the declare or the
				// wait for the provisioning lock: the runtime puts the
				// batch again.
				return t.interrupted(ctx, errStopping)
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
		if r.Value == nil && t.s.nullValues == nullIgnore {
			// Resolved without a message: Flush's offsets pass it.
			t.mu.Lock()
			e.state = stateSkipped
			e.part.trimLocked()
			t.signalLocked()
			t.mu.Unlock()
			continue
		}
		if r.Value == nil && t.s.nullValues == nullFail {
			t.mu.Lock()
			e.state, e.err = stateFailed, fmt.Errorf("message %s has a null value (a tombstone) and %s=%s", e.msgID, KeyNullValues, nullFail)
			t.failed = append(t.failed, e)
			t.mu.Unlock()
			continue
		}
		if reason := t.unpublishable(r, e.msgID, sess.conn.Config.FrameSize); reason != "" {
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
			if t.stopping() || ctx.Err() != nil {
				// Cut by a stop or the end of the call (the record stays
				// in the backlog): interrupted, even if it was the last.
				return t.interrupted(ctx, errStopping)
			}
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

// unpublishable says why r cannot be published at all, or "". frameMax is
// the connection's negotiated frame_max (0: none).
func (t *Task) unpublishable(r connect.SinkRecord, msgID string, frameMax int) string {
	// The properties, headers included, travel in one content header
	// frame, which amqp091 does not split or check: the broker closes the
	// connection on a larger one (FRAME_ERROR frame_too_large), and every
	// reconnect republished it and failed again until the reconnect
	// timeout, with an "unreachable" error. frame_max counts the 8 octets
	// of frame header and end too. An upper bound first (duplicate header
	// names only shrink the table), so the common record costs no second
	// table.
	if limit := frameMax - 8; frameMax > 0 && t.headerFrameBound(r, msgID) > limit {
		if n := headerFramePayload(t.message(r, msgID)); n > limit {
			return fmt.Sprintf("its headers and properties take %d bytes, more than fit in one AMQP frame (the broker's frame_max, %d)", n, frameMax)
		}
	}
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
		if h.Key == "CC" || h.Key == "BCC" {
			// RabbitMQ reads these as extra routing keys (sender-selected
			// distribution) and takes only an array of strings: a header
			// of bytes makes it close the channel (406
			// unacceptable_type_in_header) on every republish.
			return fmt.Sprintf("its header %q is RabbitMQ's sender-selected routing (an array of routing keys), which the broker refuses as bytes", h.Key)
		}
	}
	return ""
}

// headerFrameBound is at least headerFramePayload(t.message(r, msgID)).
func (t *Task) headerFrameBound(r connect.SinkRecord, msgID string) int {
	n := 2 + 2 + 8 + 2 + 1 + len(t.s.contentType) + 4 + 1 + 1 + len(msgID) + 8
	n += 1 + len(HeaderTopic) + 5 + len(r.Topic) + 1 + len(HeaderPartition) + 5 +
		1 + len(HeaderOffset) + 9 + 1 + len(HeaderKey) + 5 + len(r.Key)
	for _, h := range r.Headers {
		n += 1 + len(h.Key) + 5 + len(h.Value)
	}
	return n
}

// headerFramePayload is the size of the content header frame's payload
// that amqp091 writes for p: class, weight, body size, property flags, then
// the properties message sets (see its headerFrame.write and writeField).
func headerFramePayload(p amqp.Publishing) int {
	n := 2 + 2 + 8 + 2
	if p.ContentType != "" {
		n += 1 + len(p.ContentType)
	}
	if len(p.Headers) > 0 {
		n += 4
		for k, v := range p.Headers {
			n += 1 + len(k)
			switch v := v.(type) {
			case string:
				n += 5 + len(v)
			case []byte:
				n += 5 + len(v)
			case int32:
				n += 5
			case int64:
				n += 9
			default: // not set by message
				n += 9
			}
		}
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if p.MessageId != "" {
		n += 1 + len(p.MessageId)
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// interrupted maps a stop or cancellation to a quiet return: nothing
// unconfirmed is ever flushed, so the records are simply delivered again.
//
// A stop is read from the task itself, not only from the cause of ctx:
// Stop closes stopCh first and guard cancels the call's context a moment
// later, so a cause read before that cancel and an Err read after it made
// a stop look like the caller's cancellation (a flaky "context canceled"
// from a Put that Stop interrupted).
func (t *Task) interrupted(ctx context.Context, err error) error {
	if errors.Is(err, errStopping) || ctx.Err() != nil {
		if t.stopping() || errors.Is(context.Cause(ctx), errStopping) {
			return nil // a stop, not the caller
		}
		return ctx.Err()
	}
	return err
}

// waitWindow waits until fewer than max.in.flight messages are unconfirmed
// and returns a live session.
func (t *Task) waitWindow(ctx context.Context) (*session, error) {
	for {
		// A pause or stop cancels the call: publish no more of the batch
		// (the runtime puts it again on resume, without what was taken).
		if t.stopping() || ctx.Err() != nil {
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
	// Not cancelled by Stop: the final Flush still waits for the confirms
	// in flight, bounded by its context.
	_, release := t.guard(ctx, false)
	defer release()
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
		if sess == nil {
			continue // the new channel closed at once: reconnect again (as waitWindow)
		}
		if err := t.wait(ctx, sess, 0); err != nil {
			break
		}
	}
	offs := t.offsets()
	t.log.Debug("flushed: every message below these offsets is confirmed by RabbitMQ", "offsets", len(offs), "final", final)
	return offs, nil
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

// Stop ends the task's waits and I/O. A deletion changes nothing here: the
// topology is the connector's, dropped by its Stopped.
func (t *Task) Stop(connectorDeleted bool) {
	t.mu.Lock()
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

// ioGuard records the session I/O under way on the task goroutine (a
// publish, a declare), so that a stop or the end of the call's context can
// cut it when the broker does not let it finish. A broker that blocks a
// connection (connection.blocked, on a memory or disk alarm) stops reading
// its socket: a publish then waits inside a socket write, holding
// amqp091-go's locks, and nothing but closing the connection ends it
// (amqp091-go looks at a context only before it starts writing).
type ioGuard struct {
	mu   sync.Mutex
	conn *amqp.Connection // the connection of the operation under way; nil: none
	what string
	gen  uint64        // counts the operations begun
	wake chan struct{} // closed by the next begin, when a watcher waits for one
}

func (g *ioGuard) begin(conn *amqp.Connection, what string) {
	g.mu.Lock()
	g.conn, g.what = conn, what
	g.gen++
	if g.wake != nil {
		close(g.wake)
		g.wake = nil
	}
	g.mu.Unlock()
}

func (g *ioGuard) end() {
	g.mu.Lock()
	g.conn, g.what = nil, ""
	g.mu.Unlock()
}

// onConn runs fn, an operation on conn, as I/O that guard may cut.
func (t *Task) onConn(conn *amqp.Connection, what string, fn func() error) error {
	t.io.begin(conn, what)
	defer t.io.end()
	return fn()
}

// guard watches one Put or Flush until the returned release is called (it
// ends and joins the watcher): once the task is stopped or ctx ends, session
// I/O that is still under way stuckIOGrace later is cut. The returned
// context is ctx, also cancelled by a stop if stopCancels.
func (t *Task) guard(ctx context.Context, stopCancels bool) (context.Context, func()) {
	gctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
		case <-t.stopCh:
			if stopCancels {
				cancel(errStopping)
			}
		}
		t.cutStuckIO(done)
	})
	return gctx, func() {
		close(done)
		wg.Wait()
		cancel(nil)
	}
}

// cutStuckIO closes the connection under any operation that is still the
// one under way stuckIOGrace after it was seen, until done is closed. The
// operation then fails; an unconfirmed message goes back to the backlog
// (closeSession), to be republished by the next session, and a later Flush
// never reports it.
func (t *Task) cutStuckIO(done <-chan struct{}) {
	var cut uint64
	for {
		g := &t.io
		g.mu.Lock()
		conn, what, gen := g.conn, g.what, g.gen
		var wake chan struct{}
		if conn == nil || gen == cut {
			wake = make(chan struct{})
			g.wake = wake
		}
		g.mu.Unlock()
		if wake != nil {
			select {
			case <-done:
				return
			case <-wake:
				continue
			}
		}
		timer := time.NewTimer(stuckIOGrace)
		select {
		case <-done:
			timer.Stop()
			return
		case <-timer.C:
		}
		g.mu.Lock()
		stuck := g.conn == conn && g.gen == gen
		g.mu.Unlock()
		if !stuck {
			continue
		}
		cut = gen
		t.mu.Lock()
		blocked := ""
		if t.sess != nil && t.sess.conn == conn {
			t.sess.cut = true
			blocked = t.sess.blocked
		}
		t.mu.Unlock()
		args := []any{"operation", what, "grace", stuckIOGrace}
		if blocked != "" {
			args = append(args, "blocked_by_broker", blocked)
		}
		t.log.Warn("session I/O did not finish after the task was stopped or its call ended (a broker that blocks or does not read the connection); closing the connection, the unconfirmed messages stay in the backlog", args...)
		_ = conn.CloseDeadline(time.Now())
	}
}
