package rest_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tidyconnect/tidyconnect/runtime/version"
)

// kcctlVersion parses a version as kcctl does (org.kcctl.util.Version):
// the text split on dots, the first two parts as integers. kcctl gates its
// commands on it: get offsets needs 3.5, delete offsets 3.6, describe
// plugin and listing all plugins 3.2, the topics in describe connector 2.5,
// the expand listing 2.3, cluster-scoped log levels 3.7.
func kcctlVersion(v string) (major, minor int, ok bool) {
	parts := strings.Split(v, ".")
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}

// checkRootVersion asserts that GET / answers, as "version", the Kafka
// Connect release whose REST API is served (every endpoint up to KIP-1017's
// /health, Kafka 3.9), and tidyconnect's own version in an extra field.
func checkRootVersion(t *testing.T, h *harness, ownVersion string) {
	t.Helper()
	var root map[string]string
	res := h.do("GET", "/", "", "")
	if res.Status != 200 {
		t.Fatalf("GET /: status %d, body %s", res.Status, res.Body)
	}
	res.json(t, &root)
	major, minor, ok := kcctlVersion(root["version"])
	if !ok {
		t.Fatalf("GET / version %q is not a Kafka version: kcctl's Version(%q) throws, failing get connectors, describe connector, get offsets, ...", root["version"], root["version"])
	}
	if major < 3 || major == 3 && minor < 9 {
		t.Errorf("GET / version %q is below 3.9: clients gate the endpoints served here (offsets 3.5, stop 3.5, loggers scope 3.7, health 3.9) on it", root["version"])
	}
	if root["tidyconnect_version"] != ownVersion {
		t.Errorf("GET / tidyconnect_version = %q, want %q (the build's own version)", root["tidyconnect_version"], ownVersion)
	}
}

func TestRootAnswersAKafkaConnectVersion(t *testing.T) {
	t.Run("fake herder", func(t *testing.T) {
		f := newFakeHerder()
		setup(f)
		checkRootVersion(t, newFakeHarness(t, f), "0.1.0-test")
	})
	t.Run("standalone herder", func(t *testing.T) {
		e := newE2E(t)
		checkRootVersion(t, e.harness, version.Version)
	})
}

// Kafka Connect 3.x serves GET /connectors/{c}/tasks-config (KIP-661,
// deprecated by KIP-970 in 3.7, removed in 4.0): the task configs keyed by
// ConnectorTaskId's text, "<connector>-<task>".
func TestTasksConfigEndpoint(t *testing.T) {
	f := newFakeHerder()
	setup(f)
	h := newFakeHarness(t, f)
	res := h.do("GET", "/connectors/src/tasks-config", "", "")
	if res.Status != 200 {
		t.Fatalf("GET /connectors/src/tasks-config: status %d, body %s", res.Status, res.Body)
	}
	jsonEqual(t, res.Body, `{"src-0":{"task.id":"0","db.password":"[hidden]"},"src-1":{"task.id":"1","db.password":"[hidden]"}}`)

	res = h.do("GET", "/connectors/nope/tasks-config", "", "")
	if res.Status != 404 {
		t.Fatalf("GET /connectors/nope/tasks-config: status %d, want 404; body %s", res.Status, res.Body)
	}

	e := newE2E(t)
	e.expect("POST", "/connectors", `{"name":"tc","config":{"connector.class":"sample-source","tasks.max":"2","sample.topic":"t"}}`, 201)
	var byTask map[string]map[string]string
	e.expect("GET", "/connectors/tc/tasks-config", "", 200).json(t, &byTask)
	if len(byTask) != 2 || byTask["tc-0"]["sample.task.id"] != "0" || byTask["tc-1"]["sample.task.id"] != "1" {
		t.Errorf("tasks-config = %v, want tc-0 and tc-1 with their task configs", byTask)
	}
	e.expect("PUT", "/connectors/tc/stop", "", 204)
	if res := e.expect("GET", "/connectors/tc/tasks-config", "", 200); strings.TrimSpace(string(res.Body)) != "{}" {
		t.Errorf("tasks-config of a stopped connector = %s, want {}", res.Body)
	}
}
