package herder

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/store"
)

// gatedTopicsStore counts AddTopics calls and holds the first one until
// release is closed.
type gatedTopicsStore struct {
	*store.File
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *gatedTopicsStore) AddTopics(ctx context.Context, connector string, topics []string) error {
	if s.calls.Add(1) == 1 {
		close(s.entered)
		<-s.release
	}
	return s.File.AddTopics(ctx, connector, topics)
}

// TestTopicSeenBurstCoalesced: a sink that is assigned many topics at once
// (a topics.regex sink finding its topics, say) has the active topics
// persisted once per wave, not once per topic: each first use started a
// goroutine of its own that waited for the connector's lock and wrote the
// topics again, so while the lock was held (here by a slow write; a stop
// or a blocked Start alike) they piled up, one per topic.
func TestTopicSeenBurstCoalesced(t *testing.T) {
	rec := sampleconn.NewRecorder()
	seeds := testenv.KafkaBrokers(t)
	gs := &gatedTopicsStore{entered: make(chan struct{}), release: make(chan struct{})}
	hs := &harness{t: t, kind: kindReal, dir: t.TempDir(), rec: rec, reg: testPlugins(t, rec), seeds: seeds}
	hs.extra = []Option{func(h *Standalone) { gs.File = hs.st; h.store = gs }}
	hs.dropKafkaObjectsAtCleanup()
	hs.start()
	release := func() { gs.once.Do(func() { close(gs.release) }) }
	t.Cleanup(release) // before the herder's Close (cleanups run last first)
	ctx := testCtx(t)
	const n = 20
	prefix := testenv.Unique("burst-")
	var topics []string
	for i := range n {
		topics = append(topics, prefix+"-"+itoa(i))
	}
	if _, err := hs.adm.CreateTopics(ctx, 1, 1, nil, topics...); err != nil {
		t.Fatal(err)
	}
	hs.dropTopic(topics...)
	name := testenv.Unique("burst-sink-")
	if _, err := hs.h.CreateConnector(ctx, name, connect.Config{KeyConnectorClass: sampleconn.SinkClass, KeyTopics: strings.Join(topics, ",")}, ""); err != nil {
		t.Fatal(err)
	}
	slices.Sort(topics)
	pollUntil(t, "every topic used and a topics write under way", func() bool {
		select {
		case <-gs.entered:
		default:
			return false
		}
		return slices.Equal(hs.h.w.Topics(name), topics)
	})
	release()
	pollUntil(t, "the topics persisted", func() bool {
		got, err := hs.st.Topics(ctx, name)
		return err == nil && slices.Equal(got, topics)
	})
	hs.h.bgWG.Wait() // every topicSeen goroutine has finished
	if got := gs.calls.Load(); got > 2 {
		t.Errorf("the active topics were written %d times for %d topics first used at once, want at most 2 (the write under way and one after it)", got, n)
	}
}
