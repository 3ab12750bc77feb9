package kafka

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestEmbeddedPersistsRecordsAndGroupOffsets(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	topic := testenv.Unique("persist-")
	group := testenv.Unique("group-")

	e, err := StartEmbedded(ctx, dir, "127.0.0.1:0", WithEmbeddedLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	firstID := e.ClusterID()
	if firstID == "" {
		t.Fatal("embedded broker has no cluster id")
	}
	cl, err := NewClient(e.Addrs(), nil, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	if err := NewTopicCreator(cl, 2, 1).Ensure(ctx, topic); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		r := &kgo.Record{Topic: topic, Partition: 0, Value: []byte(fmt.Sprint(i))}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(cl)
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 7, LeaderEpoch: -1})
	if err := adm.CommitAllOffsets(ctx, group, offs); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	e.Close()
	e.Close() // idempotent

	e2, err := StartEmbedded(ctx, dir, ":0", WithEmbeddedLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if e2.ClusterID() != firstID {
		t.Errorf("cluster id changed across restart: %q then %q", firstID, e2.ClusterID())
	}
	cl2, err := NewClient(e2.Addrs(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl2.Close()
	adm2 := kadm.NewClient(cl2)
	fetched, err := adm2.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := fetched.Lookup(topic, 0); !ok || o.At != 7 {
		t.Errorf("committed offset after restart: %+v (found %v), want 7", o, ok)
	}
	ends, err := adm2.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := ends.Lookup(topic, 0); !ok || o.Offset != 10 {
		t.Errorf("end offset after restart: %+v, want 10", o)
	}
	if o, ok := ends.Lookup(topic, 1); !ok || o.Offset != 0 {
		t.Errorf("partition 1 after restart: %+v (found %v), want an empty partition (2 partitions kept)", o, ok)
	}
	consumer, err := NewClient(e2.Addrs(), nil, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	var got []string
	for len(got) < 10 {
		fs := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("records after restart: got %v: %v", got, err)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if strings.Join(got, ",") != "0,1,2,3,4,5,6,7,8,9" {
		t.Errorf("records after restart: %v", got)
	}
}

func TestEmbeddedListenAddr(t *testing.T) {
	tests := []struct {
		addr    string
		wantErr string
	}{
		{"", ""},
		{"127.0.0.1:0", ""},
		{"localhost:0", ""},
		{"0.0.0.0:9092", "127.0.0.1 only"},
		{"127.0.0.1:http", "not a number"},
		{"nonsense", "host:port"},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			_, err := embeddedPort(tc.addr)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := StartEmbedded(testCtx(t), "", ":0"); err == nil {
		t.Error("StartEmbedded without a data dir succeeded")
	}
}

func TestTopicCreatorIdempotentAndClusterID(t *testing.T) {
	ctx := testCtx(t)
	cl, err := NewClient(testenv.KafkaBrokers(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close) // runs after the deletion below (cleanups are LIFO)
	topic := testenv.Unique("created-")
	adm := kadm.NewClient(cl)
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topic) })

	tc := NewTopicCreator(cl, 3, 1)
	for range 2 {
		if err := tc.Ensure(ctx, topic); err != nil {
			t.Fatal(err)
		}
	}
	// A second creator does not know the topic: it gets TOPIC_ALREADY_EXISTS.
	if err := NewTopicCreator(cl, 3, 1).Ensure(ctx, topic); err != nil {
		t.Fatalf("creating an existing topic: %v", err)
	}
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(td[topic].Partitions); n != 3 {
		t.Errorf("topic has %d partitions, want 3", n)
	}
	bad := testenv.Unique("unreplicable-")
	if err := NewTopicCreator(cl, 1, 3).Ensure(ctx, bad); err == nil || !strings.Contains(err.Error(), "replication factor 3") {
		t.Errorf("creating a topic with more replicas than brokers: %v, want an error naming the replication factor", err)
	}
	id, err := ClusterID(ctx, cl)
	if err != nil || id == "" {
		t.Errorf("ClusterID = %q, %v", id, err)
	}
}

func TestNewClientNeedsSeeds(t *testing.T) {
	if _, err := NewClient(nil, nil); err == nil {
		t.Error("NewClient without seeds succeeded")
	}
}

// TestEnsureTopicsWithoutCreatePermission: a client without the CREATE
// permission gets TOPIC_AUTHORIZATION_FAILED for every topic, existing or
// not; like Kafka Connect, the topics are then assumed to exist (the first
// produce fails if one does not). They are not remembered as existing: once
// the permission is granted, the next Ensure creates them.
func TestEnsureTopicsWithoutCreatePermission(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var granted atomic.Bool
	c.ControlKey(int16(kmsg.CreateTopics), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if granted.Load() {
			return nil, nil, false
		}
		req := r.(*kmsg.CreateTopicsRequest)
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		for i, rt := range req.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic = rt.Topic
			st.ErrorCode = []int16{kerr.TopicAuthorizationFailed.Code, kerr.ClusterAuthorizationFailed.Code}[i%2]
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	cl, err := NewClient(c.ListenAddrs(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx := testCtx(t)
	tc := NewTopicCreator(cl, 1, 1)
	if err := tc.Ensure(ctx, "made-by-an-admin", "another"); err != nil {
		t.Errorf("Ensure without the CREATE permission: %v", err)
	}
	granted.Store(true)
	if err := tc.Ensure(ctx, "made-by-an-admin", "another"); err != nil {
		t.Fatal(err)
	}
	td, err := kadm.NewClient(cl).ListTopics(ctx, "made-by-an-admin", "another")
	if err != nil {
		t.Fatal(err)
	}
	if !td.Has("made-by-an-admin") || !td.Has("another") {
		t.Errorf("after the grant the topics were not created: %v", td.Names())
	}
}

// Records larger than Kafka's default limit: the embedded broker takes
// them up to WithMaxMessageBytes, and topics a creator with Configs makes
// carry the topic config that lets them through on any broker.
func TestLargeRecords(t *testing.T) {
	ctx := testCtx(t)
	const big = 2 << 20
	for _, tc := range []struct {
		name  string
		limit int
		ok    bool
	}{
		{"Kafka's default limit", 0, false},
		{"raised limit", 4 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []EmbeddedOpt
			if tc.limit > 0 {
				opts = append(opts, WithMaxMessageBytes(tc.limit))
			}
			e, err := StartEmbedded(ctx, t.TempDir(), "127.0.0.1:0", append(opts, WithEmbeddedLogger(slog.New(slog.DiscardHandler)))...)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			cl, err := NewClient(e.Addrs(), slog.New(slog.DiscardHandler), kgo.ProducerBatchMaxBytes(8<<20))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := EnsureTopics(ctx, kadm.NewClient(cl), 1, 1, "large"); err != nil {
				t.Fatal(err)
			}
			value := make([]byte, big)
			_, _ = rand.Read(value) // incompressible: the broker measures the compressed batch
			err = cl.ProduceSync(ctx, &kgo.Record{Topic: "large", Value: value}).FirstErr()
			if tc.ok && err != nil {
				t.Errorf("a %d-byte record with message.max.bytes %d: %v", big, tc.limit, err)
			}
			if !tc.ok && !errors.Is(err, kerr.MessageTooLarge) {
				t.Errorf("a %d-byte record at the default limit: %v, want MESSAGE_TOO_LARGE", big, err)
			}
		})
	}

	cl, err := NewClient(testenv.KafkaBrokers(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	topic := testenv.Unique("large-")
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topic) })
	tc := NewTopicCreator(cl, 1, 1)
	limit := "8388608"
	tc.Configs = map[string]*string{"max.message.bytes": &limit}
	if err := tc.Ensure(ctx, topic); err != nil {
		t.Fatal(err)
	}
	rc, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rc.On(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for _, kv := range c.Configs {
		if kv.Key == "max.message.bytes" && kv.Value != nil {
			got = *kv.Value
		}
	}
	if got != limit {
		t.Errorf("max.message.bytes of the created topic: %q, want %s", got, limit)
	}
}
