package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// While a topic's creation is retried (its brokers' controller does not
// answer; produce still works), the records already acknowledged on other
// topics are committed, as they are while Poll blocks: the loop used to
// wait in the retries, so a consume-and-delete source kept them (and the
// offsets stayed behind) for as long as the creation failed.
func TestSourceTopicCreationRetriesCommitAcknowledged(t *testing.T) {
	// Restored after the worker's Close (cleanups run last first).
	was := topicAttemptTimeout
	t.Cleanup(func() { topicAttemptTimeout = was })
	topicAttemptTimeout = time.Second
	const hold = 2 * time.Second // a stalled creation outlasts its attempt
	const known, stalled = "topic-wait-commit-a", "topic-wait-commit-b"
	pe := newScripted(t, func(ctx context.Context, n int) ([]connect.SourceRecord, error) {
		switch n {
		case 0:
			return []connect.SourceRecord{rec(known, 0, 10)}, nil
		case 1:
			return []connect.SourceRecord{rec(known, 1, 10), rec(stalled, 2, 10)}, nil
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}, nil)
	end := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(end) }) })
	pe.c.ControlKey(int16(kmsg.CreateTopics), func(req kmsg.Request) (kmsg.Response, error, bool) {
		pe.c.KeepControl()
		for _, tp := range req.(*kmsg.CreateTopicsRequest).Topics {
			if tp.Topic == stalled {
				pe.c.SleepControl(func() {
					select {
					case <-end:
					case <-time.After(hold):
					}
				})
			}
		}
		return nil, nil, false
	})
	pe.start()
	deadline := time.Now().Add(8 * time.Second)
	for len(pe.task.Committed()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the 2 acknowledged records of %s committed while %s's creation is retried", len(pe.task.Committed()), known, stalled)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := pe.lastStatus(); s.State != StateRunning {
		t.Errorf("while the creation is retried the task is %v (%s), want RUNNING", s.State, s.Trace)
	}
	once.Do(func() { close(end) })
}
