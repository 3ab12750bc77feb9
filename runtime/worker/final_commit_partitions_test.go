package worker

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// TestFinalCommitPassesACreatePastItsRefusedDelete pins the contract a
// source whose change is several records under different keys relies on
// (pgaudit's key change with tombstones: a delete and its tombstone under
// the old key, a create under the new one, on another Kafka partition):
// at a stop the worker commits the create Kafka acknowledged past the
// delete and tombstone Close failed on their partition, and the later
// record of the create's partition with it. The task must not take the
// create alone for its change (pgaudit counts a change's records and
// delivers rows in Poll order).
func TestFinalCommitPassesACreatePastItsRefusedDelete(t *testing.T) {
	task := &commitRecorder{}
	ti := &taskInstance{base: context.Background(), log: slog.New(slog.DiscardHandler)}
	s := &sourceLoop{t: ti, task: task, acked: make(chan struct{}, 1), byPart: map[string][]*pending{},
		offsets: map[string]SourceOffset{}, dirty: map[string]bool{}}
	for _, r := range []struct {
		key  string
		part int32
		err  error
	}{
		{"d 1", 0, kgo.ErrClientClosed}, {"tombstone 1", 0, kgo.ErrClientClosed}, {"c 2", 1, nil}, {"u 2", 1, nil},
	} {
		rec := connect.SourceRecord{Topic: "t", Partition: -1, Key: []byte(r.key),
			SourcePartition: map[string]any{"p": "0"}, SourceOffset: map[string]any{"id": 1}}
		p := &pending{rec: rec, pkey: "k", part: r.part, done: true, err: r.err}
		s.queue = append(s.queue, p)
		s.byPart["k"] = append(s.byPart["k"], p)
	}
	s.acked <- struct{}{}
	_ = s.commitAcked(true)
	var got []string
	for _, batch := range task.got {
		for _, r := range batch {
			got = append(got, string(r.Key))
		}
	}
	if want := []string{"c 2", "u 2"}; !slices.Equal(got, want) {
		t.Fatalf("committed %q, want %q", got, want)
	}
	if off := s.offsets["k"]; off.Offset != nil {
		t.Fatalf("stored offset %v, want none (the partition's first record failed)", off.Offset)
	}
}
