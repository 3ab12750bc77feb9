package rest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
)

// Offsets keep whole numbers exact (as Kafka Connect keeps a Long): a
// source offset or partition past 2^53 is not rounded, a sink offset past
// 2^53 is committed as given, and a sink partition past 32 bits is refused
// rather than wrapped around onto another partition. Sink partition and
// offset may be strings of a number, as in Kafka Connect.
func TestOffsetsKeepWholeNumbers(t *testing.T) {
	e := newKafkaE2E(t)
	e.expect("POST", "/connectors", `{"name":"big","config":{"connector.class":"sample-source","sample.topic":"t"},"initial_state":"STOPPED"}`, 201)
	e.expect("PATCH", "/connectors/big/offsets", `{"offsets":[{"partition":{"slot":9007199254740993},"offset":{"lsn":9007199254740993,"ratio":0.5}}]}`, 200)
	got := string(e.expect("GET", "/connectors/big/offsets", "", 200).Body)
	if strings.Count(got, "9007199254740993") != 2 || !strings.Contains(got, "0.5") {
		t.Errorf("source offsets after PATCH: %s, want 9007199254740993 twice, exactly, and 0.5", got)
	}
	// The partition is found again by the exact number: a null offset resets it.
	e.expect("PATCH", "/connectors/big/offsets", `{"offsets":[{"partition":{"slot":9007199254740993},"offset":null}]}`, 200)
	if got := string(e.expect("GET", "/connectors/big/offsets", "", 200).Body); strings.Contains(got, "9007199254740993") {
		t.Errorf("source offsets after resetting the partition: %s", got)
	}
	res := e.do("PATCH", "/connectors/big/offsets", `{"offsets":[{"partition":{"slot":1},"offset":{"txid":18446744073709551615}}]}`, appJSON)
	if res.Status != 400 || !strings.Contains(string(res.Body), "18446744073709551615") {
		t.Errorf("a whole number beyond 64 bits: %d %s, want 400 naming it", res.Status, res.Body)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := testenv.Unique("offsets-topic-")
	if _, err := adm.CreateTopic(context.Background(), 2, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	e.expect("POST", "/connectors", fmt.Sprintf(`{"name":"snk","config":{"connector.class":"sample-sink","topics":%q},"initial_state":"STOPPED"}`, topic), 201)
	patch := func(partition, offset string) response {
		return e.do("PATCH", "/connectors/snk/offsets", fmt.Sprintf(`{"offsets":[{"partition":{"kafka_topic":%q,"kafka_partition":%s},"offset":{"kafka_offset":%s}}]}`, topic, partition, offset), appJSON)
	}
	if res := patch("4294967296", "7"); res.Status != 400 || !strings.Contains(string(res.Body), "kafka_partition") {
		t.Errorf("kafka_partition 2^32: %d %s, want 400 naming kafka_partition", res.Status, res.Body)
	}
	if got := string(e.expect("GET", "/connectors/snk/offsets", "", 200).Body); strings.Contains(got, `"kafka_offset":7`) {
		t.Errorf("a refused PATCH changed offsets: %s", got)
	}
	if res := patch("1", "9007199254740993"); res.Status != 200 {
		t.Fatalf("kafka_offset 2^53+1: %d %s", res.Status, res.Body)
	}
	if res := patch(`"0"`, `"1000"`); res.Status != 200 {
		t.Errorf(`kafka_partition "0", kafka_offset "1000": %d %s, want 200 as in Kafka Connect`, res.Status, res.Body)
	}
	got = string(e.expect("GET", "/connectors/snk/offsets", "", 200).Body)
	if !strings.Contains(got, "9007199254740993") || !strings.Contains(got, `"kafka_offset":1000`) {
		t.Errorf("sink offsets: %s, want 9007199254740993 exactly on partition 1 and 1000 on partition 0", got)
	}
}
