package kafka

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Embedded is an in-process Kafka-protocol broker (franz-go's kfake) that
// persists topics, records, committed group offsets and its cluster id under
// a data directory, so a standalone worker keeps its data across restarts.
// It listens on 127.0.0.1 only.
type Embedded struct {
	cluster   *kfake.Cluster
	addrs     []string
	clusterID string
	dataDir   string
	logger    *slog.Logger
	closeOnce sync.Once
}

// EmbeddedOpt configures StartEmbedded.
type EmbeddedOpt func(*embeddedCfg)

type embeddedCfg struct {
	logger     *slog.Logger
	partitions int
	syncWrites bool
	maxMessage int
	extra      []kfake.Opt
}

// WithEmbeddedLogger sets the logger; the broker's own warnings and errors go
// to it with component=embedded-kafka.
func WithEmbeddedLogger(l *slog.Logger) EmbeddedOpt { return func(c *embeddedCfg) { c.logger = l } }

// WithDefaultPartitions sets the partitions of auto-created topics
// (default 1).
func WithDefaultPartitions(n int) EmbeddedOpt { return func(c *embeddedCfg) { c.partitions = n } }

// WithSyncWrites fsyncs every produced batch (slower, survives power loss).
func WithSyncWrites() EmbeddedOpt { return func(c *embeddedCfg) { c.syncWrites = true } }

// WithMaxMessageBytes sets the broker's message.max.bytes, the largest
// record batch it accepts (Kafka's default, 1048588, when unset).
func WithMaxMessageBytes(n int) EmbeddedOpt { return func(c *embeddedCfg) { c.maxMessage = n } }

// WithKfakeOpts passes extra options to kfake.NewCluster.
func WithKfakeOpts(opts ...kfake.Opt) EmbeddedOpt {
	return func(c *embeddedCfg) { c.extra = append(c.extra, opts...) }
}

// StartEmbedded starts the embedded broker persisting under dataDir (created
// if needed) and listening on listenAddr, which must be on 127.0.0.1
// ("127.0.0.1:9092", "localhost:9092", ":9092"; port 0 picks a free one).
// ctx bounds the start only. Close stops it.
func StartEmbedded(ctx context.Context, dataDir, listenAddr string, opts ...EmbeddedOpt) (*Embedded, error) {
	cfg := embeddedCfg{logger: slog.Default(), partitions: 1}
	for _, o := range opts {
		o(&cfg)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kafka: starting the embedded broker: %w", err)
	}
	if dataDir == "" {
		return nil, fmt.Errorf("kafka: the embedded broker needs a data directory: set --data-dir")
	}
	port, err := embeddedPort(listenAddr)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, fmt.Errorf("kafka: creating the embedded broker's data directory %s: %w; check its permissions", dataDir, err)
	}
	logger := cfg.logger.With("component", "embedded-kafka")
	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DataDir(dataDir),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(cfg.partitions),
		kfake.WithLogger(kfakeLogger{logger}),
	}
	if port != 0 {
		kopts = append(kopts, kfake.Ports(port))
	}
	// A fresh data dir gets a new id; an existing one keeps its persisted id
	// (kfake reads it from meta.json and ignores this option).
	if _, err := os.Stat(filepath.Join(dataDir, "meta.json")); err != nil {
		kopts = append(kopts, kfake.ClusterID(newClusterID()))
	}
	if cfg.syncWrites {
		kopts = append(kopts, kfake.SyncWrites())
	}
	if cfg.maxMessage > 0 {
		kopts = append(kopts, kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(cfg.maxMessage)}))
	}
	kopts = append(kopts, cfg.extra...)
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: starting the embedded broker on %s with data in %s: %w; is the port free and the directory readable?", listenAddr, dataDir, err)
	}
	e := &Embedded{cluster: c, addrs: c.ListenAddrs(), dataDir: dataDir, logger: logger}
	cl, err := NewClient(e.addrs, nil)
	if err == nil {
		// An in-process broker answers at once; bound the probe so a broken
		// one fails the start instead of hanging it.
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		e.clusterID, err = ClusterID(pctx, cl)
		cancel()
		cl.Close()
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("kafka: the embedded broker started but does not answer: %w", err)
	}
	logger.Info("embedded Kafka broker started (kfake; for development and standalone use, not a production cluster)",
		"addrs", e.addrs, "data_dir", dataDir, "cluster_id", e.clusterID)
	return e, nil
}

func embeddedPort(listenAddr string) (int, error) {
	if listenAddr == "" {
		return 0, nil
	}
	host, p, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return 0, fmt.Errorf("kafka: embedded broker listen address %q: %w; use host:port such as 127.0.0.1:9092", listenAddr, err)
	}
	switch host {
	case "", "127.0.0.1", "localhost":
	default:
		return 0, fmt.Errorf("kafka: embedded broker listen address %q: the embedded broker listens on 127.0.0.1 only; use 127.0.0.1:<port> or run a real Kafka cluster", listenAddr)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return 0, fmt.Errorf("kafka: embedded broker listen address %q: port %q is not a number between 0 and 65535", listenAddr, p)
	}
	return port, nil
}

func newClusterID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Addrs returns the broker's host:port addresses, for kgo.SeedBrokers.
func (e *Embedded) Addrs() []string { return e.addrs }

// ClusterID returns the cluster id (stable across restarts on one data dir).
func (e *Embedded) ClusterID() string { return e.clusterID }

// Close stops the broker, flushing its state to the data directory. It may
// be called more than once.
func (e *Embedded) Close() {
	e.closeOnce.Do(func() {
		e.cluster.Close()
		e.logger.Info("embedded Kafka broker stopped", "data_dir", e.dataDir)
	})
}

type kfakeLogger struct{ l *slog.Logger }

func (k kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	var lv slog.Level
	switch level {
	case kfake.LogLevelError:
		lv = slog.LevelError
	case kfake.LogLevelWarn:
		lv = slog.LevelWarn
	default:
		return // kfake logs every request at info: too much for a worker log
	}
	k.l.Log(context.Background(), lv, fmt.Sprintf(format, args...))
}
