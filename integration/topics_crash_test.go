package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestSIGKILLKeepsActiveTopics: the topics a connector used are persisted
// as soon as it used them, not only when its tasks stop or GET topics is
// asked: after a SIGKILL the source still lists its topic, although it
// produces nothing after the restart.
func TestSIGKILLKeepsActiveTopics(t *testing.T) {
	c := newChain(t)
	c.deploy()
	col := c.collect(c.queue("customers"))
	s := c.startStream(5 * time.Millisecond)
	s.awaitMore(20)
	s.halt()
	if !eventually(60*time.Second, func() bool { msgs, _ := col.snapshot(); return len(msgs) > 0 }) {
		t.Fatal("no messages arrived")
	}
	// Awaited in the data dir (docs/standalone.md): GET topics would
	// persist them itself.
	topic := c.topic("customers")
	stored := filepath.Join(c.w.dataDir, "connectors", c.src, "topics.json")
	if !eventually(30*time.Second, func() bool {
		b, err := os.ReadFile(stored)
		return err == nil && bytes.Contains(b, []byte(`"`+topic+`"`))
	}) {
		t.Fatalf("%s does not list %s although the source produced to it", stored, topic)
	}
	c.w.kill()
	c.w.restart()
	var got map[string]struct {
		Topics []string `json:"topics"`
	}
	if err := json.Unmarshal(c.api.must("GET", "/connectors/"+c.src+"/topics", nil, 200), &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got[c.src].Topics, topic) {
		t.Errorf("topics of %s after SIGKILL and restart = %v, want %s among them", c.src, got[c.src].Topics, topic)
	}
}
