package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// closeTimeout bounds the AMQP close handshake, so an unresponsive broker
// cannot hold Stopped or a reconnect.
const closeTimeout = 5 * time.Second

// ConnectionName is the connection_name client property of every connection
// an instance opens; `rabbitmqctl list_connections client_properties` shows it.
func ConnectionName(connector string, task int) string {
	if task < 0 {
		return fmt.Sprintf("tidyconnect:%s:connector", connector)
	}
	return fmt.Sprintf("tidyconnect:%s:%d", connector, task)
}

// dial opens a connection to the broker; ctx bounds the TCP dial and the
// AMQP handshake.
func dial(ctx context.Context, s *settings, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	// cut ends a handshake in progress when ctx ends (a broker that accepts
	// but does not answer held a Stop or a shutdown for the full 15 s).
	var cut func() bool
	var raw net.Conn // closed by hand when the handshake fails (amqp091 leaves it open)
	conn, err := amqp.DialConfig(s.url, amqp.Config{
		Properties: props,
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The handshake must finish in bounded time too; amqp091 clears
			// the deadline once the connection is open.
			_ = c.SetDeadline(time.Now().Add(15 * time.Second))
			cut = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
			raw = c
			return c, nil
		},
	})
	if cut != nil && !cut() {
		// ctx ended: the handshake was cut, or the deadline may be set on
		// the open connection.
		if raw != nil {
			_ = raw.Close()
		}
		return nil, fmt.Errorf("connecting to RabbitMQ at %s: interrupted: %w", connect.MaskCredentials(s.url), context.Cause(ctx))
	}
	if err != nil && raw != nil {
		// A failed handshake (refused credentials, a vhost the user may
		// not open) leaves the socket and amqp091's reader until the
		// broker's own timeout.
		_ = raw.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to RabbitMQ at %s: %s; check %s and that the broker is running and reachable",
			connect.MaskCredentials(s.url), connect.MaskCredentials(err.Error()), KeyURL)
	}
	return conn, nil
}

func amqpCode(err error) int {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

func isNotFound(err error) bool { return amqpCode(err) == amqp.NotFound }

// topology declares and deletes the connector's exchange, queues and
// bindings. Checks that may fail (a passive declare, an equivalence check)
// close the AMQP channel they run on, so every operation gets a throwaway
// channel of its own.
type topology struct {
	s      *settings
	conn   *amqp.Connection
	ledger connect.Ledger
	log    *slog.Logger
	// io, if set, runs each operation on conn (a task records it as I/O
	// under way, which a stop may cut); the provisioning lock's waits and
	// the ledger are not such I/O.
	io func(fn func() error) error
	// owner is the owner argument of the bindings, once bindingOwner found
	// or drew it.
	owner string
}

func (tp *topology) withChannel(fn func(ch *amqp.Channel) error) error {
	run := func() error { return onChannel(tp.conn, fn) }
	if tp.io != nil {
		return tp.io(run)
	}
	return run()
}

func (tp *topology) exchangeRes() connect.Resource {
	return connect.Resource{Kind: KindExchange, Name: tp.s.exchange, Location: tp.s.location}
}

func (tp *topology) queueRes(q string) connect.Resource {
	return connect.Resource{Kind: KindQueue, Name: q, Location: tp.s.location}
}

// binding is one queue binding the connector makes. Its ledger name encodes
// everything needed to remove it again, so a fresh instance can.
type binding struct {
	exchange, queue, key, topic string
	headers                     bool
	owner                       string
}

func (b binding) args() amqp.Table {
	t := amqp.Table{OwnerArg: b.owner}
	if b.headers {
		t["x-match"] = "all"
		t[HeaderTopic] = b.topic
	}
	return t
}

func (b binding) name() string {
	v := url.Values{"exchange": {b.exchange}, "queue": {b.queue}, "routing_key": {b.key}, "owner": {b.owner}}
	if b.headers {
		v.Set("headers_topic", b.topic)
	}
	return v.Encode()
}

func parseBinding(name string) (binding, error) {
	v, err := url.ParseQuery(name)
	if err != nil {
		return binding{}, err
	}
	if v.Get("exchange") == "" || v.Get("queue") == "" || v.Get("owner") == "" {
		return binding{}, fmt.Errorf("binding %q lacks exchange, queue or owner", name)
	}
	b := binding{exchange: v.Get("exchange"), queue: v.Get("queue"), key: v.Get("routing_key"), owner: v.Get("owner")}
	if v.Has("headers_topic") {
		b.headers, b.topic = true, v.Get("headers_topic")
	}
	return b, nil
}

// bindingOwner returns the owner argument of this connector's bindings,
// drawing and recording it with the first binding. It must differ between
// creations of a connector of the same name: a binding that a deletion with
// cleanup.on.delete=false handed over is otherwise the very binding a later
// connector of that name makes (a binding is known by its exchange, queue,
// key and arguments), and that connector's deletion would remove it. The
// ledger keeps it across restarts, and a later creation starts with an empty
// ledger. Connector and tasks that draw one at the same moment each use the
// least recorded; a binding made with another one is recorded too and is
// removed as its own.
func (tp *topology) bindingOwner(ctx context.Context) (string, error) {
	if tp.owner != "" {
		return tp.owner, nil
	}
	rs, err := tp.ledger.List(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the ledger: %w", err)
	}
	if owner := recordedOwner(rs); owner != "" {
		tp.owner = owner
		return owner, nil
	}
	drawn := fmt.Sprintf("%s#%016x", tp.s.connector, rand.Uint64())
	if err := tp.ledger.Own(ctx, connect.Resource{Kind: KindBindingOwner, Name: drawn, Location: tp.s.location}); err != nil {
		return "", fmt.Errorf("recording the owner marker of the bindings in the ledger: %w", err)
	}
	if rs, err = tp.ledger.List(ctx); err != nil {
		return "", fmt.Errorf("reading the ledger: %w", err)
	}
	tp.owner = recordedOwner(rs)
	return tp.owner, nil
}

// recordedOwner is the owner argument the ledger says bindings get: the
// least KindBindingOwner entry, else the connector name of bindings that an
// earlier version recorded without one, else "".
func recordedOwner(rs []connect.Resource) string {
	owner, legacy := "", ""
	for _, r := range rs {
		switch r.Kind {
		case KindBindingOwner:
			if owner == "" || r.Name < owner {
				owner = r.Name
			}
		case KindBinding:
			if b, err := parseBinding(r.Name); err == nil && legacy == "" {
				legacy = b.owner
			}
		}
	}
	if owner != "" {
		return owner
	}
	return legacy
}

// brokerObjects is rs without the owner markers: what a deletion has to
// remove from the broker.
func brokerObjects(rs []connect.Resource) []connect.Resource {
	var out []connect.Resource
	for _, r := range rs {
		if r.Kind != KindBindingOwner {
			out = append(out, r)
		}
	}
	return out
}

// releaseOwners releases the owner markers once no binding is left.
func releaseOwners(ctx context.Context, l connect.Ledger, rs []connect.Resource) error {
	for _, r := range rs {
		if r.Kind != KindBindingOwner {
			continue
		}
		if err := l.Release(ctx, r); err != nil {
			return fmt.Errorf("releasing %v from the ledger: %w", r, err)
		}
	}
	return nil
}

// bindingFor is the binding of topic; its owner is tp.owner, once
// bindingOwner or unbindStale set it.
func (tp *topology) bindingFor(topic string) binding {
	b := binding{exchange: tp.s.exchange, queue: tp.s.queueName(topic), topic: topic, owner: tp.owner}
	switch tp.s.exchangeType {
	case "headers":
		b.headers = true
	case "fanout":
		// the key is ignored
	default:
		b.key = tp.s.bindingKey(topic)
	}
	return b
}

// ensureExchange makes sure the exchange exists with the configured type,
// owning it only if this call creates it.
func (tp *topology) ensureExchange(ctx context.Context) error {
	ex := tp.s.exchange
	if ex == "" || strings.HasPrefix(ex, "amq.") {
		return nil // the default and predefined exchanges always exist
	}
	passive, equivalent := tp.exchangeChecks()
	created, err := tp.provision(ctx, "exchange", ex, KeyExchangeType, tp.exchangeRes(), passive,
		func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(ex, tp.s.exchangeType, true, false, false, false, amqp.Table{OwnerArg: tp.s.connector})
		})
	if err != nil || created {
		if created {
			tp.log.Info("created exchange", "exchange", ex, "type", tp.s.exchangeType)
		}
		return err
	}
	// It exists and is not ours: use it if it is equivalent.
	if err = tp.withChannel(equivalent); err != nil {
		return tp.declareError("exchange", ex, KeyExchangeType, err)
	}
	return nil
}

// ProvisionLockQueue is the exclusive queue that serialises the
// check-then-create of exchanges and queues among tidyconnect connectors on
// one vhost (decision 0050, amended).
const ProvisionLockQueue = "tidyconnect.provision.lock"

// provisionLockWait bounds the wait for the provisioning lock; a holder only
// keeps it for a few round trips.
const provisionLockWait = 30 * time.Second

// provision decides whether the connector creates (and owns) an object.
// A passive declare on a throwaway channel finds it or not; only if it is
// missing, the vhost's provisioning lock is taken, the check repeated under
// it, the object recorded in the ledger and then declared. Two connectors
// racing for the same name are thus serialised: the second finds the object
// and does not own it. If the declare fails and a passive check (on the
// lock's own connection, which a failure of tp.conn does not affect) shows
// the object does not exist, the ledger entry is released again. created
// reports whether this call created it; (false, nil) means it already
// existed.
func (tp *topology) provision(ctx context.Context, what, name, key string, res connect.Resource,
	passive, create func(ch *amqp.Channel) error) (created bool, err error) {
	err = tp.withChannel(passive)
	if err == nil {
		return false, nil
	}
	if !isNotFound(err) {
		return false, fmt.Errorf("checking whether %s %q exists: %w", what, name, err)
	}
	lock, err := tp.lockProvisioning(ctx)
	if err != nil {
		return false, fmt.Errorf("before creating %s %q: %w", what, name, err)
	}
	defer tp.unlockProvisioning(lock)
	err = tp.withChannel(passive)
	switch {
	case err == nil:
		return false, nil // someone created it meanwhile
	case !isNotFound(err):
		return false, fmt.Errorf("checking whether %s %q exists: %w", what, name, err)
	}
	if err := tp.ledger.Own(ctx, res); err != nil {
		return false, fmt.Errorf("recording %s %q in the ledger before creating it: %w", what, name, err)
	}
	derr := tp.withChannel(create)
	if derr == nil {
		return true, nil
	}
	derr = tp.declareError(what, name, key, derr)
	// Not created for sure only if it does not exist now: then the entry
	// must go, or a later deletion would drop someone else's object of
	// that name. Otherwise (it exists, or the check fails) keep it.
	cerr := onChannel(lock, passive)
	if !isNotFound(cerr) {
		return false, derr
	}
	if err := tp.ledger.Release(ctx, res); err != nil {
		return false, errors.Join(derr, fmt.Errorf("releasing the ledger entry of %s %q, which was not created: %w", what, name, err))
	}
	return false, derr
}

func onChannel(conn *amqp.Connection, fn func(ch *amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening an AMQP channel: %w", err)
	}
	err = fn(ch)
	if !ch.IsClosed() {
		_ = ch.Close()
	}
	return err
}

// lockProvisioning takes the vhost's provisioning lock: the exclusive queue
// ProvisionLockQueue, declared on a connection of its own. RabbitMQ refuses
// a second connection's declare with 405 RESOURCE_LOCKED (closing that
// channel), so a refused attempt is retried on a new channel with backoff,
// within ctx and provisionLockWait. The lock dies with its connection, so a
// crashed holder cannot keep it.
func (tp *topology) lockProvisioning(ctx context.Context) (*amqp.Connection, error) {
	ctx, cancel := context.WithTimeout(ctx, provisionLockWait)
	defer cancel()
	conn, err := dial(ctx, tp.s, fmt.Sprintf("tidyconnect:%s:provision-lock", tp.s.connector))
	if err != nil {
		return nil, err
	}
	backoff := 5 * time.Millisecond
	for {
		err := onChannel(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(ProvisionLockQueue, false, true, true, false, nil)
			return err
		})
		if err == nil {
			return conn, nil
		}
		if amqpCode(err) != amqp.ResourceLocked {
			_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
			return nil, fmt.Errorf("taking the provisioning lock (exclusive queue %q): %w", ProvisionLockQueue, err)
		}
		timer := time.NewTimer(backoff + time.Duration(rand.Int64N(int64(backoff))))
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
			return nil, fmt.Errorf("waiting for the provisioning lock (exclusive queue %q, held by another tidyconnect connector on this vhost): %w", ProvisionLockQueue, ctx.Err())
		}
		backoff = min(backoff*2, 200*time.Millisecond)
	}
}

// unlockProvisioning closes the lock's connection, which deletes the
// exclusive lock queue and so frees the lock. No queue.delete first: a lock
// queue whose process stalls would hold the caller without bound, past a
// stop.
func (tp *topology) unlockProvisioning(conn *amqp.Connection) {
	_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
}

func (tp *topology) declareError(what, name, key string, err error) error {
	if amqpCode(err) == amqp.PreconditionFailed {
		return fmt.Errorf("%s %q already exists with different arguments (RabbitMQ: %v); align %s with the existing %s, or choose another name, or delete the %s by hand",
			what, name, err, key, what, what)
	}
	return fmt.Errorf("declaring %s %q: %w", what, name, err)
}

// ensureTopic makes sure the queue for topic exists and is bound.
func (tp *topology) ensureTopic(ctx context.Context, topic string) error {
	q := tp.s.queueName(topic)
	if err := checkName(q); err != nil {
		return fmt.Errorf("queue name %q from %s for topic %q: %w", q, KeyQueue, topic, err)
	}
	b := tp.bindingFor(topic)
	// Checked before anything is created or recorded (topics.regex topics
	// are only seen here): amqp091 refuses the frame and closes the
	// connection, and the binding's ledger entry failed every deletion.
	if err := checkBindingKey(b.key); err != nil {
		return fmt.Errorf("%s for topic %q: %w", KeyRoutingKey, topic, err)
	}
	if err := tp.ensureQueue(ctx, q); err != nil {
		return err
	}
	// The marked binding is ours even between two objects that are not: its
	// owner argument makes it distinct from any binding a person made, or
	// an earlier connector of this name left.
	owner, err := tp.bindingOwner(ctx)
	if err != nil {
		return err
	}
	b.owner = owner
	if err := tp.ledger.Own(ctx, connect.Resource{Kind: KindBinding, Name: b.name(), Location: tp.s.location}); err != nil {
		return fmt.Errorf("recording the binding of queue %q in the ledger: %w", q, err)
	}
	err = tp.withChannel(func(ch *amqp.Channel) error {
		return ch.QueueBind(q, b.key, b.exchange, false, b.args())
	})
	if err != nil {
		return fmt.Errorf("binding queue %q to exchange %q with key %q: %w", q, b.exchange, b.key, err)
	}
	return nil
}

// ensureQueue makes sure queue q exists with the configured type, owning it
// only if this call creates it.
func (tp *topology) ensureQueue(ctx context.Context, q string) error {
	passive, equivalent := tp.queueChecks(q)
	created, err := tp.provision(ctx, "queue", q, KeyQueueType, tp.queueRes(q), passive,
		func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": tp.s.queueType, OwnerArg: tp.s.connector})
			return err
		})
	if err != nil || created {
		if created {
			tp.log.Info("created queue", "queue", q, "type", tp.s.queueType)
		}
		return err
	}
	if err = tp.withChannel(equivalent); err != nil {
		return tp.declareError("queue", q, KeyQueueType, err)
	}
	return nil
}

// exchangeChecks returns the passive declare of the configured exchange and
// the check that an existing one is equivalent to the configuration (a
// declare without the owner marker, which RabbitMQ leaves out of it).
func (tp *topology) exchangeChecks() (passive, equivalent func(ch *amqp.Channel) error) {
	ex := tp.s.exchange
	return func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(ex, tp.s.exchangeType, true, false, false, false, nil)
		}, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(ex, tp.s.exchangeType, true, false, false, false, nil)
		}
}

// queueChecks is exchangeChecks for queue q.
func (tp *topology) queueChecks(q string) (passive, equivalent func(ch *amqp.Channel) error) {
	return func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			return err
		}, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": tp.s.queueType})
			return err
		}
}

// conflict reports an existing object whose arguments differ from the
// configuration; a missing one is no conflict.
func (tp *topology) conflict(what, name, key string, passive, equivalent func(ch *amqp.Channel) error) error {
	err := tp.withChannel(passive)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking whether %s %q exists: %w", what, name, err)
	}
	if err := tp.withChannel(equivalent); err != nil {
		return tp.declareError(what, name, key, err)
	}
	return nil
}

// preflight checks, before anything is created, the exchange and the queues
// of topics that already exist. A conflicting one (406 PRECONDITION_FAILED)
// thus fails Start with nothing made: before, the objects of the topics
// ahead of it were created and owned, and aligning the key with the
// existing queue then failed on the connector's own new queues.
func (tp *topology) preflight(topics []string) error {
	if ex := tp.s.exchange; ex != "" && !strings.HasPrefix(ex, "amq.") {
		passive, equivalent := tp.exchangeChecks()
		if err := tp.conflict("exchange", ex, KeyExchangeType, passive, equivalent); err != nil {
			return err
		}
	}
	for _, topic := range topics {
		q := tp.s.queueName(topic)
		passive, equivalent := tp.queueChecks(q)
		if err := tp.conflict("queue", q, KeyQueueType, passive, equivalent); err != nil {
			return err
		}
	}
	return nil
}

// cleanup drops what the ledger lists at this broker location: bindings,
// then queues, then the exchange. Something already gone counts as dropped.
// It returns an error naming every resource that remains.
func (tp *topology) cleanup(ctx context.Context) error {
	rs, err := tp.ledger.List(ctx)
	if err != nil {
		return fmt.Errorf("reading the ledger: %w", err)
	}
	var remain []string
	for _, kind := range []string{KindBinding, KindQueue, KindExchange} {
		for _, r := range rs {
			if r.Kind != kind {
				continue
			}
			if r.Location != tp.s.location {
				remain = append(remain, fmt.Sprintf("%v (it lives at another broker than %s now names; point %s back there to delete it)", r, KeyURL, KeyURL))
				continue
			}
			if err := tp.drop(r); err != nil {
				remain = append(remain, fmt.Sprintf("%v (%v)", r, err))
				continue
			}
			if err := tp.ledger.Release(ctx, r); err != nil {
				remain = append(remain, fmt.Sprintf("%v (dropped, but releasing the ledger entry failed: %v)", r, err))
				continue
			}
			tp.log.Info("deleted owned resource", "kind", r.Kind, "name", r.Name)
		}
	}
	if len(remain) > 0 {
		return fmt.Errorf("amqpsink cleanup left %d owned resource(s); deleting the connector again retries: %s", len(remain), strings.Join(remain, "; "))
	}
	return releaseOwners(ctx, tp.ledger, rs)
}

// unbindStale removes the owned bindings (on this broker) that no topic in
// topics wants any more, after a reconfiguration changed the queue or
// routing-key template or the exchange. The queues stay, with their
// messages; they go with the connector.
func (tp *topology) unbindStale(ctx context.Context, topics []string) error {
	rs, err := tp.ledger.List(ctx)
	if err != nil {
		return fmt.Errorf("reading the ledger: %w", err)
	}
	if tp.owner == "" {
		tp.owner = recordedOwner(rs)
	}
	want := map[string]bool{}
	for _, t := range topics {
		want[tp.bindingFor(t).name()] = true
	}
	for _, r := range rs {
		if r.Kind != KindBinding || r.Location != tp.s.location || want[r.Name] {
			continue
		}
		if err := tp.drop(r); err != nil {
			return fmt.Errorf("removing a binding the configuration no longer wants (%v): %w", r, err)
		}
		if err := tp.ledger.Release(ctx, r); err != nil {
			return fmt.Errorf("releasing %v from the ledger: %w", r, err)
		}
		tp.log.Info("removed a binding the configuration no longer wants; its queue stays until the connector is deleted", "binding", r.Name)
	}
	return nil
}

// drop deletes one owned object. It cannot check that an exchange or queue
// is still the one it created: AMQP 0-9-1 returns no arguments, so the
// x-tidyconnect-owner marker is invisible to a passive declare. Ownership
// rests on the serialised check-then-create in provision.
func (tp *topology) drop(r connect.Resource) error {
	err := tp.withChannel(func(ch *amqp.Channel) error {
		switch r.Kind {
		case KindBinding:
			b, err := parseBinding(r.Name)
			if err != nil {
				return err
			}
			if len(b.key) > 255 || len(b.queue) > 255 || len(b.exchange) > 255 {
				// The broker cannot hold such a binding (an earlier version
				// recorded it before the bind failed); sending the unbind
				// would make amqp091 close the connection and fail the rest
				// of the cleanup.
				return nil
			}
			return ch.QueueUnbind(b.queue, b.key, b.exchange, b.args())
		case KindQueue:
			_, err := ch.QueueDelete(r.Name, false, false, false)
			return err
		case KindExchange:
			return ch.ExchangeDelete(r.Name, false, false)
		}
		return fmt.Errorf("unknown resource kind %q", r.Kind)
	})
	if isNotFound(err) {
		return nil // already gone
	}
	return err
}
