// Package amqpsink is the RabbitMQ queue-provisioning sink connector: it
// delivers Kafka records into queues it declares itself, at least once, with
// pipelined publisher confirms, and removes the exchange, queues and bindings
// it created when — and only when — the connector is deleted.
//
// See docs/amqpsink.md for the configuration, the message format and the
// objects it creates.
package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/version"
)

// Class is the connector.class value.
const Class = "amqpsink"

// Plugin returns the amqpsink plugin.
func Plugin() connect.Plugin {
	return connect.Plugin{
		Class:        Class,
		Aliases:      []string{"AmqpSinkConnector", "RabbitMQSinkConnector"},
		NewConnector: func() connect.Connector { return &Connector{} },
		NewTask:      func() connect.Task { return &Task{} },
	}
}

func spec() connect.Spec {
	return connect.Spec{
		Type:    connect.TypeSink,
		Version: version.Version,
		Doc:     "Delivers Kafka records into RabbitMQ queues it provisions (exchange, one queue per topic, bindings), with publisher confirms; removes what it created when the connector is deleted.",
		Config:  configDef,
	}
}

// Connector provisions the exchange and, for a fixed topic list, the queues
// and bindings; on deletion it drops everything the ledger lists.
type Connector struct {
	mu      sync.Mutex
	cfg     connect.Config
	s       *settings
	host    *connect.Host
	conn    *amqp.Connection
	deleted bool
	cancel  context.CancelFunc
}

var _ connect.Validator = (*Connector)(nil)

func (c *Connector) Spec() connect.Spec { return spec() }

// Validate checks what the ConfigDef cannot: key combinations and templates.
// It does not contact the broker, so a config can be validated offline.
func (c *Connector) Validate(_ context.Context, cfg connect.Config) map[string][]string {
	cfg = configDef.WithDefaults(cfg)
	errs := validate(cfg, false)
	checkTopicNames(cfg, errs)
	checkWildcardWords(cfg, errs)
	return errs
}

func (c *Connector) Start(ctx context.Context, cfg connect.Config) error {
	h := connect.HostFrom(ctx)
	s, err := parse(cfg, h.Connector)
	c.mu.Lock()
	c.host, c.cfg, c.s = h, cfg.Clone(), s
	sctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if h.CleanupOnly {
		// Stop(true) and Stopped follow at once; Stopped dials only if the
		// ledger lists something to drop. A dial here failed Start against
		// an unreachable broker, and the runtime then ran Stopped without
		// the deletion: not even cleanup.on.delete=false, which needs no
		// broker, could finish.
		return nil
	}
	errs := map[string][]string{}
	full := configDef.WithDefaults(cfg)
	checkTopicNames(full, errs)
	checkWildcardWords(full, errs)
	if err := validationError(errs); err != nil {
		return err
	}
	conn, err := dial(sctx, s, ConnectionName(s.connector, -1))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	tp := &topology{s: s, conn: conn, ledger: h.Ledger, log: h.Logger}
	if err := tp.preflight(s.topics); err != nil {
		return err
	}
	if err := tp.ensureExchange(sctx); err != nil {
		return err
	}
	for _, topic := range s.topics {
		if err := tp.ensureTopic(sctx, topic); err != nil {
			return err
		}
	}
	if s.topicsRegex == nil {
		// With a fixed topic list every binding the configuration wants is
		// known: one left from an earlier configuration would keep filling
		// its queue.
		if err := tp.unbindStale(sctx, s.topics); err != nil {
			return err
		}
	}
	h.Logger.Info("amqpsink started", "url", connect.MaskCredentials(s.url), "exchange", s.exchange, "topics", s.topics)
	return nil
}

// TaskConfigs gives every task the connector's configuration: the runtime's
// consumer group spreads the partitions over them.
func (c *Connector) TaskConfigs(maxTasks int) ([]connect.Config, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if maxTasks < 1 {
		return nil, fmt.Errorf("tasks.max must be at least 1, got %d", maxTasks)
	}
	out := make([]connect.Config, maxTasks)
	for i := range out {
		out[i] = c.cfg.Clone()
	}
	return out, nil
}

func (c *Connector) Stop(connectorDeleted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleted = c.deleted || connectorDeleted
	if c.cancel != nil {
		c.cancel()
	}
}

func (c *Connector) Stopped(ctx context.Context) error {
	c.mu.Lock()
	s, h, conn, deleted := c.s, c.host, c.conn, c.deleted
	c.conn = nil
	c.mu.Unlock()
	if h == nil {
		h = connect.HostFrom(ctx)
	}
	defer func() {
		if conn != nil {
			_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		}
	}()
	if !deleted {
		return nil
	}
	if s == nil {
		// Start failed on the configuration; the ledger says whether there
		// is anything we would have to drop without one.
		if rs, err := h.Ledger.List(ctx); err == nil && len(brokerObjects(rs)) == 0 {
			return releaseOwners(ctx, h.Ledger, rs)
		}
		return errors.New("cannot delete the owned RabbitMQ resources: the configuration is invalid; fix it and delete the connector again")
	}
	if !s.cleanup {
		// Keeping them means handing them over to the user: the ledger must
		// end empty, or the runtime would see an unfinished deletion forever.
		h.Logger.Info("connector deleted; keeping its exchange, queues and bindings", "reason", KeyCleanupOnDelete+"=false")
		rs, err := h.Ledger.List(ctx)
		if err != nil {
			return fmt.Errorf("reading the ledger: %w", err)
		}
		for _, r := range rs {
			if err := h.Ledger.Release(ctx, r); err != nil {
				return fmt.Errorf("releasing %s from the ledger: %w", r, err)
			}
		}
		return nil
	}
	all, err := h.Ledger.List(ctx)
	if err != nil {
		return fmt.Errorf("reading the ledger: %w", err)
	}
	rs := brokerObjects(all)
	if len(rs) == 0 {
		return releaseOwners(ctx, h.Ledger, all)
	}
	if conn == nil || conn.IsClosed() {
		if conn, err = dial(ctx, s, ConnectionName(s.connector, -1)); err != nil {
			names := make([]string, len(rs))
			for i, r := range rs {
				names[i] = r.String()
			}
			return fmt.Errorf("cannot delete the %d owned RabbitMQ resource(s) %s; deleting the connector again retries: %w", len(rs), strings.Join(names, "; "), err)
		}
	}
	tp := &topology{s: s, conn: conn, ledger: h.Ledger, log: h.Logger}
	// amqp091's deletes take no context, and a broker that stalls one (a
	// queue process that does not answer) holds the call while heartbeats
	// keep the connection up: when ctx ends, closing the connection fails
	// the pending call, and what is left stays in the ledger for a retry.
	done := make(chan error, 1)
	go func() { done <- tp.cleanup(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
		err := <-done
		return fmt.Errorf("deleting the owned RabbitMQ resources was cut short (%w); deleting the connector again retries: %v", ctx.Err(), err)
	}
}

var _ slog.LogValuer = (*settings)(nil)

// LogValue keeps the URL's password out of any log line that prints settings.
func (s *settings) LogValue() slog.Value {
	return slog.GroupValue(slog.String("url", connect.MaskCredentials(s.url)), slog.String("exchange", s.exchange))
}
