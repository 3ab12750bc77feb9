package herder

import (
	"context"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// TestSinkResetRefusedWholeWhileGroupHasMembers: a reset of a sink's
// offsets while its consumer group still has a member (one whose leave
// timed out at the stop stays until its session times out; another
// worker using the name) fails, as the group's deletion did before, and
// changes nothing: OffsetDelete refuses only the topics the members
// subscribe to, so deleting the offsets one by one first left the others
// deleted by a reset reported as failed.
func TestSinkResetRefusedWholeWhileGroupHasMembers(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	name := testenv.Unique("reset-members-")
	a, b := testenv.Unique("rm-a-"), testenv.Unique("rm-b-")
	if _, err := hs.adm.CreateTopics(ctx, 1, 1, nil, a, b); err != nil {
		t.Fatal(err)
	}
	hs.dropTopic(a, b)
	if _, err := hs.h.CreateConnector(ctx, name, connect.Config{KeyConnectorClass: sampleconn.SinkClass, KeyTopics: a}, worker.TargetStopped); err != nil {
		t.Fatal(err)
	}
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: a, Partition: 0, At: 1, LeaderEpoch: -1})
	offs.Add(kadm.Offset{Topic: b, Partition: 0, At: 1, LeaderEpoch: -1})
	resp, err := hs.adm.CommitOffsets(ctx, SinkGroup(name), offs)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	assigned := make(chan struct{})
	var once sync.Once
	member, err := kgo.NewClient(kgo.SeedBrokers(hs.seeds...), kgo.ConsumerGroup(SinkGroup(name)), kgo.ConsumeTopics(a),
		kgo.DisableAutoCommit(), kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			once.Do(func() { close(assigned) })
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	go func() {
		for !member.PollFetches(ctx).IsClientClosed() && ctx.Err() == nil {
		}
	}()
	select {
	case <-assigned:
	case <-ctx.Done():
		t.Fatal("the member was never assigned")
	}
	if err := hs.h.ResetOffsets(ctx, name); err == nil {
		t.Fatal("ResetOffsets succeeded while the group has a member")
	}
	got, err := hs.adm.FetchOffsets(ctx, SinkGroup(name))
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{a, b} {
		if o, ok := got.Lookup(topic, 0); !ok || o.At != 1 {
			t.Errorf("offset of %s after a failed reset = %+v (%v), want 1 kept", topic, o, ok)
		}
	}
}

// TestDeletingARunningSinkDropsItsOffsets: deleting a sink that is running
// stops its task (whose consumer leaves the group) before the group's
// offsets and the group are deleted: none is left for a sink created later
// under the name.
func TestDeletingARunningSinkDropsItsOffsets(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	src, sink, topic := testenv.Unique("drs-src-"), testenv.Unique("drs-sink-"), testenv.Unique("drs-")
	if _, err := hs.h.CreateConnector(ctx, src, sourceConfig(topic, 1), ""); err != nil {
		t.Fatal(err)
	}
	cfg := connect.Config{KeyConnectorClass: sampleconn.SinkClass, KeyTopics: topic, worker.KeyOffsetFlushInterval: "50"}
	if _, err := hs.h.CreateConnector(ctx, sink, cfg, ""); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "committed sink offsets", func() bool {
		o, err := hs.adm.FetchOffsets(ctx, SinkGroup(sink))
		return err == nil && len(o) > 0
	})
	if err := hs.h.DeleteConnector(ctx, sink); err != nil {
		t.Fatal(err)
	}
	o, err := hs.adm.FetchOffsets(ctx, SinkGroup(sink))
	if err != nil && !isGroupGone(err) {
		t.Fatal(err)
	}
	if len(o) > 0 {
		t.Errorf("offsets of the deleted sink's group: %v, want none", o)
	}
}
