package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
)

// A topics.regex sink whose consumer group holds committed offsets on a
// topic the regex matches only in part warns, naming that topic: an earlier
// version matched the regex anywhere in the name and consumed it, and after
// an upgrade the sink stops delivering its records while its status stays
// RUNNING. A topic the regex matches whole is not named.
func TestTopicsRegexWarnsAboutTopicsNoLongerMatched(t *testing.T) {
	var logs testenv.SyncBuffer
	e := newEnv(t, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	name, prefix := testenv.Unique("rxold-"), testenv.Unique("rxo")
	produce(t, e.brokers, prefix+"-ab", 2, func(i int) string { return fmt.Sprint("ab", i) })
	produce(t, e.brokers, prefix+"-a", 2, func(i int) string { return fmt.Sprint("a", i) })

	// What the earlier version left: the group consumed both topics.
	commitAsEarlierVersion(t, e.brokers, groupID(name), prefix+"-ab", prefix+"-a")

	cfg := sinkConfig(name, "")
	delete(cfg, KeyTopics)
	cfg[KeyTopicsRegex] = prefix + "-a"
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	e.await("the warning about "+prefix+"-ab", func() bool {
		return strings.Contains(logs.String(), "no longer matches topics this connector consumed before")
	})
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "no longer matches topics") {
			line = l
		}
	}
	if !strings.Contains(line, "topics=["+prefix+"-ab]") || !strings.Contains(line, "suggested=") {
		t.Errorf("warning %q, want it to name only %s-ab and suggest a pattern", line, prefix)
	}
}

// The pattern the warning suggests must be one a PUT of the config accepts:
// with a dead letter queue topic the regex matches only in part (orders and
// orders-dlq), .*(?:orders).* matches the DLQ too, and validation refuses a
// topics.regex that matches the DLQ. The suggestion keeps the topics named,
// the ones the regex matches whole, and not the DLQ.
func TestTopicsRegexWarningSuggestsAValidPattern(t *testing.T) {
	var logs testenv.SyncBuffer
	e := newEnv(t, WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	name, prefix := testenv.Unique("rxdlq-"), testenv.Unique("rxd")
	produce(t, e.brokers, prefix+"-ab", 2, func(i int) string { return fmt.Sprint("ab", i) })
	produce(t, e.brokers, prefix+"-a", 2, func(i int) string { return fmt.Sprint("a", i) })
	commitAsEarlierVersion(t, e.brokers, groupID(name), prefix+"-ab")

	cfg := sinkConfig(name, "", KeyErrorsTolerance, "all", KeyDLQTopic, prefix+"-a-dlq")
	delete(cfg, KeyTopics)
	cfg[KeyTopicsRegex] = prefix + "-a"
	if errs := ValidateCommon(connect.TypeSink, cfg); len(errs) > 0 {
		t.Fatalf("the config itself is refused: %v", errs)
	}
	if _, err := e.startTask(cfg, 0); err != nil {
		t.Fatal(err)
	}
	const msg = "no longer matches topics this connector consumed before"
	e.await("the warning", func() bool { return strings.Contains(logs.String(), msg) })
	var warning struct {
		Topics    []string `json:"topics"`
		Suggested string   `json:"suggested"`
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, msg) {
			if err := json.Unmarshal([]byte(l), &warning); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !slices.Equal(warning.Topics, []string{prefix + "-ab"}) {
		t.Errorf("topics named %v, want [%s-ab]", warning.Topics, prefix)
	}
	fixed := cfg.Clone()
	fixed[KeyTopicsRegex] = warning.Suggested
	if errs := ValidateCommon(connect.TypeSink, fixed); len(errs) > 0 {
		t.Errorf("the suggested topics.regex %q is refused: %v", warning.Suggested, errs)
	}
	re := regexp.MustCompile(anchoredRegex(warning.Suggested))
	for _, topic := range []string{prefix + "-ab", prefix + "-a"} {
		if !re.MatchString(topic) {
			t.Errorf("the suggested topics.regex %q does not match %s", warning.Suggested, topic)
		}
	}
}

// commitAsEarlierVersion commits offset 1 of partition 0 of each topic for
// group, as a sink of an earlier version that consumed them left it.
func commitAsEarlierVersion(t *testing.T, brokers []string, group string, topics ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var offs kadm.Offsets
	for _, topic := range topics {
		offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 1, LeaderEpoch: -1})
	}
	resp, err := kadm.NewClient(cl).CommitOffsets(ctx, group, offs)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("committing the earlier version's offsets: %v", err)
	}
}
