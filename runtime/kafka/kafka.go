// Package kafka is tidyconnect's franz-go wiring: client options, topic
// creation on demand, the cluster id lookup, and the embedded broker (kfake
// persisting to a data directory) that standalone mode runs when no Kafka is
// configured.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ClientOpts returns the options every tidyconnect client starts from: the
// seed brokers, the logger (franz-go's own logs at warn and above, through
// slog), and the caller's extra options, which win.
func ClientOpts(seeds []string, logger *slog.Logger, extra ...kgo.Opt) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(seeds...)}
	if logger != nil {
		opts = append(opts, kgo.WithLogger(SlogLogger(logger, kgo.LogLevelWarn)))
	}
	return append(opts, extra...)
}

// NewClient returns a client for seeds; see ClientOpts.
func NewClient(seeds []string, logger *slog.Logger, extra ...kgo.Opt) (*kgo.Client, error) {
	if len(seeds) == 0 {
		return nil, errors.New("kafka: no seed brokers: set the Kafka bootstrap servers (host:port, comma separated)")
	}
	cl, err := kgo.NewClient(ClientOpts(seeds, logger, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka: creating a client for %v: %w", seeds, err)
	}
	return cl, nil
}

// SlogLogger adapts an slog.Logger to franz-go's kgo.Logger at level.
func SlogLogger(l *slog.Logger, level kgo.LogLevel) kgo.Logger { return slogLogger{l, level} }

type slogLogger struct {
	l     *slog.Logger
	level kgo.LogLevel
}

func (s slogLogger) Level() kgo.LogLevel { return s.level }

func (s slogLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	var lv slog.Level
	switch level {
	case kgo.LogLevelError:
		lv = slog.LevelError
	case kgo.LogLevelWarn:
		lv = slog.LevelWarn
	case kgo.LogLevelInfo:
		lv = slog.LevelInfo
	default:
		lv = slog.LevelDebug
	}
	s.l.Log(context.Background(), lv, msg, keyvals...)
}

// TopicCreator creates topics on demand, idempotently: a topic that already
// exists is fine, and a topic it has seen exist is not asked for again.
// It is safe for concurrent use.
type TopicCreator struct {
	adm               *kadm.Client
	partitions        int32
	replicationFactor int16
	// Logger, if set, is told of topics assumed to exist because the
	// client may not create them.
	Logger *slog.Logger
	// Configs, if set, are the topic configs new topics are created with
	// (e.g. max.message.bytes).
	Configs map[string]*string

	mu    sync.Mutex
	known map[string]bool
}

// NewTopicCreator returns a creator using cl with the given defaults for new
// topics; -1 for either means the broker's default.
func NewTopicCreator(cl *kgo.Client, partitions int32, replicationFactor int16) *TopicCreator {
	return &TopicCreator{adm: kadm.NewClient(cl), partitions: partitions, replicationFactor: replicationFactor, known: map[string]bool{}}
}

// Ensure creates the topics that do not exist yet with the creator's
// defaults.
func (c *TopicCreator) Ensure(ctx context.Context, topics ...string) error {
	return c.EnsureWith(ctx, c.partitions, c.replicationFactor, topics...)
}

// EnsureWith creates the topics that do not exist yet with partitions and
// replicationFactor (-1 = broker default).
func (c *TopicCreator) EnsureWith(ctx context.Context, partitions int32, replicationFactor int16, topics ...string) error {
	c.mu.Lock()
	var missing []string
	for _, t := range topics {
		if !c.known[t] {
			missing = append(missing, t)
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	assumed, err := createTopics(ctx, c.adm, partitions, replicationFactor, c.Configs, missing...)
	if err != nil {
		return err
	}
	if len(assumed) > 0 && c.Logger != nil {
		c.Logger.Warn("not allowed to create topics (no CREATE permission); assuming they exist: a produce to a missing one fails", "topics", assumed)
	}
	// Assumed ones are asked for again next time: a permission granted
	// since then creates them.
	c.mu.Lock()
	for _, t := range missing {
		if !slices.Contains(assumed, t) {
			c.known[t] = true
		}
	}
	c.mu.Unlock()
	return nil
}

// EnsureTopics creates topics with partitions and replicationFactor (-1 =
// broker default); a topic that already exists counts as created. So does
// one the client may not create (TOPIC_ or CLUSTER_AUTHORIZATION_FAILED),
// as Kafka Connect's TopicAdmin assumes: Kafka checks the CREATE permission
// before existence, so a topic an administrator made answers that way too,
// and a topic that really is missing fails the first produce to it.
func EnsureTopics(ctx context.Context, adm *kadm.Client, partitions int32, replicationFactor int16, topics ...string) error {
	_, err := createTopics(ctx, adm, partitions, replicationFactor, nil, topics...)
	return err
}

// ErrUnreachable marks a request no broker answered (it could not be sent,
// or its context ended first): asking again later may succeed, unlike a
// refusal of the request's content.
var ErrUnreachable = errors.New("no broker answered")

// createTopics is EnsureTopics, also returning the topics assumed to exist
// because the client may not create them.
func createTopics(ctx context.Context, adm *kadm.Client, partitions int32, replicationFactor int16, configs map[string]*string, topics ...string) (assumed []string, err error) {
	if len(topics) == 0 {
		return nil, nil
	}
	resps, err := adm.CreateTopics(ctx, partitions, replicationFactor, configs, topics...)
	if err != nil {
		return nil, fmt.Errorf("kafka: creating topics %v: %w: %w; check the brokers are reachable", topics, ErrUnreachable, err)
	}
	var errs []string
	for _, t := range topics {
		r, ok := resps[t]
		if !ok || r.Err == nil || errors.Is(r.Err, kerr.TopicAlreadyExists) {
			continue
		}
		if errors.Is(r.Err, kerr.TopicAuthorizationFailed) || errors.Is(r.Err, kerr.ClusterAuthorizationFailed) {
			assumed = append(assumed, t)
			continue
		}
		msg := r.Err.Error()
		if r.ErrMessage != "" {
			msg += " (" + r.ErrMessage + ")"
		}
		errs = append(errs, fmt.Sprintf("%s: %s", t, msg))
	}
	if len(errs) > 0 {
		return assumed, fmt.Errorf("kafka: creating topics (partitions %d, replication factor %d) failed: %s; fix the topic settings or create the topics yourself", partitions, replicationFactor, strings.Join(errs, "; "))
	}
	return assumed, nil
}

// ClusterID returns the Kafka cluster id, as GET / reports kafka_cluster_id.
func ClusterID(ctx context.Context, cl *kgo.Client) (string, error) {
	m, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	if err != nil {
		return "", fmt.Errorf("kafka: reading the cluster id: %w; check the brokers are reachable", err)
	}
	return m.Cluster, nil
}
