package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/connectors/amqpsink"
	"github.com/tidyconnect/tidyconnect/connectors/pgaudit"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/herder"
	"github.com/tidyconnect/tidyconnect/runtime/kafka"
	"github.com/tidyconnect/tidyconnect/runtime/logging"
	"github.com/tidyconnect/tidyconnect/runtime/plugins"
	"github.com/tidyconnect/tidyconnect/runtime/rest"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/version"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// builtinPlugins are the connectors this binary runs.
func builtinPlugins() []connect.Plugin {
	return []connect.Plugin{pgaudit.Plugin(), amqpsink.Plugin()}
}

// connectorFile is a connector.json: the POST /connectors body.
type connectorFile struct {
	path    string
	name    string
	config  connect.Config
	initial worker.TargetState
}

// readConnectorFile parses one file, naming the file and the field in every
// error.
func readConnectorFile(path string) (connectorFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return connectorFile{}, fmt.Errorf("connector file %s: %w", path, err)
	}
	// A UTF-8 byte order mark (Windows editors write one) is skipped, as
	// before a REST body: the file is a POST /connectors body.
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	if len(bytes.TrimSpace(data)) == 0 {
		return connectorFile{}, fmt.Errorf("connector file %s is empty; write a JSON object like {\"name\": \"...\", \"config\": {...}}", path)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return connectorFile{}, fmt.Errorf("connector file %s is not a JSON object like {\"name\": \"...\", \"config\": {...}}: %v", path, err)
	}
	// As over REST, nothing may follow the object: a second connector in
	// the file would otherwise be ignored without a word.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return connectorFile{}, fmt.Errorf("connector file %s: unexpected data after the JSON object; write one connector per file", path)
	}
	var msgs []string
	cf := connectorFile{path: path}
	for k := range raw {
		switch k {
		case "name", "config", "initial_state":
		default:
			msgs = append(msgs, fmt.Sprintf("unknown field %q (expected name, config, initial_state)", k))
		}
	}
	if v, ok := raw["name"]; !ok {
		msgs = append(msgs, `field "name" is required`)
	} else if err := json.Unmarshal(v, &cf.name); err != nil {
		msgs = append(msgs, `field "name" must be a string`)
	}
	if v, ok := raw["config"]; !ok {
		msgs = append(msgs, `field "config" is required: an object of string values`)
	} else {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(v, &m); err != nil {
			msgs = append(msgs, `field "config" must be an object of string values`)
		}
		cf.config = connect.Config{}
		for k, rv := range m {
			s, ok := rest.ConfigValue(rv)
			if !ok {
				msgs = append(msgs, fmt.Sprintf("field config.%s must be a string (write %s as \"...\")", k, strings.TrimSpace(string(rv))))
				continue
			}
			cf.config[k] = s
		}
	}
	if v, ok := raw["initial_state"]; ok && string(bytes.TrimSpace(v)) != "null" {
		// Checked here, as REST does, so a bad file stops the start before
		// anything (the store, the broker, other files' connectors) does.
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			msgs = append(msgs, `field "initial_state" must be RUNNING, PAUSED or STOPPED`)
		} else {
			switch t := worker.TargetState(strings.ToUpper(strings.TrimSpace(s))); t {
			case worker.TargetRunning, worker.TargetPaused, worker.TargetStopped:
				cf.initial = t
			default:
				msgs = append(msgs, fmt.Sprintf(`field "initial_state" %q must be RUNNING, PAUSED or STOPPED`, s))
			}
		}
	}
	if len(msgs) > 0 {
		sort.Strings(msgs)
		return connectorFile{}, fmt.Errorf("connector file %s: %s", path, strings.Join(msgs, "; "))
	}
	if msg := herder.ValidateName(cf.name); msg != "" {
		return connectorFile{}, fmt.Errorf("connector file %s: field \"name\": %s", path, msg)
	}
	return cf, nil
}

// newLogger logs at --log-level, which GET/PUT /admin/loggers read and
// change at run time (for everything, or per connector) through levels.
func newLogger(cfg *config, w io.Writer) (*slog.Logger, *logging.Levels) {
	level, _ := parseLevel(cfg.logLevel)
	levels := logging.NewLevels(level)
	opts := &slog.HandlerOptions{Level: logging.Lowest, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		// TRACE, which /admin/loggers can set, rather than slog's DEBUG-4.
		if a.Key == slog.LevelKey && len(groups) == 0 {
			if l, ok := a.Value.Any().(slog.Level); ok && l < slog.LevelDebug {
				a.Value = slog.StringValue("TRACE")
			}
		}
		return a
	}}
	if cfg.logFormat == "json" {
		return slog.New(levels.Handler(slog.NewJSONHandler(w, opts))), levels
	}
	return slog.New(levels.Handler(slog.NewTextHandler(w, opts))), levels
}

// workerID is host:port of the REST listener, with a real host name for an
// unspecified address.
func workerID(cfg *config, ln net.Listener) string {
	if cfg.workerID != "" {
		return cfg.workerID
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// runStandalone runs until ctx ends (SIGTERM/SIGINT), then shuts down
// cleanly: REST stops accepting, the herder stops everything with
// Stop(false), the store and the embedded broker close.
func runStandalone(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	start := time.Now()
	cfg, err := parseStandalone(args, stdout, lookupEnv)
	if err != nil {
		return err
	}
	// Bad connector files are input errors: found before anything starts.
	var files []connectorFile
	var fileErrs []string
	fileOf := map[string]string{} // connector name -> the first file naming it
	for _, p := range cfg.connectorFiles {
		cf, err := readConnectorFile(p)
		if err != nil {
			fileErrs = append(fileErrs, err.Error())
			continue
		}
		// The second would be taken for a stored connector and ignored.
		if first, ok := fileOf[cf.name]; ok {
			fileErrs = append(fileErrs, fmt.Sprintf("connector files %s and %s both name connector %q; give each connector one file", first, p, cf.name))
			continue
		}
		fileOf[cf.name] = p
		files = append(files, cf)
	}
	if len(fileErrs) > 0 {
		return &usageError{strings.Join(fileErrs, "\n")}
	}
	log, levels := newLogger(cfg, stderr)
	slog.SetDefault(log)
	log.Info("starting tidyconnect standalone", "version", version.Version, "commit", version.Commit,
		"rest_addr", cfg.restAddr, "data_dir", cfg.dataDir)

	if err := os.MkdirAll(cfg.dataDir, 0o750); err != nil {
		return fmt.Errorf("creating --data-dir %s: %w; choose a writable directory", cfg.dataDir, err)
	}
	st, err := store.OpenFile(cfg.dataDir)
	if err != nil {
		return err
	}
	defer st.Close()

	// Kafka: the cluster named, or the embedded broker.
	var seeds []string
	var clusterID string
	if servers := connect.SplitList(cfg.bootstrapServers); len(servers) > 0 {
		seeds = servers
		log.Info("using Kafka cluster", "bootstrap_servers", seeds)
	} else {
		eopts := []kafka.EmbeddedOpt{kafka.WithEmbeddedLogger(log), kafka.WithDefaultPartitions(max(cfg.topicPartitions, 1)), kafka.WithMaxMessageBytes(cfg.maxMessageBytes)}
		if cfg.embeddedKafkaSync {
			eopts = append(eopts, kafka.WithSyncWrites())
		}
		emb, err := kafka.StartEmbedded(ctx, filepath.Join(cfg.dataDir, "kafka"), cfg.embeddedKafkaAddr, eopts...)
		if err != nil && ctx.Err() != nil {
			// A signal while the broker started (it replays its data
			// first): a shutdown, not a broker that cannot start.
			log.Info("shutting down during start-up (connectors are stopped, never deleted)")
			return nil
		}
		if err != nil {
			return fmt.Errorf("starting the embedded Kafka broker (--embedded-kafka-addr: choose a free port, or 127.0.0.1:0 for any; or set --bootstrap-servers to use a cluster instead): %w", err)
		}
		defer emb.Close()
		seeds, clusterID = emb.Addrs(), emb.ClusterID()
		log.Info("using the embedded Kafka broker", "addrs", seeds, "data_dir", filepath.Join(cfg.dataDir, "kafka"))
	}
	cl, err := kafka.NewClient(seeds, log)
	if err != nil {
		return err
	}
	defer cl.Close()
	if clusterID == "" {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		clusterID, err = kafka.ClusterID(cctx, cl)
		cancel()
		if err != nil {
			log.Warn("could not read the Kafka cluster id; GET / will not report it until restart", "error", err)
		}
	}

	reg, err := plugins.New(builtinPlugins()...)
	if err != nil {
		return fmt.Errorf("registering the built-in connector plugins: %w", err)
	}

	// Listen before starting connectors, so a busy port fails fast.
	ln, err := net.Listen("tcp", cfg.restAddr)
	if err != nil {
		return &usageError{fmt.Sprintf("--rest-addr (env %s): cannot listen on %s: %v; choose a free port", envName("rest-addr"), cfg.restAddr, err)}
	}
	defer ln.Close()
	id := workerID(cfg, ln)

	h, err := herder.NewStandalone(ctx,
		herder.WithStore(st), herder.WithPlugins(reg), herder.WithLogger(log),
		herder.WithKafkaClient(cl), herder.WithKafkaClusterID(clusterID), herder.WithWorkerID(id),
		herder.WithHookedWorker(func(hk herder.WorkerHooks) (herder.Worker, error) {
			return worker.New(
				worker.WithID(id), worker.WithPlugins(reg), worker.WithOffsetStore(st),
				worker.WithKafka(seeds, append(recordSizeOpts(cfg), kgo.WithLogger(kafka.SlogLogger(log, kgo.LogLevelWarn)))...),
				worker.WithTopicConfigs(topicConfigs(cfg)),
				worker.WithLogger(log), worker.WithStatusListener(hk.Status),
				worker.WithTaskReconfigurationHandler(hk.Reconfigure),
				worker.WithAbandonedTaskHandler(hk.AbandonedTaskGone),
				worker.WithTopicHandler(hk.TopicSeen),
				worker.WithGracefulTimeout(cfg.gracefulTimeout),
				worker.WithTopicCreation(int32(cfg.topicPartitions), int16(cfg.topicReplication)),
			)
		}),
	)
	if err != nil {
		return fmt.Errorf("starting the herder: %w", err)
	}
	closeHerder := func() {
		// Stops every instance with Stop(false); bounded so a stuck
		// connector cannot hold the process forever.
		cctx, cancel := context.WithTimeout(context.Background(), 2*cfg.gracefulTimeout+5*time.Second)
		defer cancel()
		if err := h.Close(cctx); err != nil {
			log.Error("closing the herder", "error", err)
		}
	}

	if ctx.Err() != nil {
		// A signal during start-up (a boot deletion can take a while):
		// shut down now rather than create connectors and open the API.
		log.Info("shutting down during start-up (connectors are stopped, never deleted)")
		closeHerder()
		return nil
	}
	// The files' connectors are created in a goroutine this function
	// joins: a create's Start no longer ends with ctx (decision 0025), so a
	// signal meanwhile closes the herder, which interrupts it, rather than
	// wait for a Start that may block (an unreachable system, a pgaudit
	// initial snapshot waiting for a lock).
	created := make(chan error, 1)
	go func() { created <- createFromFiles(ctx, h, files, log) }()
	var createErr error
	select {
	case createErr = <-created:
	case <-ctx.Done():
		log.Info("shutting down during start-up (connectors are stopped, never deleted)")
		closeHerder()
		<-created
		return nil
	}
	if createErr != nil {
		closeHerder()
		if ctx.Err() != nil {
			// A signal while the file's connector was validated (a
			// plugin reaching its system): a shutdown, not a bad file.
			log.Info("shutting down during start-up (connectors are stopped, never deleted)")
			return nil
		}
		return createErr
	}

	srv := &http.Server{
		Handler:           rest.New(h, rest.WithLogger(log), rest.WithDeleteTimeout(cfg.deleteTimeout), rest.WithLogLevels(levels)),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("REST API ready", "addr", ln.Addr().String(), "worker_id", id, "startup", time.Since(start).Round(time.Millisecond))

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down (connectors are stopped, never deleted)")
	case err := <-serveErr:
		runErr = fmt.Errorf("the REST server stopped: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.gracefulTimeout)
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("REST requests still running at shutdown were cut off", "error", err)
		_ = srv.Close()
	}
	cancel()
	if runErr == nil {
		<-serveErr // Serve returns ErrServerClosed once Shutdown began
	}
	closeHerder()
	log.Info("stopped")
	return runErr
}

// createFromFiles creates the connectors of the connector files, keeping
// the stored config of one that already exists. It stops at the first
// error, naming the file (a usageError when the file's content is what is
// wrong), or at ctx's end.
func createFromFiles(ctx context.Context, h *herder.Standalone, files []connectorFile, log *slog.Logger) error {
	for _, cf := range files {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_, err := h.CreateConnector(ctx, cf.name, cf.config, cf.initial)
		switch {
		case err == nil:
			log.Info("created connector from file", "connector", cf.name, "file", cf.path)
		case errors.Is(err, herder.ErrAlreadyExists):
			log.Info("connector from file already exists; keeping the stored config", "connector", cf.name, "file", cf.path)
		case ctx.Err() != nil:
			return err
		case errors.As(err, new(*herder.ConfigError)), errors.As(err, new(*herder.BadRequestError)):
			return &usageError{fmt.Sprintf("connector file %s: %v", cf.path, err)}
		default:
			// Not the file's fault (the data directory cannot store it, a
			// full disk): a runtime failure, exit 1.
			return fmt.Errorf("connector file %s: %w", cf.path, err)
		}
	}
	return nil
}

// topicConfigs are the configs of topics the worker creates on demand: a
// max.message.bytes that lets the largest record the worker produces
// through, where that is above the broker's default.
func topicConfigs(cfg *config) map[string]string {
	if cfg.maxMessageBytes <= defaultMaxMessageBytes {
		return nil
	}
	return map[string]string{"max.message.bytes": strconv.Itoa(cfg.maxMessageBytes)}
}

// recordSizeOpts are the Kafka client options for records up to
// --max-message-bytes: the producer's batch limit, and, for large limits,
// the client's own request and response bounds (100 MiB by default), which
// franz-go requires to be at least the batch limit.
func recordSizeOpts(cfg *config) []kgo.Opt {
	opts := []kgo.Opt{kgo.ProducerBatchMaxBytes(int32(cfg.maxMessageBytes))}
	if cfg.maxMessageBytes > 64<<20 {
		// Twice the record: room for a request's other batches and
		// framing. The flag's 512 MiB bound keeps this within kgo's 1 GiB.
		opts = append(opts, kgo.BrokerMaxWriteBytes(int32(2*cfg.maxMessageBytes)), kgo.BrokerMaxReadBytes(int32(2*cfg.maxMessageBytes)))
	}
	return opts
}
