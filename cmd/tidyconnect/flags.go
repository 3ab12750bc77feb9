package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// config is everything `tidyconnect standalone` is configured with.
type config struct {
	restAddr          string
	dataDir           string
	bootstrapServers  string
	embeddedKafkaAddr string
	embeddedKafkaSync bool
	maxMessageBytes   int
	workerID          string
	logFormat         string
	logLevel          string
	gracefulTimeout   time.Duration
	deleteTimeout     time.Duration
	topicPartitions   int
	topicReplication  int
	connectorFiles    []string
}

// envName is the environment variable of a flag: TIDYCONNECT_ + upper
// case, dashes to underscores.
func envName(flagName string) string {
	return "TIDYCONNECT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

var errHelp = errors.New("help requested")

// defaultMaxMessageBytes is Kafka's default message.max.bytes (and about
// the producer's max.request.size); maxMaxMessageBytes bounds the flag.
const (
	defaultMaxMessageBytes = 1048588
	maxMaxMessageBytes     = 512 << 20
)

// badFlagValue matches the flag package's error for an unparsable value
// ("invalid boolean value ... for -name" for a boolean flag).
var badFlagValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([a-z-]+): `)

func newStandaloneFlags(out io.Writer) (*flag.FlagSet, *config) {
	cfg := &config{}
	fs := flag.NewFlagSet("tidyconnect standalone", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.restAddr, "rest-addr", ":8083", "`host:port` the REST API listens on")
	fs.StringVar(&cfg.dataDir, "data-dir", "./data", "`directory` for connector configs, offsets, ledgers, deletion intents and the embedded broker's data")
	fs.StringVar(&cfg.bootstrapServers, "bootstrap-servers", "", "Kafka `brokers` (host:port, comma separated); empty starts the embedded broker")
	fs.StringVar(&cfg.embeddedKafkaAddr, "embedded-kafka-addr", "127.0.0.1:9092", "`host:port` of the embedded broker (127.0.0.1 only; port 0 picks a free one)")
	fs.BoolVar(&cfg.embeddedKafkaSync, "embedded-kafka-sync", true, "fsync every batch the embedded broker writes: sources may drop what Kafka acknowledged (pgaudit deletes its audit rows) and this single broker has no replica, so without it a power loss can lose changes; --embedded-kafka-sync=false trades that for throughput")
	fs.IntVar(&cfg.maxMessageBytes, "max-message-bytes", defaultMaxMessageBytes, "largest record (`bytes`) the worker produces; also the embedded broker's message.max.bytes and, above Kafka's default, the max.message.bytes of topics created on demand. Raise it for large rows (pgaudit: one change's JSON, before and after images)")
	fs.StringVar(&cfg.workerID, "worker-id", "", "worker `id` reported in statuses (default: host:port of the REST API)")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.DurationVar(&cfg.gracefulTimeout, "graceful-timeout", 5*time.Second, "how long a stopping task may take before it is cancelled and abandoned (`duration`, e.g. 5s)")
	fs.DurationVar(&cfg.deleteTimeout, "delete-timeout", 30*time.Second, "how long DELETE /connectors/{name} waits for cleanup before answering (`duration`)")
	fs.IntVar(&cfg.topicPartitions, "topic-partitions", 1, "partitions of topics created on demand (`n`, or -1 for the broker default)")
	fs.IntVar(&cfg.topicReplication, "topic-replication-factor", 1, "replication factor of topics created on demand (`n`, or -1 for the broker default)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: tidyconnect standalone [flags] [connector.json ...]\n\n")
		fmt.Fprintf(w, "Runs one worker with the Kafka Connect REST API. Each connector.json holds a\n")
		fmt.Fprintf(w, "POST /connectors body, {\"name\": ..., \"config\": {...}}; connectors that do not\n")
		fmt.Fprintf(w, "exist yet are created at start. SIGTERM or SIGINT stops everything cleanly\n")
		fmt.Fprintf(w, "(never as a deletion).\n\nFlags (each also settable by the environment variable shown; a flag wins):\n")
		fs.VisitAll(func(f *flag.Flag) {
			name, u := flag.UnquoteUsage(f)
			if name == "" { // a boolean: its value goes after =
				name = "=true|false"
				fmt.Fprintf(w, "  --%s%s\n", f.Name, name)
			} else {
				fmt.Fprintf(w, "  --%s %s\n", f.Name, name)
			}
			fmt.Fprintf(w, "        %s\n", u)
			fmt.Fprintf(w, "        env %s", envName(f.Name))
			if f.DefValue != "" {
				fmt.Fprintf(w, ", default %q", f.DefValue)
			}
			fmt.Fprintln(w)
		})
	}
	return fs, cfg
}

// parseStandalone parses args, then fills the flags not given from the
// environment, then checks every value. Errors are *usageError naming the
// flag (and variable) and what to fix.
func parseStandalone(args []string, out io.Writer, lookupEnv func(string) (string, bool)) (*config, error) {
	fs, cfg := newStandaloneFlags(io.Discard) // errors are reported once, below
	// Flags may come before, between or after the connector files (the
	// flag package alone stops at the first file); after "--" everything
	// is a file.
	var files []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(out)
				fs.Usage()
				return nil, errHelp
			}
			if m := badFlagValue.FindStringSubmatch(err.Error()); m != nil {
				f := fs.Lookup(m[2])
				return nil, &usageError{fmt.Sprintf("--%s (env %s): %q %s", m[2], envName(m[2]), m[1], typeHint(f))}
			}
			return nil, &usageError{fmt.Sprintf("%v; run with --help for the flags", err)}
		}
		consumed := len(rest) - fs.NArg()
		if consumed > 0 && rest[consumed-1] == "--" {
			files = append(files, fs.Args()...)
			break
		}
		if fs.NArg() == 0 {
			break
		}
		// "--embedded-kafka-sync false" reads false as a file (a boolean
		// flag takes its value with =): say so rather than "no such file".
		if v := fs.Arg(0); (v == "true" || v == "false") && consumed > 0 {
			name := strings.TrimLeft(rest[consumed-1], "-")
			if f := fs.Lookup(name); f != nil && !strings.Contains(name, "=") {
				if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
					return nil, &usageError{fmt.Sprintf("--%s takes its value with =: write --%s=%s", name, name, v)}
				}
			}
		}
		files = append(files, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []string
	failed := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				failed[f.Name] = true
				errs = append(errs, fmt.Sprintf("--%s (env %s): %q %s", f.Name, envName(f.Name), v, typeHint(f)))
			}
		}
	})
	cfg.connectorFiles = files
	for _, msg := range cfg.check() {
		name, _, _ := strings.Cut(strings.TrimPrefix(msg, "--"), " ")
		if !failed[name] { // a failed Set already explained this flag
			errs = append(errs, msg)
		}
	}
	if len(errs) > 0 {
		return nil, &usageError{strings.Join(errs, "\n")}
	}
	return cfg, nil
}

// typeHint says what a flag's value must look like.
func typeHint(f *flag.Flag) string {
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case time.Duration:
			return "is not a duration; write it like 5s, 500ms or 1m"
		case int:
			return "is not a whole number"
		case bool:
			return "is not a boolean; write true or false"
		}
	}
	return "is not a valid value"
}

// check validates every value and returns one message per bad flag.
func (c *config) check() []string {
	var errs []string
	bad := func(flagName, format string, a ...any) {
		errs = append(errs, fmt.Sprintf("--%s (env %s): %s", flagName, envName(flagName), fmt.Sprintf(format, a...)))
	}
	if _, port, err := net.SplitHostPort(c.restAddr); err != nil {
		bad("rest-addr", "%q is not host:port; use e.g. :8083 or 127.0.0.1:8083", c.restAddr)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		bad("rest-addr", "port %q must be a number between 0 and 65535", port)
	}
	if strings.TrimSpace(c.dataDir) == "" {
		bad("data-dir", "must not be empty; name a directory tidyconnect may write to")
	}
	for _, b := range strings.Split(c.bootstrapServers, ",") {
		if b = strings.TrimSpace(b); b == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(b); err != nil {
			bad("bootstrap-servers", "%q is not host:port; list brokers as host:port,host:port", b)
		}
	}
	if host, _, err := net.SplitHostPort(c.embeddedKafkaAddr); err != nil {
		bad("embedded-kafka-addr", "%q is not host:port; use e.g. 127.0.0.1:9092", c.embeddedKafkaAddr)
	} else if host != "" && host != "127.0.0.1" && host != "localhost" {
		bad("embedded-kafka-addr", "the embedded broker listens on 127.0.0.1 only; use 127.0.0.1:<port>")
	}
	switch c.logFormat {
	case "text", "json":
	default:
		bad("log-format", "%q is not text or json", c.logFormat)
	}
	if _, ok := parseLevel(c.logLevel); !ok {
		bad("log-level", "%q is not debug, info, warn or error", c.logLevel)
	}
	if c.gracefulTimeout <= 0 {
		bad("graceful-timeout", "%s must be positive, e.g. 5s", c.gracefulTimeout)
	}
	if c.deleteTimeout <= 0 {
		bad("delete-timeout", "%s must be positive, e.g. 30s", c.deleteTimeout)
	}
	if c.topicPartitions == 0 || c.topicPartitions < -1 || c.topicPartitions > 1<<20 {
		bad("topic-partitions", "%d must be a positive number of partitions, or -1 for the broker default", c.topicPartitions)
	}
	if c.maxMessageBytes < 1024 || c.maxMessageBytes > maxMaxMessageBytes {
		bad("max-message-bytes", "%d must be between 1024 and %d (512 MiB)", c.maxMessageBytes, maxMaxMessageBytes)
	}
	if c.topicReplication == 0 || c.topicReplication < -1 || c.topicReplication > 32767 {
		bad("topic-replication-factor", "%d must be a positive replication factor, or -1 for the broker default", c.topicReplication)
	}
	for _, f := range c.connectorFiles {
		if st, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Sprintf("connector file %s: %v", f, errors.Unwrap(err)))
		} else if st.IsDir() {
			errs = append(errs, fmt.Sprintf("connector file %s is a directory; name JSON files", f))
		}
	}
	return errs
}

func parseLevel(s string) (slog.Level, bool) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, true
	case "info":
		return slog.LevelInfo, true
	case "warn", "warning":
		return slog.LevelWarn, true
	case "error":
		return slog.LevelError, true
	}
	return 0, false
}
