package amqpsink

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// Configuration keys. Their names are the connector's public interface.
const (
	KeyURL              = "rabbitmq.url"
	KeyTopics           = "topics"
	KeyTopicsRegex      = "topics.regex"
	KeyExchange         = "rabbitmq.exchange"
	KeyExchangeType     = "rabbitmq.exchange.type"
	KeyQueue            = "rabbitmq.queue"
	KeyQueueType        = "rabbitmq.queue.type"
	KeyRoutingKey       = "rabbitmq.routing.key"
	KeyCleanupOnDelete  = "cleanup.on.delete"
	KeyContentType      = "rabbitmq.content.type"
	KeyMaxInFlight      = "rabbitmq.max.in.flight"
	KeyReconnectTimeout = "rabbitmq.reconnect.timeout.ms"
	KeyMaxMessageBytes  = "rabbitmq.max.message.bytes"
	KeyErrorsTolerance  = "errors.tolerance"
	KeyDLQTopic         = "errors.deadletterqueue.topic.name"
	// KeyNullValues is the name Confluent's sinks use for the same choice.
	KeyNullValues = "behavior.on.null.values"
)

// Resource kinds recorded in the ledger.
const (
	KindExchange = "rabbitmq.exchange"
	KindQueue    = "rabbitmq.queue"
	KindBinding  = "rabbitmq.binding"
	// KindBindingOwner is no broker object: its name is the owner argument
	// of the bindings this creation of the connector makes (the connector's
	// name and a random suffix, decision 0050). A deletion releases it once
	// every broker object of the ledger is gone.
	KindBindingOwner = "rabbitmq.binding-owner"
)

// OwnerArg is the exchange, queue and binding argument that marks an object
// created by a tidyconnect connector. On an exchange or queue its value is the
// connector name; on a binding it is the connector name and a suffix drawn
// when the connector was created (KindBindingOwner). RabbitMQ stores unknown
// x- arguments without interpreting them (also for quorum queues) and leaves
// them out of its equivalence check, and a binding's arguments are part of
// its identity, so a marked binding cannot be mistaken for one a person made,
// nor for one an earlier connector of the same name left behind.
const OwnerArg = "x-tidyconnect-owner"

// Message header names carrying the Kafka coordinates.
const (
	HeaderTopic     = "kafka.topic"
	HeaderPartition = "kafka.partition"
	HeaderOffset    = "kafka.offset"
	HeaderKey       = "kafka.key"
)

const (
	placeholderTopic     = "${topic}"
	placeholderPartition = "${partition}"
	placeholderKey       = "${key}"
)

var placeholderRe = regexp.MustCompile(`\$\{[^}]*\}?`)

// checkTemplate reports placeholders other than the allowed ones.
func checkTemplate(tmpl string, allowed ...string) error {
	if strings.TrimSpace(tmpl) == "" {
		return errors.New("the template is empty")
	}
	for _, p := range placeholderRe.FindAllString(tmpl, -1) {
		ok := false
		for _, a := range allowed {
			ok = ok || p == a
		}
		if !ok {
			return fmt.Errorf("unknown placeholder %q (allowed: %s)", p, strings.Join(allowed, ", "))
		}
	}
	if strings.Contains(placeholderRe.ReplaceAllString(tmpl, ""), "$") {
		return errors.New("a lone '$' is not allowed; placeholders are written ${name}")
	}
	return nil
}

func checkURL(v string) error {
	raw := strings.TrimSpace(v)
	u, err := amqp.ParseURI(raw)
	if err != nil {
		// Never the parser's text: it quotes parts of the URL, the
		// password among them ("invalid port \":se\"").
		return errors.New("not an AMQP URL of the form amqp://user:pass@host:5672/vhost; percent-encode reserved characters ('@', ':', '/', '?', '#', '%') in the user and password")
	}
	if u.Host == "" {
		return errors.New("the URL names no host")
	}
	// A '#' or '?' in the password ends the authority early: the URL then
	// parses, with a host and port made of the user and password.
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		authority, _, _ := strings.Cut(rest, "/")
		if at := strings.LastIndexByte(authority, '@'); at >= 0 && !strings.Contains(strings.ToLower(authority[at+1:]), strings.ToLower(u.Host)) {
			return errors.New("the user and password were not read from the URL: percent-encode reserved characters ('@', ':', '/', '?', '#', '%') in them")
		}
	}
	return nil
}

// predefinedExchangeTypes are the types of RabbitMQ's predefined exchanges:
// they exist on every vhost and are never declared or owned.
var predefinedExchangeTypes = map[string]string{
	"amq.direct":  "direct",
	"amq.fanout":  "fanout",
	"amq.topic":   "topic",
	"amq.headers": "headers",
	"amq.match":   "headers",
}

func oneOf(values ...string) func(string) error {
	return func(v string) error {
		for _, ok := range values {
			if v == ok {
				return nil
			}
		}
		return fmt.Errorf("must be one of %s", strings.Join(values, ", "))
	}
}

var configDef = connect.ConfigDef{
	{Name: KeyURL, Type: connect.TypeString, Required: true, Secret: true, Importance: connect.ImportanceHigh, Group: "RabbitMQ", Order: 1,
		Doc: "AMQP URL of the broker: amqp://user:pass@host:5672/vhost. The password is masked in every output.", Validate: checkURL},
	{Name: KeyTopics, Type: connect.TypeList, Importance: connect.ImportanceHigh, Group: "Kafka", Order: 2,
		Doc: "Kafka topics to deliver. Exactly one of topics and topics.regex is required."},
	{Name: KeyTopicsRegex, Type: connect.TypeString, Importance: connect.ImportanceHigh, Group: "Kafka", Order: 3,
		Doc:      "Regular expression of Kafka topics to deliver; a queue is declared for each topic when its first record arrives.",
		Validate: func(v string) error { _, err := regexp.Compile(v); return err }},
	{Name: KeyExchange, Type: connect.TypeString, Importance: connect.ImportanceMedium, Group: "RabbitMQ", Order: 4,
		Doc: "Exchange to publish to; created (and owned) when it does not exist. Default: the connector name.",
		Validate: func(v string) error {
			if _, ok := predefinedExchangeTypes[v]; ok {
				return nil // the predefined exchanges always exist and are never owned
			}
			if strings.HasPrefix(v, "amq.") {
				return fmt.Errorf("%q is not one of RabbitMQ's predefined exchanges (amq.direct, amq.fanout, amq.topic, amq.headers, amq.match), and names starting with amq. are reserved", v)
			}
			return checkName(v)
		}},
	{Name: KeyExchangeType, Type: connect.TypeString, Default: "topic", Importance: connect.ImportanceMedium, Group: "RabbitMQ", Order: 5,
		Recommended: []string{"topic", "direct", "fanout", "headers"}, Doc: "Type of the exchange: topic, direct, fanout or headers.",
		Validate: oneOf("topic", "direct", "fanout", "headers")},
	{Name: KeyQueue, Type: connect.TypeString, Default: placeholderTopic, Importance: connect.ImportanceMedium, Group: "RabbitMQ", Order: 6,
		Doc:      "Queue name template, one durable queue per topic; ${topic} is replaced by the Kafka topic.",
		Validate: func(v string) error { return checkTemplate(v, placeholderTopic) }},
	{Name: KeyQueueType, Type: connect.TypeString, Default: "quorum", Importance: connect.ImportanceMedium, Group: "RabbitMQ", Order: 7,
		Recommended: []string{"quorum", "classic"}, Doc: "Type of the queues the connector creates: quorum or classic.",
		Validate: oneOf("quorum", "classic")},
	{Name: KeyRoutingKey, Type: connect.TypeString, Default: placeholderTopic, Importance: connect.ImportanceMedium, Group: "RabbitMQ", Order: 8,
		Doc:      "Routing-key template: ${topic}, ${partition} and ${key} (the record key as text) are replaced per record.",
		Validate: func(v string) error { return checkTemplate(v, placeholderTopic, placeholderPartition, placeholderKey) }},
	{Name: KeyCleanupOnDelete, Type: connect.TypeBoolean, Default: "true", Importance: connect.ImportanceMedium, Group: "Lifecycle", Order: 9,
		Doc: "Delete the owned bindings, queues and exchange when the connector is deleted; false keeps them."},
	{Name: KeyContentType, Type: connect.TypeString, Default: "application/octet-stream", Importance: connect.ImportanceLow, Group: "RabbitMQ", Order: 10,
		Doc: "content-type property of every message (the record value is copied as is).",
		Validate: func(v string) error {
			if len(v) > 255 {
				return errors.New("AMQP allows at most 255 bytes")
			}
			return nil
		}},
	{Name: KeyMaxInFlight, Type: connect.TypeInt, Default: "4096", Importance: connect.ImportanceLow, Group: "RabbitMQ", Order: 11,
		Doc:      "Messages published but not yet confirmed, per task (at most 65536); Put waits when it is reached. Bounds memory.",
		Validate: atMost(maxInFlightLimit)},
	{Name: KeyReconnectTimeout, Type: connect.TypeLong, Default: "300000", Importance: connect.ImportanceLow, Group: "RabbitMQ", Order: 12,
		Doc:      "How long a task keeps reconnecting (with backoff) after losing the broker before it fails (at most a year).",
		Validate: atMost(maxReconnectMS)},
	{Name: KeyMaxMessageBytes, Type: connect.TypeLong, Default: "134217728", Importance: connect.ImportanceLow, Group: "RabbitMQ", Order: 15,
		Doc:      "The broker's max_message_size (RabbitMQ's default: 128 MiB; at most 512 MiB): a larger record value is reported under errors.tolerance instead of published, because the broker would close the channel on it and every reconnect would republish it.",
		Validate: atMost(512 << 20)},
	{Name: KeyErrorsTolerance, Type: connect.TypeString, Default: "none", Importance: connect.ImportanceMedium, Group: "Error Handling", Order: 13,
		Recommended: []string{"none", "all"}, Doc: "none: an undeliverable record fails the task; all: it goes to the dead-letter topic (or is skipped).",
		Validate: oneOf("none", "all")},
	{Name: KeyDLQTopic, Type: connect.TypeString, Importance: connect.ImportanceMedium, Group: "Error Handling", Order: 14,
		Doc: "Dead-letter topic for undeliverable records (with errors.tolerance=all)."},
	{Name: KeyNullValues, Type: connect.TypeString, Default: nullPublish, Importance: connect.ImportanceLow, Group: "RabbitMQ", Order: 16,
		Recommended: []string{nullPublish, nullIgnore, nullFail}, Doc: "What a record with a null value (a tombstone, as a CDC source sends after a delete) becomes. publish: a message with an empty body (its key still routes it and is in the message's headers as any record's). ignore: nothing; its offset is committed. fail: it is reported under errors.tolerance (the task fails, or the record goes to the dead-letter topic).",
		Validate: func(v string) error {
			// Any case, as Confluent's sinks take IGNORE too.
			switch strings.ToLower(v) {
			case nullPublish, nullIgnore, nullFail:
				return nil
			}
			return fmt.Errorf("must be %q, %q or %q", nullPublish, nullIgnore, nullFail)
		}},
}

// behavior.on.null.values values.
const (
	nullPublish = "publish"
	nullIgnore  = "ignore"
	nullFail    = "fail"
)

// Upper bounds: notification buffers are sized by the in-flight window,
// and a reconnect timeout in milliseconds must fit a time.Duration.
const (
	maxInFlightLimit = 65536
	maxReconnectMS   = 365 * 24 * 3600 * 1000
)

// atMost accepts positive integers up to limit.
func atMost(limit int64) func(string) error {
	return func(v string) error {
		if err := positive(v); err != nil {
			return err
		}
		if n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64); n > limit {
			return fmt.Errorf("must be at most %d", limit)
		}
		return nil
	}
}

func positive(v string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return errors.New("must be a positive integer")
	}
	return nil
}

// checkName checks a literal exchange or queue name.
func checkName(n string) error {
	switch {
	case len(n) > 255:
		return fmt.Errorf("%d bytes is longer than RabbitMQ's 255", len(n))
	case strings.HasPrefix(n, "amq."):
		return errors.New("names starting with amq. are reserved by RabbitMQ")
	}
	return nil
}

// checkBindingKey checks a rendered binding key: AMQP carries it as a short
// string, and amqp091 closes the whole connection on a longer one.
func checkBindingKey(k string) error {
	if len(k) > 255 {
		return fmt.Errorf("the binding key %q has %d bytes, more than AMQP's 255", k, len(k))
	}
	return nil
}

// settings is a parsed, validated configuration.
type settings struct {
	connector    string
	url          string
	location     string // the URL without credentials: where owned resources live
	topics       []string
	topicsRegex  *regexp.Regexp
	exchange     string
	exchangeType string
	queueTmpl    string
	queueType    string
	routingTmpl  string
	cleanup      bool
	contentType  string
	maxInFlight  int
	maxMessage   int
	reconnect    time.Duration
	nullValues   string // nullPublish, nullIgnore or nullFail
}

// validate returns the error messages per key for cfg (defaults applied):
// the ConfigDef's checks and those spanning keys. withTopics adds the
// topics/topics.regex rule, which the runtime's own validation already
// reports at validate and create (so Validate leaves it out).
func validate(cfg connect.Config, withTopics bool) map[string][]string {
	errs := configDef.Validate(cfg)
	add := func(k, msg string) { errs[k] = append(errs[k], msg) }
	topics, regex := strings.TrimSpace(cfg[KeyTopics]), strings.TrimSpace(cfg[KeyTopicsRegex])
	switch {
	case !withTopics:
	case topics == "" && regex == "":
		add(KeyTopics, "one of topics and topics.regex is required")
	case topics != "" && regex != "":
		add(KeyTopics, "topics and topics.regex are mutually exclusive; set only one")
	}
	if cfg[KeyExchange] == "" && cfg["name"] == "" {
		add(KeyExchange, "no exchange given and no connector name to default to")
	}
	if cfg[KeyExchange] == "" && strings.HasPrefix(cfg["name"], "amq.") {
		add(KeyExchange, "the exchange defaults to the connector name, which starts with amq. (reserved by RabbitMQ): set rabbitmq.exchange")
	}
	// A predefined exchange has the type it has: the checks below go by it.
	exchangeType := cfg[KeyExchangeType]
	if exchangeType == "" {
		exchangeType = "topic"
	}
	if t, ok := predefinedExchangeTypes[cfg[KeyExchange]]; ok {
		if exchangeType != t {
			add(KeyExchangeType, fmt.Sprintf("%s is a %s exchange: set rabbitmq.exchange.type=%s (or use another exchange)", cfg[KeyExchange], t, t))
		}
		exchangeType = t
	}
	rk := cfg[KeyRoutingKey]
	if rk == "" {
		rk = placeholderTopic
	}
	if exchangeType == "direct" && (strings.Contains(rk, placeholderKey) || strings.Contains(rk, placeholderPartition)) {
		add(KeyRoutingKey, "with a direct exchange the routing key may only use ${topic}: the queue binding must know the key in advance")
	}
	// Each topic has its own queue, bound by the routing key: with several
	// topics the key must tell them apart, and a fanout exchange, which
	// ignores keys, would copy every topic's records into every queue.
	queueTmpl := cfg[KeyQueue]
	if queueTmpl == "" {
		queueTmpl = placeholderTopic
	}
	// One queue for all topics (a template without ${topic}) wants them all.
	severalTopics := (regex != "" || len(connect.SplitList(topics)) > 1) && strings.Contains(queueTmpl, placeholderTopic)
	if severalTopics && !strings.Contains(rk, placeholderTopic) && (exchangeType == "topic" || exchangeType == "direct") {
		add(KeyRoutingKey, "with several topics (or topics.regex) the routing key must contain ${topic}: each topic's queue is bound by it")
	}
	if severalTopics && exchangeType == "fanout" {
		add(KeyExchangeType, "a fanout exchange copies every record into every bound queue: with several topics (or topics.regex) use topic or direct")
	}
	for k, v := range errs {
		if len(v) == 0 {
			delete(errs, k)
		}
	}
	return errs
}

// checkTopicNames adds to errs, for a fixed topic list in cfg (defaults
// applied), a queue name or binding key the broker or the client cannot
// take: found before Start creates anything. An over-long binding key made
// amqp091 close the connection after the exchange and queue were created,
// and its ledger entry then failed every deletion. It is not part of
// validate, which parse also runs for a cleanup-only instance: a connector
// created with such a configuration must stay deletable.
func checkTopicNames(cfg connect.Config, errs map[string][]string) {
	if strings.TrimSpace(cfg[KeyTopicsRegex]) != "" {
		return // the names are only known when a topic's first record arrives
	}
	topics := connect.SplitList(cfg[KeyTopics])
	for _, topic := range topics {
		if q := strings.ReplaceAll(cfg[KeyQueue], placeholderTopic, topic); checkName(q) != nil {
			errs[KeyQueue] = append(errs[KeyQueue], fmt.Sprintf("queue name %q for topic %q: %v", q, topic, checkName(q)))
			break
		}
	}
	if t := cfg[KeyExchangeType]; t != "topic" && t != "direct" {
		return // fanout and headers bindings have an empty key
	}
	for _, topic := range topics {
		if err := checkBindingKey(bindingKeyOf(cfg[KeyRoutingKey], topic)); err != nil {
			errs[KeyRoutingKey] = append(errs[KeyRoutingKey], fmt.Sprintf("for topic %q: %v", topic, err))
			break
		}
	}
}

// checkWildcardWords adds to errs, for a topic exchange in cfg (defaults
// applied), a routing-key template whose ${partition} or ${key} is not a
// whole dot-separated word: the queues are bound with them as '*' and '#',
// which RabbitMQ reads as wildcards only as whole words, so a binding like
// "orders-*" matches no record and every one came back unroutable. Like
// checkTopicNames it is not part of validate: a connector created with such
// a configuration must stay deletable.
func checkWildcardWords(cfg connect.Config, errs map[string][]string) {
	exchangeType := cfg[KeyExchangeType]
	if t, ok := predefinedExchangeTypes[cfg[KeyExchange]]; ok {
		exchangeType = t
	}
	if exchangeType != "topic" {
		return
	}
	for _, w := range strings.Split(cfg[KeyRoutingKey], ".") {
		if w == placeholderPartition || w == placeholderKey {
			continue
		}
		if strings.Contains(w, placeholderPartition) || strings.Contains(w, placeholderKey) {
			errs[KeyRoutingKey] = append(errs[KeyRoutingKey], fmt.Sprintf("on a topic exchange ${partition} and ${key} must each be a whole word between dots (e.g. ${topic}.${partition}): the queues are bound with them as the wildcards '*' and '#', which RabbitMQ does not read inside %q, so no record would be routed", w))
			return
		}
	}
}

// validationError turns per-key messages into one error naming every key.
func validationError(errs map[string][]string) error {
	if len(errs) == 0 {
		return nil
	}
	var parts []string
	for _, k := range sortedKeys(errs) {
		parts = append(parts, k+": "+strings.Join(errs[k], "; "))
	}
	return fmt.Errorf("invalid amqpsink configuration (fix these keys): %s", strings.Join(parts, " | "))
}

func parse(cfg connect.Config, connector string) (*settings, error) {
	if connector == "" {
		connector = cfg["name"]
	}
	if cfg["name"] == "" && connector != "" {
		cfg = cfg.Clone()
		cfg["name"] = connector
	}
	cfg = configDef.WithDefaults(cfg)
	if err := validationError(validate(cfg, true)); err != nil {
		return nil, err
	}
	s := &settings{
		connector:    connector,
		url:          strings.TrimSpace(cfg[KeyURL]),
		topics:       cfg.List(KeyTopics),
		exchange:     cfg[KeyExchange],
		exchangeType: cfg[KeyExchangeType],
		queueTmpl:    cfg[KeyQueue],
		queueType:    cfg[KeyQueueType],
		routingTmpl:  cfg[KeyRoutingKey],
		contentType:  cfg[KeyContentType],
		nullValues:   strings.ToLower(cfg[KeyNullValues]),
	}
	if s.exchange == "" {
		s.exchange = connector
	}
	var err error
	if r := strings.TrimSpace(cfg[KeyTopicsRegex]); r != "" {
		// The worker subscribes with it; here it is only checked.
		if s.topicsRegex, err = regexp.Compile(r); err != nil {
			return nil, fmt.Errorf("%s: %w", KeyTopicsRegex, err)
		}
	}
	if s.cleanup, err = cfg.Bool(KeyCleanupOnDelete, true); err != nil {
		return nil, err
	}
	if s.maxInFlight, err = cfg.Int(KeyMaxInFlight, 4096); err != nil {
		return nil, err
	}
	if s.maxMessage, err = cfg.Int(KeyMaxMessageBytes, 134217728); err != nil {
		return nil, err
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(cfg[KeyReconnectTimeout]), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyReconnectTimeout, err)
	}
	s.reconnect = time.Duration(ms) * time.Millisecond
	s.location = location(s.url)
	return s, nil
}

// location is the broker URL without credentials, normalised, so that the
// same broker and vhost always give the same ledger location.
func location(raw string) string {
	u, err := amqp.ParseURI(raw)
	if err != nil {
		return ""
	}
	// Built by hand: url.URL would escape the escaped vhost a second time.
	return fmt.Sprintf("%s://%s:%d/%s", u.Scheme, strings.ToLower(u.Host), u.Port, url.PathEscape(u.Vhost))
}

// queueName renders the queue template for topic.
func (s *settings) queueName(topic string) string {
	return strings.ReplaceAll(s.queueTmpl, placeholderTopic, topic)
}

// routingKey renders the routing-key template for one record.
func (s *settings) routingKey(topic string, partition int32, key []byte) string {
	rk := s.routingTmpl
	if !strings.Contains(rk, "${") {
		return rk
	}
	rk = strings.ReplaceAll(rk, placeholderTopic, topic)
	rk = strings.ReplaceAll(rk, placeholderPartition, strconv.Itoa(int(partition)))
	return strings.ReplaceAll(rk, placeholderKey, string(key))
}

// bindingKey is the routing key the queue for topic is bound with: per-record
// parts become a wildcard on a topic exchange.
func (s *settings) bindingKey(topic string) string {
	return bindingKeyOf(s.routingTmpl, topic)
}

func bindingKeyOf(routingTmpl, topic string) string {
	rk := strings.ReplaceAll(routingTmpl, placeholderTopic, topic)
	rk = strings.ReplaceAll(rk, placeholderPartition, "*")
	return strings.ReplaceAll(rk, placeholderKey, "#")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
