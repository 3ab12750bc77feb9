package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseStandalone(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c *config)
		wantErr []string // substrings; each bad flag named
	}{
		{name: "defaults", check: func(t *testing.T, c *config) {
			if c.restAddr != ":8083" || c.dataDir != "./data" || c.bootstrapServers != "" || c.embeddedKafkaAddr != "127.0.0.1:9092" ||
				c.logFormat != "text" || c.logLevel != "info" || c.gracefulTimeout != 5*time.Second || c.deleteTimeout != 30*time.Second ||
				c.topicPartitions != 1 || c.topicReplication != 1 || c.workerID != "" || !c.embeddedKafkaSync || c.maxMessageBytes != 1048588 {
				t.Errorf("defaults = %+v", c)
			}
		}},
		{name: "env fills flags", env: map[string]string{
			"TIDYCONNECT_REST_ADDR": "127.0.0.1:9000", "TIDYCONNECT_DATA_DIR": "/tmp/x", "TIDYCONNECT_BOOTSTRAP_SERVERS": "a:9092,b:9092",
			"TIDYCONNECT_LOG_FORMAT": "json", "TIDYCONNECT_GRACEFUL_TIMEOUT": "2s", "TIDYCONNECT_TOPIC_REPLICATION_FACTOR": "-1",
			"TIDYCONNECT_WORKER_ID": "w1", "TIDYCONNECT_EMBEDDED_KAFKA_SYNC": "false",
		}, check: func(t *testing.T, c *config) {
			if c.restAddr != "127.0.0.1:9000" || c.dataDir != "/tmp/x" || c.bootstrapServers != "a:9092,b:9092" || c.logFormat != "json" ||
				c.gracefulTimeout != 2*time.Second || c.topicReplication != -1 || c.workerID != "w1" || c.embeddedKafkaSync {
				t.Errorf("from env = %+v", c)
			}
		}},
		{name: "flag wins over env", args: []string{"--rest-addr", ":9100", "--log-level=debug"},
			env: map[string]string{"TIDYCONNECT_REST_ADDR": ":9000", "TIDYCONNECT_LOG_LEVEL": "error"},
			check: func(t *testing.T, c *config) {
				if c.restAddr != ":9100" || c.logLevel != "debug" {
					t.Errorf("flags did not win: %+v", c)
				}
			}},
		{name: "bad flag values name each flag", args: []string{"--log-format", "xml", "--log-level", "loud", "--topic-partitions", "0", "--rest-addr", "nope", "--delete-timeout", "-1s"},
			wantErr: []string{"--log-format", "--log-level", "--topic-partitions", "--rest-addr", "--delete-timeout"}},
		{name: "unparsable flag", args: []string{"--graceful-timeout", "soon"}, wantErr: []string{"--graceful-timeout", "TIDYCONNECT_GRACEFUL_TIMEOUT", "duration"}},
		{name: "unparsable env", env: map[string]string{"TIDYCONNECT_TOPIC_PARTITIONS": "many"}, wantErr: []string{"--topic-partitions", "TIDYCONNECT_TOPIC_PARTITIONS", "whole number"}},
		{name: "embedded broker only on loopback", args: []string{"--embedded-kafka-addr", "0.0.0.0:9092"}, wantErr: []string{"--embedded-kafka-addr", "127.0.0.1"}},
		{name: "bad bootstrap server", args: []string{"--bootstrap-servers", "kafka"}, wantErr: []string{"--bootstrap-servers", "host:port"}},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: []string{"-nope", "--help"}},
		{name: "missing connector file", args: []string{"/does/not/exist.json"}, wantErr: []string{"/does/not/exist.json"}},
		{name: "flags after and between connector files", args: []string{os.Args[0], "--rest-addr", "127.0.0.1:0", os.Args[0], "--data-dir=/tmp/x"},
			check: func(t *testing.T, c *config) {
				if c.restAddr != "127.0.0.1:0" || c.dataDir != "/tmp/x" || !slices.Equal(c.connectorFiles, []string{os.Args[0], os.Args[0]}) {
					t.Errorf("parsed %+v", c)
				}
			}},
		{name: "after -- everything is a file", args: []string{"--", "--rest-addr"}, wantErr: []string{"connector file --rest-addr"}},
		{name: "max message bytes out of range", args: []string{"--max-message-bytes", "10"}, wantErr: []string{"--max-message-bytes", "1024"}},
		{name: "max message bytes raised", args: []string{"--max-message-bytes", "16777216"}, check: func(t *testing.T, c *config) {
			if got := topicConfigs(c)["max.message.bytes"]; got != "16777216" {
				t.Errorf("topic configs %v, want max.message.bytes 16777216", topicConfigs(c))
			}
		}},
		// Every accepted value makes a Kafka client franz-go accepts (its
		// request bound must be at least the batch limit).
		{name: "max message bytes at the top of its range", args: []string{"--max-message-bytes", "536870912"}, check: func(t *testing.T, c *config) {
			cl, err := kgo.NewClient(append(recordSizeOpts(c), kgo.SeedBrokers("127.0.0.1:1"))...)
			if err != nil {
				t.Fatalf("a Kafka client for --max-message-bytes=%d: %v", c.maxMessageBytes, err)
			}
			cl.Close()
		}},
		{name: "a boolean flag's value takes =", args: []string{"--embedded-kafka-sync", "false"}, wantErr: []string{"--embedded-kafka-sync=false"}},
		{name: "unparsable boolean flag", args: []string{"--embedded-kafka-sync=maybe"}, wantErr: []string{"--embedded-kafka-sync (env TIDYCONNECT_EMBEDDED_KAFKA_SYNC)", "true or false"}},
		{name: "unparsable boolean env", env: map[string]string{"TIDYCONNECT_EMBEDDED_KAFKA_SYNC": "maybe"}, wantErr: []string{"TIDYCONNECT_EMBEDDED_KAFKA_SYNC", "true or false"}},
		{name: "a boolean flag with =", args: []string{"--embedded-kafka-sync=false"}, check: func(t *testing.T, c *config) {
			if c.embeddedKafkaSync {
				t.Errorf("parsed %+v", c)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseStandalone(tc.args, io.Discard, envMap(tc.env))
			if len(tc.wantErr) > 0 {
				var ue *usageError
				if !errors.As(err, &ue) {
					t.Fatalf("err = %v, want a usage error", err)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not mention %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestHelpListsEveryFlagWithItsEnv(t *testing.T) {
	var b strings.Builder
	_, err := parseStandalone([]string{"--help"}, &b, envMap(nil))
	if !errors.Is(err, errHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, name := range []string{"rest-addr", "data-dir", "bootstrap-servers", "embedded-kafka-addr", "worker-id", "log-format",
		"log-level", "graceful-timeout", "delete-timeout", "topic-partitions", "topic-replication-factor"} {
		if !strings.Contains(b.String(), "--"+name+" ") || !strings.Contains(b.String(), envName(name)) {
			t.Errorf("help does not describe --%s and %s:\n%s", name, envName(name), b.String())
		}
	}
}

func TestReadConnectorFile(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		wantErr []string
	}{
		{"valid", `{"name":"c1","config":{"connector.class":"pgaudit","tasks.max":"1"},"initial_state":"paused"}`, nil},
		// Numbers are coerced to their literal text, as over REST.
		{"valid number", `{"name":"c1","config":{"connector.class":"pgaudit","tasks.max":1},"initial_state":"paused"}`, nil},
		{"not json", `{"name":`, []string{"not a JSON object"}},
		{"missing name and config", `{}`, []string{`"name" is required`, `"config" is required`}},
		{"non-scalar value", `{"name":"c","config":{"tasks.max":[2]}}`, []string{"config.tasks.max must be a string"}},
		{"unknown field", `{"name":"c","config":{},"extra":1}`, []string{`unknown field "extra"`}},
		{"bad name", `{"name":"a/b","config":{}}`, []string{`field "name"`, "'/'"}},
	}
	dir := t.TempDir()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".json")
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			cf, err := readConnectorFile(p)
			if tc.wantErr == nil {
				if err != nil || cf.name != "c1" || cf.config["tasks.max"] != "1" || cf.initial != "PAUSED" {
					t.Fatalf("valid file: %+v %v", cf, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want an error")
			}
			if !strings.Contains(err.Error(), p) {
				t.Errorf("error %q does not name the file", err)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
