package worker

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// The runtime's own connector configuration keys, named as Kafka Connect
// names them.
const (
	KeyName                   = "name"
	KeyConnectorClass         = "connector.class"
	KeyTasksMax               = "tasks.max"
	KeyTopics                 = "topics"
	KeyTopicsRegex            = "topics.regex"
	KeyErrorsTolerance        = "errors.tolerance"
	KeyDLQTopic               = "errors.deadletterqueue.topic.name"
	KeyDLQReplicationFactor   = "errors.deadletterqueue.topic.replication.factor"
	KeyDLQContextHeaders      = "errors.deadletterqueue.context.headers.enable"
	KeyOffsetFlushInterval    = "offset.flush.interval.ms"
	KeyGracefulTimeout        = "task.shutdown.graceful.timeout.ms"
	KeyTopicCreationPartition = "topic.creation.default.partitions"
	KeyTopicCreationRF        = "topic.creation.default.replication.factor"
	KeyKeyConverter           = "key.converter"
	KeyValueConverter         = "value.converter"
	KeyHeaderConverter        = "header.converter"
)

// Converters the worker accepts. Records are passed through as bytes: the
// runtime does no serialization, so only byte-preserving converters make
// sense.
var passthroughConverters = []string{
	"org.apache.kafka.connect.converters.ByteArrayConverter",
	"org.apache.kafka.connect.storage.StringConverter",
	"ByteArrayConverter",
	"StringConverter",
	"bytes",
	"string",
}

func validateConverter(v string) error {
	for _, c := range passthroughConverters {
		if strings.EqualFold(v, c) {
			return nil
		}
	}
	return fmt.Errorf("the worker passes record bytes through unchanged; use one of %s", strings.Join(passthroughConverters, ", "))
}

func intAtLeast(min int64) func(string) error {
	return func(v string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err == nil && n < min {
			return fmt.Errorf("must be at least %d", min)
		}
		return nil
	}
}

// maxDurationMS is the largest millisecond setting taken as a duration: a
// year. Larger values (Long.MAX is a common way to say "never") would
// overflow time.Duration and turn negative.
const maxDurationMS = 365 * 24 * 3600 * 1000

// msBetween accepts milliseconds from min to maxDurationMS.
func msBetween(min int64) func(string) error {
	return func(v string) error {
		if err := intAtLeast(min)(v); err != nil {
			return err
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n > maxDurationMS {
			return fmt.Errorf("must be at most %d (a year)", int64(maxDurationMS))
		}
		return nil
	}
}

func partitionsValue(v string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
	if err == nil && (n == 0 || n < -1) {
		return errors.New("must be a positive number of partitions, or -1 for the broker's default")
	}
	return nil
}

func replicationValue(v string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 16)
	if err == nil && (n == 0 || n < -1) {
		return errors.New("must be a positive replication factor, or -1 for the broker's default")
	}
	return nil
}

var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func validTopicList(v string) error {
	var bad []string
	for _, t := range connect.SplitList(v) {
		if !topicName.MatchString(t) {
			bad = append(bad, strconv.Quote(t))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("invalid topic name(s) %s: use letters, digits, '.', '_' and '-' (at most 249)", strings.Join(bad, ", "))
	}
	return nil
}

func validRegex(v string) error {
	if _, err := regexp.Compile(v); err != nil {
		return fmt.Errorf("not a valid regular expression: %w", err)
	}
	// The runtime matches whole names with anchoredRegex: a pattern valid
	// alone but not wrapped (an unterminated \Q quotes the wrapper's ")$")
	// would fail the tasks at start and skip the dead letter queue check.
	if _, err := regexp.Compile(anchoredRegex(strings.TrimSpace(v))); err != nil {
		return fmt.Errorf("not usable as a pattern of whole topic names (close a \\Q quote with \\E): %w", err)
	}
	return nil
}

func validDLQTopic(v string) error {
	if !topicName.MatchString(strings.TrimSpace(v)) {
		return errors.New("not a valid topic name: use letters, digits, '.', '_' and '-' (at most 249)")
	}
	return nil
}

// CommonConfigDef returns the runtime's own configuration keys for a
// connector of type t, with their documentation, for validation and the
// REST config endpoints. Plugins' keys are merged after these.
func CommonConfigDef(t connect.ConnectorType) connect.ConfigDef {
	const (
		gCommon = "Common"
		gErrors = "Error Handling"
		gTopic  = "Topic Creation"
	)
	def := connect.ConfigDef{
		{Name: KeyName, Type: connect.TypeString, Required: true, Group: gCommon, Order: 1, Importance: connect.ImportanceHigh, Width: connect.WidthMedium, DisplayName: "Connector name",
			Doc: "Globally unique name to use for this connector."},
		{Name: KeyConnectorClass, Type: connect.TypeString, Required: true, Group: gCommon, Order: 2, Importance: connect.ImportanceHigh, Width: connect.WidthLong, DisplayName: "Connector class",
			Doc: "Name of the connector plugin (its class or an alias)."},
		{Name: KeyTasksMax, Type: connect.TypeInt, Default: "1", Group: gCommon, Order: 3, Importance: connect.ImportanceHigh, Width: connect.WidthShort, DisplayName: "Tasks max",
			Doc: "Maximum number of tasks to use for this connector.", Validate: intAtLeast(1)},
		{Name: KeyKeyConverter, Type: connect.TypeClass, Group: gCommon, Order: 4, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Key converter class",
			Doc: "Accepted for compatibility; record keys are passed through as bytes, so only ByteArrayConverter or StringConverter are allowed.", Validate: validateConverter},
		{Name: KeyValueConverter, Type: connect.TypeClass, Group: gCommon, Order: 5, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Value converter class",
			Doc: "Accepted for compatibility; record values are passed through as bytes, so only ByteArrayConverter or StringConverter are allowed.", Validate: validateConverter},
		{Name: KeyHeaderConverter, Type: connect.TypeClass, Group: gCommon, Order: 6, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Header converter class",
			Doc: "Accepted for compatibility; headers are passed through as bytes.", Validate: validateConverter},
		{Name: KeyOffsetFlushInterval, Type: connect.TypeLong, Default: "60000", Group: gCommon, Order: 7, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Offset flush interval (ms)",
			Doc: "How often acknowledged source offsets are written to the offset store, and how often a sink task is flushed and its consumer offsets committed. Offsets are also written once more when a task stops. At most a year.", Validate: msBetween(1)},
		{Name: KeyGracefulTimeout, Type: connect.TypeLong, Group: gCommon, Order: 8, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Task graceful shutdown timeout (ms)",
			Doc: "How long a stopping task may take to return from Poll or Put. A task that takes longer is reported as abandoned; its Stopped still runs when it returns. Default: the worker's setting (5000). At most a year.", Validate: msBetween(0)},
		{Name: KeyErrorsTolerance, Type: connect.TypeString, Default: "none", Group: gErrors, Order: 1, Importance: connect.ImportanceMedium, Width: connect.WidthShort, DisplayName: "Error tolerance",
			Doc: "none: a record the sink task reports as errant fails the task. all: errant records are skipped (and sent to the dead letter queue topic if one is set).", Recommended: []string{"none", "all"},
			Validate: func(v string) error {
				if v != "none" && v != "all" {
					return errors.New(`must be "none" or "all"`)
				}
				return nil
			}},
	}
	if t == connect.TypeSink || t == connect.TypeUnknown {
		def = append(def,
			connect.ConfigKey{Name: KeyTopics, Type: connect.TypeList, Group: gCommon, Order: 9, Importance: connect.ImportanceHigh, Width: connect.WidthLong, DisplayName: "Topics",
				Doc: "Comma-separated topics to consume. A sink connector needs exactly one of topics and topics.regex.", Validate: validTopicList},
			connect.ConfigKey{Name: KeyTopicsRegex, Type: connect.TypeString, Group: gCommon, Order: 10, Importance: connect.ImportanceHigh, Width: connect.WidthLong, DisplayName: "Topics regex",
				Doc: "Regular expression of topics to consume. A sink connector needs exactly one of topics and topics.regex.", Validate: validRegex},
			connect.ConfigKey{Name: KeyDLQTopic, Type: connect.TypeString, Group: gErrors, Order: 2, Importance: connect.ImportanceMedium, Width: connect.WidthMedium, DisplayName: "Dead letter queue topic name",
				Doc: "Topic errant records go to when errors.tolerance=all. Empty: errant records are only skipped.", Validate: validDLQTopic},
			connect.ConfigKey{Name: KeyDLQReplicationFactor, Type: connect.TypeShort, Default: "-1", Group: gErrors, Order: 3, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Dead letter queue topic replication factor",
				Doc: "Replication factor of the dead letter queue topic when it is created; -1 for the broker's default (Kafka Connect defaults to 3, which a single broker cannot satisfy).", Validate: replicationValue},
			connect.ConfigKey{Name: KeyDLQContextHeaders, Type: connect.TypeBoolean, Default: "false", Group: gErrors, Order: 4, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Enable error context headers",
				Doc: "Add __connect.errors.* headers (original topic, partition, offset, connector, task, error) to dead letter queue records."},
		)
	}
	if t == connect.TypeSource || t == connect.TypeUnknown {
		def = append(def,
			connect.ConfigKey{Name: KeyTopicCreationPartition, Type: connect.TypeInt, Group: gTopic, Order: 1, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Default partitions",
				Doc: "Partitions of topics the worker creates when a source task first produces to them; -1 for the broker's default. Default: the worker's setting.", Validate: partitionsValue},
			connect.ConfigKey{Name: KeyTopicCreationRF, Type: connect.TypeShort, Group: gTopic, Order: 2, Importance: connect.ImportanceLow, Width: connect.WidthShort, DisplayName: "Default replication factor",
				Doc: "Replication factor of topics the worker creates; -1 for the broker's default. Default: the worker's setting.", Validate: replicationValue},
		)
	}
	return def
}

// ValidateCommon checks cfg against CommonConfigDef(t) plus the rules that
// span keys, and returns the messages per key (empty when valid).
func ValidateCommon(t connect.ConnectorType, cfg connect.Config) map[string][]string {
	errs := CommonConfigDef(t).Validate(cfg)
	if t == connect.TypeSink {
		hasTopics := len(cfg.List(KeyTopics)) > 0
		hasRegex := strings.TrimSpace(cfg[KeyTopicsRegex]) != ""
		switch {
		case hasTopics && hasRegex:
			msg := "topics and topics.regex are mutually exclusive: set only one of them"
			errs[KeyTopics] = append(errs[KeyTopics], msg)
			errs[KeyTopicsRegex] = append(errs[KeyTopicsRegex], msg)
		case !hasTopics && !hasRegex:
			msg := "a sink connector needs topics (a comma-separated list) or topics.regex"
			errs[KeyTopics] = append(errs[KeyTopics], msg)
			errs[KeyTopicsRegex] = append(errs[KeyTopicsRegex], msg)
		}
		if dlq := strings.TrimSpace(cfg[KeyDLQTopic]); dlq != "" && hasTopics {
			for _, topic := range cfg.List(KeyTopics) {
				if topic == dlq {
					errs[KeyDLQTopic] = append(errs[KeyDLQTopic], "the dead letter queue topic must not be one of the topics the connector consumes")
				}
			}
		}
		if dlq := strings.TrimSpace(cfg[KeyDLQTopic]); dlq != "" && hasRegex {
			if re, err := regexp.Compile(anchoredRegex(strings.TrimSpace(cfg[KeyTopicsRegex]))); err == nil && re.MatchString(dlq) {
				errs[KeyDLQTopic] = append(errs[KeyDLQTopic], "the dead letter queue topic must not match topics.regex: the connector would consume its own errant records")
			}
		}
	}
	for k, v := range errs {
		if len(v) == 0 {
			delete(errs, k)
		}
	}
	return errs
}

// settings are the parsed runtime keys of one connector.
type settings struct {
	tasksMax          int
	topics            []string
	topicsRegex       string
	tolerateAll       bool
	dlqTopic          string
	dlqRF             int16
	dlqHeaders        bool
	flushInterval     time.Duration
	grace             time.Duration
	createPartitions  int32
	createReplication int16
}

// parseSettings reads the runtime keys of cfg with the worker's defaults; it
// fails naming every bad key.
func (w *Worker) parseSettings(t connect.ConnectorType, cfg connect.Config) (settings, error) {
	if errs := ValidateCommon(t, cfg); len(errs) > 0 {
		// name and connector.class are the herder's concern; tasks get
		// configs without them.
		delete(errs, KeyName)
		delete(errs, KeyConnectorClass)
		if len(errs) > 0 {
			return settings{}, fmt.Errorf("invalid connector configuration: %s", formatErrors(errs))
		}
	}
	s := settings{grace: w.grace, createPartitions: w.topicPartitions, createReplication: w.topicReplication}
	s.tasksMax, _ = cfg.Int(KeyTasksMax, 1)
	s.topics = cfg.List(KeyTopics)
	s.topicsRegex = strings.TrimSpace(cfg[KeyTopicsRegex])
	s.tolerateAll = strings.TrimSpace(cfg[KeyErrorsTolerance]) == "all"
	s.dlqTopic = strings.TrimSpace(cfg[KeyDLQTopic])
	rf, _ := cfg.Int(KeyDLQReplicationFactor, -1)
	s.dlqRF = int16(rf)
	s.dlqHeaders, _ = cfg.Bool(KeyDLQContextHeaders, false)
	ms, _ := cfg.Int(KeyOffsetFlushInterval, int(w.flushInterval/time.Millisecond))
	s.flushInterval = time.Duration(ms) * time.Millisecond
	if g, _ := cfg.Int(KeyGracefulTimeout, -1); g >= 0 {
		s.grace = time.Duration(g) * time.Millisecond
	}
	if p, _ := cfg.Int(KeyTopicCreationPartition, 0); p != 0 {
		s.createPartitions = int32(p)
	}
	if r, _ := cfg.Int(KeyTopicCreationRF, 0); r != 0 {
		s.createReplication = int16(r)
	}
	return s, nil
}

func formatErrors(errs map[string][]string) string {
	keys := make([]string, 0, len(errs))
	for k := range errs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %s", k, strings.Join(errs[k], "; ")))
	}
	return strings.Join(parts, "; ")
}

// anchoredRegex makes re match whole topic names, as Kafka Connect's
// Pattern.matcher(topic).matches() does.
func anchoredRegex(re string) string { return "^(?:" + re + ")$" }
