package integration

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// TestEmbeddedBrokerSIGKILLKeepsSinkOffsetsGone: a sink's consumer group
// (its offsets) that a DELETE of the connector or DELETE .../offsets
// removed stays removed when the worker is SIGKILLed afterwards. The
// embedded broker logged the offsets but not the group's deletion, so the
// offsets came back after the crash: a sink re-created under the name, or
// the reset one, resumed where the old one had stopped and never delivered
// the records before.
func TestEmbeddedBrokerSIGKILLKeepsSinkOffsetsGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove func(c *chain) // the sink is STOPPED, with offsets committed
	}{
		{"delete and re-create", func(c *chain) {
			c.api.delete(c.sink)
			c.w.kill()
			c.w.restart()
			c.api.must(http.MethodPost, "/connectors",
				map[string]any{"name": c.sink, "config": c.sinkConfig(), "initial_state": "STOPPED"}, http.StatusCreated)
		}},
		{"reset offsets", func(c *chain) {
			c.api.must(http.MethodDelete, "/connectors/"+c.sink+"/offsets", nil, http.StatusOK)
			c.w.kill()
			c.w.restart()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChain(t, true)
			c.deploy()
			col := c.collect(c.queue("customers"))
			s := c.startStream(5 * time.Millisecond)
			s.awaitMore(20)
			s.halt()
			if !eventually(60*time.Second, func() bool { msgs, _ := col.snapshot(); return len(msgs) > 0 }) {
				t.Fatal("no messages arrived")
			}
			// A stop commits the offsets of what was delivered.
			c.api.must(http.MethodPut, "/connectors/"+c.sink+"/stop", nil, http.StatusNoContent)
			if n, _ := sinkOffsets(c); n == 0 {
				t.Fatal("the stopped sink has no committed offsets")
			}
			tc.remove(c)
			if n, body := sinkOffsets(c); n != 0 {
				t.Errorf("offsets of %s after SIGKILL and restart = %s, want none", c.sink, body)
			}
		})
	}
}

// sinkOffsets returns how many offsets GET .../offsets lists, and the body.
func sinkOffsets(c *chain) (int, string) {
	c.t.Helper()
	var got struct {
		Offsets []json.RawMessage `json:"offsets"`
	}
	b := c.api.must(http.MethodGet, "/connectors/"+c.sink+"/offsets", nil, http.StatusOK)
	if err := json.Unmarshal(b, &got); err != nil {
		c.t.Fatalf("GET /connectors/%s/offsets: %v (%s)", c.sink, err, b)
	}
	return len(got.Offsets), string(b)
}
