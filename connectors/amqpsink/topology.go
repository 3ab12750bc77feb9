package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// dial opens a connection to the broker; ctx bounds the TCP dial.
func dial(ctx context.Context, s *settings, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
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
			return c, nil
		},
	})
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
}

func (tp *topology) withChannel(fn func(ch *amqp.Channel) error) error {
	ch, err := tp.conn.Channel()
	if err != nil {
		return fmt.Errorf("opening an AMQP channel: %w", err)
	}
	err = fn(ch)
	if !ch.IsClosed() {
		_ = ch.Close()
	}
	return err
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

func (tp *topology) bindingFor(topic string) binding {
	b := binding{exchange: tp.s.exchange, queue: tp.s.queueName(topic), topic: topic, owner: tp.s.connector}
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
	err := tp.withChannel(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(ex, tp.s.exchangeType, true, false, false, false, nil)
	})
	switch {
	case isNotFound(err):
		if err := tp.ledger.Own(ctx, tp.exchangeRes()); err != nil {
			return fmt.Errorf("recording exchange %q in the ledger before creating it: %w", ex, err)
		}
		err = tp.withChannel(func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(ex, tp.s.exchangeType, true, false, false, false, amqp.Table{OwnerArg: tp.s.connector})
		})
		if err != nil {
			return tp.declareError("exchange", ex, KeyExchangeType, err)
		}
		tp.log.Info("created exchange", "exchange", ex, "type", tp.s.exchangeType)
		return nil
	case err != nil:
		return fmt.Errorf("checking whether exchange %q exists: %w", ex, err)
	}
	// It exists and is not ours: use it if it is equivalent.
	err = tp.withChannel(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(ex, tp.s.exchangeType, true, false, false, false, nil)
	})
	if err != nil {
		return tp.declareError("exchange", ex, KeyExchangeType, err)
	}
	return nil
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
	args := amqp.Table{"x-queue-type": tp.s.queueType}
	err := tp.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err
	})
	switch {
	case isNotFound(err):
		if err := tp.ledger.Own(ctx, tp.queueRes(q)); err != nil {
			return fmt.Errorf("recording queue %q in the ledger before creating it: %w", q, err)
		}
		owned := amqp.Table{"x-queue-type": tp.s.queueType, OwnerArg: tp.s.connector}
		err = tp.withChannel(func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(q, true, false, false, false, owned)
			return err
		})
		if err != nil {
			return tp.declareError("queue", q, KeyQueueType, err)
		}
		tp.log.Info("created queue", "queue", q, "type", tp.s.queueType, "topic", topic)
	case err != nil:
		return fmt.Errorf("checking whether queue %q exists: %w", q, err)
	default:
		err = tp.withChannel(func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(q, true, false, false, false, args)
			return err
		})
		if err != nil {
			return tp.declareError("queue", q, KeyQueueType, err)
		}
	}
	b := tp.bindingFor(topic)
	// The marked binding is ours even between two objects that are not: its
	// owner argument makes it distinct from any binding a person made.
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
	return nil
}

func (tp *topology) drop(r connect.Resource) error {
	err := tp.withChannel(func(ch *amqp.Channel) error {
		switch r.Kind {
		case KindBinding:
			b, err := parseBinding(r.Name)
			if err != nil {
				return err
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
