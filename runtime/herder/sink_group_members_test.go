package herder

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// goneMember joins group as a consumer of topic that then never heartbeats
// (a worker killed with its consumer in the group), commits an offset and
// returns: the group keeps the member until its 60 s session times out.
func goneMember(t *testing.T, ctx context.Context, cl *kgo.Client, group, topic string, topicID [16]byte) {
	t.Helper()
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.ProtocolType = group, "consumer"
	join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = 60000, 60000
	proto := kmsg.NewJoinGroupRequestProtocol()
	proto.Name, proto.Metadata = "range", meta.AppendTo(nil)
	join.Protocols = append(join.Protocols, proto)
	var joined *kmsg.JoinGroupResponse
	for range 3 { // the first join of a new member is answered with its id (MEMBER_ID_REQUIRED)
		resp, err := join.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if errors.Is(kerr.ErrorForCode(resp.ErrorCode), kerr.MemberIDRequired) {
			join.MemberID = resp.MemberID
			continue
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			t.Fatalf("joining: %v", err)
		}
		joined = resp
		break
	}
	if joined == nil {
		t.Fatal("never joined")
	}
	assignment := kmsg.NewConsumerMemberAssignment()
	part := kmsg.NewConsumerMemberAssignmentTopic()
	part.Topic, part.Partitions = topic, []int32{0}
	assignment.Topics = append(assignment.Topics, part)
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.Generation, sync.MemberID = group, joined.Generation, joined.MemberID
	sa := kmsg.NewSyncGroupRequestGroupAssignment()
	sa.MemberID, sa.MemberAssignment = joined.MemberID, assignment.AppendTo(nil)
	sync.GroupAssignment = append(sync.GroupAssignment, sa)
	if resp, err := sync.RequestWith(ctx, cl); err != nil || resp.ErrorCode != 0 {
		t.Fatalf("syncing: %v %v", err, kerr.ErrorForCode(resp.ErrorCode))
	}
	commit := kmsg.NewPtrOffsetCommitRequest()
	commit.Group, commit.Generation, commit.MemberID = group, joined.Generation, joined.MemberID
	ct := kmsg.NewOffsetCommitRequestTopic()
	ct.Topic, ct.TopicID = topic, topicID
	cp := kmsg.NewOffsetCommitRequestTopicPartition()
	cp.Partition, cp.Offset = 0, 1
	ct.Partitions = append(ct.Partitions, cp)
	commit.Topics = append(commit.Topics, ct)
	resp, err := commit.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].Partitions[0].ErrorCode); err != nil {
		t.Fatalf("committing: %v", err)
	}
}

// A deleted sink's consumer group that still holds a gone consumer (its
// session not yet timed out) is emptied and deleted at once when the
// herder has a Kafka client: the deletion removes the member rather than
// wait out the session. Without the client it waits, and gives up at its
// bound with the group still there.
func TestDeletionRemovesGoneSinkGroupMembers(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic = "records"
	created, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		kafka    *kgo.Client
		wait     time.Duration
		wantGone bool
	}{
		{"without a Kafka client", nil, time.Second, false},
		{"with a Kafka client", cl, 25 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := SinkGroup("sink-" + tc.name)
			goneMember(t, ctx, cl, group, topic, created.ID)
			h := &Standalone{adm: adm, kafka: tc.kafka}
			began := time.Now()
			err := h.dropSinkGroupOnceEmpty(ctx, group, tc.wait)
			offsets, ferr := adm.FetchOffsets(ctx, group)
			if ferr != nil && !isGroupGone(ferr) {
				t.Fatal(ferr)
			}
			committed := 0
			offsets.Each(func(kadm.OffsetResponse) { committed++ })
			if !tc.wantGone {
				if !errors.Is(err, errGroupHasMembers) || committed == 0 {
					t.Fatalf("err %v, %d committed offsets left: want the group, with its member and offsets, kept", err, committed)
				}
				return
			}
			if err != nil {
				t.Fatalf("deleting the group: %v", err)
			}
			if committed != 0 {
				t.Errorf("%d committed offsets left in %s", committed, group)
			}
			if took := time.Since(began); took > 10*time.Second {
				t.Errorf("took %v: the member was waited out, not removed", took.Round(time.Millisecond))
			}
		})
	}
}
