package herder

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// TestSinkDeletionInterruptedWhileWaitingForGroupMembersResumes: a sink's
// deletion that a shutdown interrupts while it waits for its consumer
// group's members to go (as after a SIGKILL) must not complete without the
// group: the recorded deletion carries on at the next start and deletes
// the group's offsets then. It used to log the group as left behind and
// forget the connector, so that a sink created later under the name
// resumed from the old offsets.
func TestSinkDeletionInterruptedWhileWaitingForGroupMembersResumes(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	name, topic := testenv.Unique("del-wait-"), testenv.Unique("dw-")
	if _, err := hs.adm.CreateTopics(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	hs.dropTopic(topic)
	if _, err := hs.h.CreateConnector(ctx, name, connect.Config{KeyConnectorClass: sampleconn.SinkClass, KeyTopics: topic}, worker.TargetStopped); err != nil {
		t.Fatal(err)
	}
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 1, LeaderEpoch: -1})
	resp, err := hs.adm.CommitOffsets(ctx, SinkGroup(name), offs)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	// A member that stays, as a killed worker's consumer does until its
	// session times out.
	assigned := make(chan struct{})
	var once sync.Once
	member, err := kgo.NewClient(kgo.SeedBrokers(hs.seeds...), kgo.ConsumerGroup(SinkGroup(name)), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			once.Do(func() { close(assigned) })
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for !member.PollFetches(ctx).IsClientClosed() && ctx.Err() == nil {
		}
	}()
	select {
	case <-assigned:
	case <-ctx.Done():
		t.Fatal("the member was never assigned")
	}

	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = hs.h.DeleteConnector(dctx, name) // still waiting for the member
	pollUntil(t, "the deletion forgetting the connector", func() bool {
		recs, err := hs.st.Connectors(ctx)
		if err != nil {
			return false
		}
		for _, r := range recs {
			if r.Name == name {
				return false
			}
		}
		return true
	})
	hs.closeFn() // a shutdown while the deletion waits
	member.Close()
	<-polled
	hs.start()

	o, err := hs.adm.FetchOffsets(ctx, SinkGroup(name))
	if err != nil && !isGroupGone(err) {
		t.Fatal(err)
	}
	if len(o) > 0 {
		t.Errorf("offsets of the deleted sink's group after a restart: %v, want none (the deletion completed without its group)", o)
	}
	if c := hs.h.get(name); c != nil {
		t.Errorf("connector %s still known after the restart completed its deletion", name)
	}
}
