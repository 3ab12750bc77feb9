package worker

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

func TestValidateCommon(t *testing.T) {
	base := func(kv ...string) connect.Config {
		c := connect.Config{KeyName: "c", KeyConnectorClass: "x"}
		for i := 0; i+1 < len(kv); i += 2 {
			c[kv[i]] = kv[i+1]
		}
		return c
	}
	tests := []struct {
		name    string
		typ     connect.ConnectorType
		cfg     connect.Config
		badKeys []string
	}{
		{"source minimal", connect.TypeSource, base(), nil},
		{"sink with topics", connect.TypeSink, base(KeyTopics, "a, b"), nil},
		{"sink with regex", connect.TypeSink, base(KeyTopicsRegex, "a.*"), nil},
		{"sink without topics", connect.TypeSink, base(), []string{KeyTopics, KeyTopicsRegex}},
		{"sink with both", connect.TypeSink, base(KeyTopics, "a", KeyTopicsRegex, "a.*"), []string{KeyTopics, KeyTopicsRegex}},
		{"bad regex", connect.TypeSink, base(KeyTopicsRegex, "a("), []string{KeyTopicsRegex}},
		// Valid alone, but an unterminated \Q quotes the ")$" the runtime
		// anchors it with: the task failed at start (invalid regular
		// expression) and the dead letter queue check was skipped.
		{"regex unusable anchored", connect.TypeSink, base(KeyTopicsRegex, `\Qorders`), []string{KeyTopicsRegex}},
		{"regex quoted and closed", connect.TypeSink, base(KeyTopicsRegex, `\Qorders.v1\E`), nil},
		{"bad topic name", connect.TypeSink, base(KeyTopics, "ok,not ok"), []string{KeyTopics}},
		{"missing name and class", connect.TypeSource, connect.Config{}, []string{KeyName, KeyConnectorClass}},
		{"every bad field named", connect.TypeSink, base(KeyTopics, "a", KeyTasksMax, "0", KeyErrorsTolerance, "some",
			KeyOffsetFlushInterval, "-5", KeyGracefulTimeout, "x", KeyDLQTopic, "a", KeyDLQReplicationFactor, "0",
			KeyDLQContextHeaders, "maybe", KeyValueConverter, "io.confluent.connect.avro.AvroConverter"),
			[]string{KeyTasksMax, KeyErrorsTolerance, KeyOffsetFlushInterval, KeyGracefulTimeout, KeyDLQTopic, KeyDLQReplicationFactor, KeyDLQContextHeaders, KeyValueConverter}},
		{"passthrough converters", connect.TypeSource, base(KeyKeyConverter, "org.apache.kafka.connect.storage.StringConverter", KeyValueConverter, "org.apache.kafka.connect.converters.ByteArrayConverter"), nil},
		{"topic creation", connect.TypeSource, base(KeyTopicCreationPartition, "0", KeyTopicCreationRF, "-2"), []string{KeyTopicCreationPartition, KeyTopicCreationRF}},
		{"topic creation broker defaults", connect.TypeSource, base(KeyTopicCreationPartition, "-1", KeyTopicCreationRF, "-1"), nil},
		{"durations beyond a year (Long.MAX)", connect.TypeSource, base(KeyOffsetFlushInterval, "9223372036854775807", KeyGracefulTimeout, "9223372036854775807"), []string{KeyOffsetFlushInterval, KeyGracefulTimeout}},
		{"durations of a year", connect.TypeSource, base(KeyOffsetFlushInterval, "31536000000", KeyGracefulTimeout, "31536000000"), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateCommon(tc.typ, tc.cfg)
			var got []string
			for k, msgs := range errs {
				got = append(got, k)
				for _, m := range msgs {
					if m == "" {
						t.Errorf("%s: empty message", k)
					}
				}
			}
			slices.Sort(got)
			want := slices.Clone(tc.badKeys)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("bad keys %v, want %v (errors %v)", got, want, errs)
			}
		})
	}
}

func TestCommonConfigDefPerType(t *testing.T) {
	src, sink := CommonConfigDef(connect.TypeSource), CommonConfigDef(connect.TypeSink)
	for _, k := range []string{KeyTopics, KeyTopicsRegex, KeyDLQTopic} {
		if _, ok := src.Key(k); ok {
			t.Errorf("source definition has sink key %s", k)
		}
		if key, ok := sink.Key(k); !ok || key.Doc == "" {
			t.Errorf("sink definition lacks %s or its doc", k)
		}
	}
	if _, ok := sink.Key(KeyTopicCreationPartition); ok {
		t.Error("sink definition has topic creation keys")
	}
	for _, k := range src {
		if k.Doc == "" || k.Group == "" {
			t.Errorf("key %s lacks doc or group", k.Name)
		}
	}
}

func TestParseSettingsDefaults(t *testing.T) {
	w, err := New(WithPlugins(nil))
	if err == nil || !strings.Contains(err.Error(), "plugins") {
		t.Fatalf("New without plugins: %v", err)
	}
	w = &Worker{grace: 5 * time.Second, flushInterval: time.Minute, topicPartitions: -1, topicReplication: -1}
	s, err := w.parseSettings(connect.TypeSink, connect.Config{KeyTopics: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if s.grace != 5*time.Second || s.flushInterval != time.Minute || s.tolerateAll || s.tasksMax != 1 {
		t.Errorf("defaults %+v", s)
	}
	s, err = w.parseSettings(connect.TypeSource, connect.Config{KeyGracefulTimeout: "250", KeyOffsetFlushInterval: "1000", KeyTopicCreationPartition: "6", KeyTopicCreationRF: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if s.grace != 250*time.Millisecond || s.flushInterval != time.Second || s.createPartitions != 6 || s.createReplication != 1 {
		t.Errorf("parsed %+v", s)
	}
}

// TestSettingsRefuseOverflowingDurations: a config stored before the
// bounds existed (or written to the store by hand) fails the connector's
// start naming the keys; it used to overflow into a negative duration, and
// a negative ticker interval panicked the process on every boot.
func TestSettingsRefuseOverflowingDurations(t *testing.T) {
	w := &Worker{flushInterval: time.Minute, grace: 5 * time.Second}
	_, err := w.parseSettings(connect.TypeSource, connect.Config{KeyName: "c", KeyConnectorClass: "x",
		KeyOffsetFlushInterval: "9223372036854775807", KeyGracefulTimeout: "9223372036854775807"})
	if err == nil || !strings.Contains(err.Error(), KeyOffsetFlushInterval) || !strings.Contains(err.Error(), KeyGracefulTimeout) {
		t.Fatalf("parseSettings = %v, want an error naming both keys", err)
	}
}
