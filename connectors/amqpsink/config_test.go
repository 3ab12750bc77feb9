package amqpsink

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func TestValidate(t *testing.T) {
	good := func() connect.Config {
		return connect.Config{"name": "c1", KeyURL: "amqp://u:topsecret@localhost:5672/v", KeyTopics: "a,b"}
	}
	for _, tc := range []struct {
		name    string
		change  func(c connect.Config)
		badKeys []string // empty: valid
	}{
		{"defaults are valid", func(connect.Config) {}, nil},
		{"missing url", func(c connect.Config) { delete(c, KeyURL) }, []string{KeyURL}},
		{"malformed url", func(c connect.Config) { c[KeyURL] = "http://u:topsecret@host/" }, []string{KeyURL}},
		{"url without scheme", func(c connect.Config) { c[KeyURL] = "localhost:5672" }, []string{KeyURL}},
		{"bad exchange type", func(c connect.Config) { c[KeyExchangeType] = "x-consistent-hash" }, []string{KeyExchangeType}},
		{"bad queue type", func(c connect.Config) { c[KeyQueueType] = "stream" }, []string{KeyQueueType}},
		{"unknown queue placeholder", func(c connect.Config) { c[KeyQueue] = "q.${topik}" }, []string{KeyQueue}},
		{"queue uses per-record placeholder", func(c connect.Config) { c[KeyQueue] = "q.${key}" }, []string{KeyQueue}},
		{"unterminated placeholder", func(c connect.Config) { c[KeyRoutingKey] = "${topic" }, []string{KeyRoutingKey}},
		{"lone dollar", func(c connect.Config) { c[KeyRoutingKey] = "a$b" }, []string{KeyRoutingKey}},
		{"routing key with key and partition", func(c connect.Config) { c[KeyRoutingKey] = "${topic}.${partition}.${key}" }, nil},
		{"direct exchange with per-record key", func(c connect.Config) {
			c[KeyExchangeType] = "direct"
			c[KeyRoutingKey] = "${topic}.${key}"
		}, []string{KeyRoutingKey}},
		{"reserved exchange name", func(c connect.Config) { c[KeyExchange] = "amq.topic" }, nil},
		// A predefined exchange has its own type: records routed by
		// another would go to the wrong queues.
		{"predefined fanout exchange as topic", func(c connect.Config) { c[KeyExchange] = "amq.fanout" }, []string{KeyExchangeType}},
		{"predefined fanout exchange, one topic", func(c connect.Config) {
			c[KeyExchange], c[KeyExchangeType], c[KeyTopics] = "amq.fanout", "fanout", "a"
		}, nil},
		{"predefined headers exchange as topic", func(c connect.Config) { c[KeyExchange] = "amq.match" }, []string{KeyExchangeType}},
		{"predefined headers exchange, several topics", func(c connect.Config) {
			c[KeyExchange], c[KeyExchangeType] = "amq.headers", "headers"
		}, nil},
		{"no such predefined exchange", func(c connect.Config) { c[KeyExchange] = "amq.nonexistent" }, []string{KeyExchange}},
		{"connector name reserved as the default exchange", func(c connect.Config) { c["name"] = "amq.x" }, []string{KeyExchange}},
		{"reconnect timeout with spaces", func(c connect.Config) { c[KeyReconnectTimeout] = " 1000" }, nil},
		// Reserved characters in the password: the error quotes no part
		// of it (checked below for every case).
		{"'?' in the password", func(c connect.Config) { c[KeyURL] = "amqp://u:Xq7?Zw9@localhost:5672/v" }, []string{KeyURL}},
		{"'#' in the password reads as a port", func(c connect.Config) { c[KeyURL] = "amqp://u:12345#topsecret@localhost/" }, []string{KeyURL}},
		{"too long exchange name", func(c connect.Config) { c[KeyExchange] = strings.Repeat("x", 256) }, []string{KeyExchange}},
		{"no topics", func(c connect.Config) { delete(c, KeyTopics) }, []string{KeyTopics}},
		{"topics and regex", func(c connect.Config) { c[KeyTopicsRegex] = "a.*" }, []string{KeyTopics}},
		{"bad regex", func(c connect.Config) { delete(c, KeyTopics); c[KeyTopicsRegex] = "a(" }, []string{KeyTopicsRegex}},
		{"bad cleanup flag", func(c connect.Config) { c[KeyCleanupOnDelete] = "yes" }, []string{KeyCleanupOnDelete}},
		{"zero in flight", func(c connect.Config) { c[KeyMaxInFlight] = "0" }, []string{KeyMaxInFlight}},
		{"unbounded in flight", func(c connect.Config) { c[KeyMaxInFlight] = "2147483647" }, []string{KeyMaxInFlight}},
		{"largest in flight", func(c connect.Config) { c[KeyMaxInFlight] = "65536" }, nil},
		{"reconnect timeout beyond a Duration", func(c connect.Config) { c[KeyReconnectTimeout] = "9223372036854775807" }, []string{KeyReconnectTimeout}},
		{"routing key without topic, several topics", func(c connect.Config) { c[KeyRoutingKey] = "events.${key}" }, []string{KeyRoutingKey}},
		{"routing key without topic, regex", func(c connect.Config) {
			delete(c, KeyTopics)
			c[KeyTopicsRegex] = "a.*"
			c[KeyRoutingKey] = "events"
		}, []string{KeyRoutingKey}},
		{"routing key without topic, one topic", func(c connect.Config) { c[KeyTopics] = "a"; c[KeyRoutingKey] = "events" }, nil},
		{"fanout with several topics", func(c connect.Config) { c[KeyExchangeType] = "fanout" }, []string{KeyExchangeType}},
		{"fanout with one topic", func(c connect.Config) { c[KeyTopics] = "a"; c[KeyExchangeType] = "fanout" }, nil},
		{"fanout into one shared queue", func(c connect.Config) { c[KeyQueue] = "events"; c[KeyExchangeType] = "fanout" }, nil},
		{"literal routing key into one shared queue", func(c connect.Config) { c[KeyQueue] = "events"; c[KeyRoutingKey] = "events" }, nil},
		{"one topic with a trailing comma", func(c connect.Config) { c[KeyTopics] = "a,"; c[KeyRoutingKey] = "events" }, nil},
		{"max message bytes over RabbitMQ's limit", func(c connect.Config) { c[KeyMaxMessageBytes] = "536870913" }, []string{KeyMaxMessageBytes}},
		{"content type over 255 bytes", func(c connect.Config) { c[KeyContentType] = strings.Repeat("x", 256) }, []string{KeyContentType}},
		{"bad tolerance", func(c connect.Config) { c[KeyErrorsTolerance] = "some" }, []string{KeyErrorsTolerance}},
		{"several bad keys", func(c connect.Config) {
			c[KeyURL] = "nope"
			c[KeyQueueType] = "lazy"
			c[KeyRoutingKey] = "${nope}"
		}, []string{KeyURL, KeyQueueType, KeyRoutingKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.change(cfg)
			errs := validate(configDef.WithDefaults(cfg), true)
			_, err := parse(cfg, "")
			if len(tc.badKeys) == 0 {
				if len(errs) != 0 || err != nil {
					t.Fatalf("want valid, got %v / %v", errs, err)
				}
				return
			}
			if err == nil {
				t.Fatal("parse accepted an invalid config")
			}
			for _, k := range tc.badKeys {
				if len(errs[k]) == 0 {
					t.Errorf("no error for key %s (errors: %v)", k, errs)
				}
				if !strings.Contains(err.Error(), k) {
					t.Errorf("parse error does not name %s: %v", k, err)
				}
			}
			if len(errs) != len(tc.badKeys) {
				t.Errorf("errors for %d keys, want %d: %v", len(errs), len(tc.badKeys), errs)
			}
			for _, leak := range []string{"topsecret", "Xq7", "12345"} {
				if strings.Contains(err.Error(), leak) || strings.Contains(fmt.Sprint(errs), leak) {
					t.Errorf("errors leak the password (%q): %v / %v", leak, err, errs)
				}
			}
		})
	}
}

func TestValidatorLeavesTopicsToRuntime(t *testing.T) {
	errs := (&Connector{}).Validate(context.Background(), connect.Config{"name": "c", KeyURL: "amqp://localhost/", KeyQueue: "${bad}"})
	if _, ok := errs[KeyTopics]; ok {
		t.Errorf("Validate reported %s, which the runtime's common validation owns: %v", KeyTopics, errs)
	}
	if len(errs[KeyQueue]) == 0 {
		t.Errorf("Validate did not report the bad queue template: %v", errs)
	}
}

func TestMaskedEverywhere(t *testing.T) {
	cfg := connect.Config{KeyURL: "amqp://u:topsecret@localhost:5672/"}
	if got := configDef.Mask(cfg)[KeyURL]; strings.Contains(got, "topsecret") {
		t.Errorf("Mask kept the password: %s", got)
	}
	s, err := parse(connect.Config{"name": "c", KeyURL: cfg[KeyURL], KeyTopics: "a"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s.location, "topsecret") || strings.Contains(s.LogValue().String(), "topsecret") {
		t.Errorf("location %q or log value %q holds the password", s.location, s.LogValue())
	}
}

func TestTemplates(t *testing.T) {
	for _, tc := range []struct {
		tmpl, exType           string
		wantKey, wantBindingKy string
	}{
		{"${topic}", "topic", "orders", "orders"},
		{"${topic}.${partition}", "topic", "orders.3", "orders.*"},
		{"kafka.${topic}.${key}", "topic", "kafka.orders.k1", "kafka.orders.#"},
		{"fixed", "direct", "fixed", "fixed"},
	} {
		s := &settings{routingTmpl: tc.tmpl, queueTmpl: "q-${topic}", exchangeType: tc.exType}
		if got := s.routingKey("orders", 3, []byte("k1")); got != tc.wantKey {
			t.Errorf("routingKey(%q) = %q, want %q", tc.tmpl, got, tc.wantKey)
		}
		if got := s.bindingKey("orders"); got != tc.wantBindingKy {
			t.Errorf("bindingKey(%q) = %q, want %q", tc.tmpl, got, tc.wantBindingKy)
		}
		if got := s.queueName("orders"); got != "q-orders" {
			t.Errorf("queueName = %q", got)
		}
	}
}

func TestBindingNameRoundTrip(t *testing.T) {
	for _, b := range []binding{
		{exchange: "ex", queue: "q", key: "a.b", owner: "c"},
		{exchange: "e&x=1", queue: "q/ü", key: "", owner: "c d", headers: true, topic: "t"},
	} {
		got, err := parseBinding(b.name())
		if err != nil || got != b {
			t.Errorf("round trip of %+v = %+v, %v", b, got, err)
		}
	}
	if _, err := parseBinding("queue=q"); err == nil {
		t.Error("parseBinding accepted a name without exchange and owner")
	}
}

func TestLocation(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"amqp://u:p@localhost:5672/", "amqp://localhost:5672/%2F"},
		{"amqp://u:p@LocalHost/", "amqp://localhost:5672/%2F"},
		{"amqp://localhost", "amqp://localhost:5672/%2F"},
		{"amqp://u:p@h:5673/prod", "amqp://h:5673/prod"},
		{"amqps://u:p@h/a%2Fb", "amqps://h:5671/a%2Fb"},
	} {
		if got := location(tc.url); got != tc.want {
			t.Errorf("location(%q) = %q, want %q", tc.url, got, tc.want)
		}
	}
}

// recordedOwner picks the owner argument bindings get: the least recorded
// marker (connector and tasks drawing at once agree on it from then on),
// else the connector name of bindings an earlier version recorded without
// a marker, so that a restart after an upgrade rebinds nothing anew.
func TestRecordedOwner(t *testing.T) {
	legacy := connect.Resource{Kind: KindBinding, Name: binding{exchange: "ex", queue: "q", key: "k", owner: "c"}.name()}
	drawn := connect.Resource{Kind: KindBinding, Name: binding{exchange: "ex", queue: "q", key: "k", owner: "c#01"}.name()}
	for _, tc := range []struct {
		name string
		rs   []connect.Resource
		want string
	}{
		{"empty ledger", nil, ""},
		{"exchange and queue only", []connect.Resource{{Kind: KindExchange, Name: "ex"}, {Kind: KindQueue, Name: "q"}}, ""},
		{"bindings from before markers", []connect.Resource{{Kind: KindQueue, Name: "q"}, legacy}, "c"},
		{"one marker", []connect.Resource{drawn, {Kind: KindBindingOwner, Name: "c#01"}}, "c#01"},
		{"two markers drawn at once", []connect.Resource{{Kind: KindBindingOwner, Name: "c#ff"}, {Kind: KindBindingOwner, Name: "c#0a"}}, "c#0a"},
		{"a marker wins over legacy bindings", []connect.Resource{legacy, {Kind: KindBindingOwner, Name: "c#ff"}}, "c#ff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := recordedOwner(tc.rs); got != tc.want {
				t.Errorf("recordedOwner = %q, want %q", got, tc.want)
			}
		})
	}
}

// A ledger left with only the owner marker (a crash between recording it
// and recording the first binding) lists nothing on the broker: deleting
// the connector releases it without dialling, so it completes even with the
// broker gone.
func TestOwnerMarkerAloneNeedsNoBroker(t *testing.T) {
	cfg := connect.Config{"name": "c", "connector.class": Class, KeyURL: "amqp://guest:guest@127.0.0.1:1/", KeyTopics: "t"}
	l := connect.NewMemoryLedger()
	ctx := context.Background()
	if err := l.Own(ctx, connect.Resource{Kind: KindBindingOwner, Name: "c#01", Location: "amqp://127.0.0.1:1/"}); err != nil {
		t.Fatal(err)
	}
	for _, cleanupOnly := range []bool{true, false} {
		c := &Connector{}
		h := &connect.Host{Connector: "c", Task: -1, Logger: slog.New(slog.DiscardHandler), Ledger: l, CleanupOnly: cleanupOnly}
		hctx := connect.WithHost(ctx, h)
		if !cleanupOnly {
			cfg[KeyExchangeType] = "bogus" // an invalid config: Start fails before dialling
		}
		_ = c.Start(hctx, cfg)
		c.Stop(true)
		if err := c.Stopped(hctx); err != nil {
			t.Errorf("cleanupOnly=%v: deletion: %v", cleanupOnly, err)
		}
		if rs, _ := l.List(ctx); len(rs) != 0 {
			t.Errorf("cleanupOnly=%v: ledger after the deletion: %v", cleanupOnly, rs)
		}
		_ = l.Own(ctx, connect.Resource{Kind: KindBindingOwner, Name: "c#01", Location: "amqp://127.0.0.1:1/"})
	}
}
