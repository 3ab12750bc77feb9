package herder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// stopCalls returns the Stop(...) calls an instance received.
func stopCalls(rec *sampleconn.Recorder, instance string) []string {
	var out []string
	for _, m := range rec.CallsOf(instance) {
		if strings.HasPrefix(m, "Stop(") {
			out = append(out, m)
		}
	}
	return out
}

// TestConnectorDeletedFlag asserts the connectorDeleted flag every connector
// and task instance receives for each operation: true only for DELETE.
func TestConnectorDeletedFlag(t *testing.T) {
	const tasks = 2
	type want struct {
		connStop  string // "" = no Stop at all, else the only flag value allowed
		taskStops string
	}
	cases := []struct {
		name string
		act  func(t *testing.T, hs *harness, name string)
		want want
	}{
		{"delete", func(t *testing.T, hs *harness, name string) {
			if err := hs.h.DeleteConnector(testCtx(t), name); err != nil {
				t.Fatalf("DeleteConnector: %v", err)
			}
		}, want{"Stop(true)", "Stop(true)"}},
		{"pause", func(t *testing.T, hs *harness, name string) {
			if err := hs.h.Pause(testCtx(t), name); err != nil {
				t.Fatal(err)
			}
			pollUntil(t, "PAUSED", func() bool {
				st, err := hs.h.ConnectorStatus(context.Background(), name)
				return err == nil && st.Connector.State == worker.StatePaused
			})
		}, want{"", ""}},
		{"stop (STOPPED target state)", func(t *testing.T, hs *harness, name string) {
			if err := hs.h.Stop(testCtx(t), name); err != nil {
				t.Fatal(err)
			}
			st, err := hs.h.ConnectorStatus(context.Background(), name)
			if err != nil || st.Connector.State != worker.StateStopped || len(st.Tasks) != 0 {
				t.Errorf("after stop: status %+v (%v), want STOPPED without tasks", st, err)
			}
		}, want{"Stop(false)", "Stop(false)"}},
		{"restart", func(t *testing.T, hs *harness, name string) {
			if _, err := hs.h.Restart(testCtx(t), name, false, false); err != nil {
				t.Fatal(err)
			}
		}, want{"Stop(false)", ""}},
		{"restart with tasks", func(t *testing.T, hs *harness, name string) {
			st, err := hs.h.Restart(testCtx(t), name, true, false)
			if err != nil {
				t.Fatal(err)
			}
			if st.Connector.State != worker.StateRestarting || len(st.Tasks) != tasks || st.Tasks[0].State != worker.StateRestarting {
				t.Errorf("restart status = %+v, want everything RESTARTING", st)
			}
		}, want{"Stop(false)", "Stop(false)"}},
		{"reconfiguration (PUT config)", func(t *testing.T, hs *harness, name string) {
			info, err := hs.h.ConnectorInfo(testCtx(t), name)
			if err != nil {
				t.Fatal(err)
			}
			cfg := info.Config.Clone()
			cfg[sampleconn.KeyRate] = "300"
			if _, created, err := hs.h.PutConnectorConfig(testCtx(t), name, cfg); err != nil || created {
				t.Fatalf("PutConnectorConfig: created=%v err=%v", created, err)
			}
		}, want{"Stop(false)", "Stop(false)"}},
		{"worker shutdown (Close, as on SIGTERM)", func(t *testing.T, hs *harness, name string) {
			hs.closeFn()
		}, want{"Stop(false)", "Stop(false)"}},
	}
	for _, kind := range workerKinds {
		for _, tc := range cases {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				rec := sampleconn.NewRecorder()
				hs := newHarness(t, kind, t.TempDir(), rec, nil)
				name := testenv.Unique("flag-")
				if _, err := hs.h.CreateConnector(testCtx(t), name, sourceConfig(testenv.Unique("t-"), tasks), ""); err != nil {
					t.Fatal(err)
				}
				hs.awaitRunning(name, tasks)
				before := rec.Resources()
				if len(before) != 1+tasks {
					t.Fatalf("resources after start = %v, want one per instance", before)
				}

				tc.act(t, hs, name)

				check := func(inst, allowed string) {
					got := stopCalls(rec, inst)
					if allowed == "" {
						if len(got) != 0 {
							t.Errorf("%s got %v, want no Stop at all", inst, got)
						}
						return
					}
					if len(got) == 0 {
						t.Errorf("%s got no Stop, want %s", inst, allowed)
					}
					for _, g := range got {
						if g != allowed {
							t.Errorf("%s got %s, want only %s (all: %v)", inst, g, allowed, got)
						}
					}
					if allowed != "" && rec.Count(inst+" Stopped") == 0 {
						t.Errorf("%s got Stop but never Stopped", inst)
					}
				}
				check(sampleconn.ConnectorInstance(name), tc.want.connStop)
				for i := 0; i < tasks; i++ {
					check(sampleconn.TaskInstance(name, i), tc.want.taskStops)
				}
				if tc.want.connStop == "Stop(true)" {
					// Every task finished before the connector got Stop(true).
					connStop := rec.Index(sampleconn.ConnectorInstance(name) + " Stop(true)")
					for i := 0; i < tasks; i++ {
						if last := rec.LastIndex(sampleconn.TaskInstance(name, i) + " Stopped"); last < 0 || last > connStop {
							t.Errorf("task %d Stopped at %d, connector Stop(true) at %d: tasks must finish first", i, last, connStop)
						}
					}
					if res := rec.Resources(); len(res) != 0 {
						t.Errorf("resources after delete = %v, want none", res)
					}
					if _, err := hs.h.ConnectorStatus(context.Background(), name); !errors.Is(err, ErrNotFound) {
						t.Errorf("status after delete: %v, want ErrNotFound", err)
					}
					if led, err := hs.st.Ledger(name).List(context.Background()); err != nil || len(led) != 0 {
						t.Errorf("ledger after delete = %v (%v), want empty", led, err)
					}
				} else if res := rec.Resources(); !slices.Equal(res, before) {
					t.Errorf("resources after %s = %v, want unchanged %v", tc.name, res, before)
				}
			})
		}
	}
}

// TestCreateRejectsBadInput: each bad request gets the right error naming
// every bad field, and nothing is persisted or started.
func TestCreateRejectsBadInput(t *testing.T) {
	cases := []struct {
		name     string
		connName string
		cfg      connect.Config
		initial  worker.TargetState
		badReq   string   // substring of a BadRequestError
		fields   []string // keys of a ConfigError
	}{
		{"empty name", "", sourceConfig("t", 1), "", "must not be empty", nil},
		{"blank name", "  ", sourceConfig("t", 1), "", "must not be empty", nil},
		// Other bad names are config errors of "name", named with the rest.
		{"slash in name", "a/b", sourceConfig("t", 1), "", "", []string{KeyName}},
		{"control char in name", "a\nb", sourceConfig("t", 1), "", "", []string{KeyName}},
		{"bad name and bad config", "..", sourceConfig("t", 0), "", "", []string{KeyName, KeyTasksMax}},
		{"bad initial state", "c", sourceConfig("t", 1), "SLEEPING", "initial_state", nil},
		{"unknown class", "c", connect.Config{KeyConnectorClass: "nope.NopeConnector"}, "", "", []string{KeyConnectorClass}},
		{"missing class", "c", connect.Config{"x": "y"}, "", "", []string{KeyConnectorClass}},
		{"every bad field", "c", connect.Config{KeyConnectorClass: sampleconn.SourceClass, KeyTasksMax: "zero", sampleconn.KeyBatch: "0"}, "", "",
			[]string{KeyTasksMax, sampleconn.KeyTopic, sampleconn.KeyBatch}},
		{"tasks.max below 1", "c", sourceConfig("t", 0), "", "", []string{KeyTasksMax}},
		{"sink without topics", "c", connect.Config{KeyConnectorClass: sampleconn.SinkClass}, "", "", []string{KeyTopics, KeyTopicsRegex}},
		{"sink with both", "c", connect.Config{KeyConnectorClass: sampleconn.SinkClass, KeyTopics: "a", KeyTopicsRegex: "b.*"}, "", "", []string{KeyTopics, KeyTopicsRegex}},
		{"name mismatch", "c", sourceConfig("t", 1, KeyName, "other"), "", "", []string{KeyName}},
	}
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindSync, t.TempDir(), rec, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := hs.h.CreateConnector(testCtx(t), tc.connName, tc.cfg, tc.initial)
			var be *BadRequestError
			var ce *ConfigError
			switch {
			case tc.badReq != "":
				if !errors.As(err, &be) || !strings.Contains(be.Msg, tc.badReq) {
					t.Fatalf("err = %v, want BadRequestError containing %q", err, tc.badReq)
				}
			default:
				if !errors.As(err, &ce) {
					t.Fatalf("err = %v, want *ConfigError", err)
				}
				var keys []string
				for k := range ce.Fields {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				want := slices.Sorted(slices.Values(tc.fields))
				if !slices.Equal(keys, want) {
					t.Errorf("bad fields = %v, want %v (%v)", keys, want, ce)
				}
			}
		})
	}
	if recs, err := hs.st.Connectors(context.Background()); err != nil || len(recs) != 0 {
		t.Errorf("persisted after bad requests: %v (%v)", recs, err)
	}
	if calls := rec.Calls(); len(calls) != 0 {
		t.Errorf("instances were started by bad requests: %v", calls)
	}
	if names, err := hs.h.Connectors(context.Background()); err != nil || len(names) != 0 {
		t.Errorf("listed after bad requests: %v (%v)", names, err)
	}
	// The unknown-class message names the available classes.
	_, err := hs.h.CreateConnector(testCtx(t), "c", connect.Config{KeyConnectorClass: "nope"}, "")
	if err == nil || !strings.Contains(err.Error(), sampleconn.SourceClass) || !strings.Contains(err.Error(), sampleconn.SinkClass) {
		t.Errorf("unknown class error %v does not name the available classes", err)
	}
	// A duplicate is refused.
	if _, err := hs.h.CreateConnector(testCtx(t), "dup", sourceConfig("t", 1), worker.TargetStopped); err != nil {
		t.Fatal(err)
	}
	if _, err := hs.h.CreateConnector(testCtx(t), "dup", sourceConfig("t", 1), ""); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("duplicate create: %v, want ErrAlreadyExists", err)
	}
}

func TestInitialStatesAndStatuses(t *testing.T) {
	for _, kind := range workerKinds {
		t.Run(kind, func(t *testing.T) {
			rec := sampleconn.NewRecorder()
			hs := newHarness(t, kind, t.TempDir(), rec, nil, WithWorkerID("test:8083"))
			ctx := testCtx(t)
			topic := testenv.Unique("t-")
			cases := []struct {
				initial worker.TargetState
				cfg     connect.Config
				state   worker.State
				tasks   int
			}{
				{worker.TargetRunning, sourceConfig(topic, 2), worker.StateRunning, 2},
				// Created PAUSED: nothing starts, as in Kafka Connect.
				{worker.TargetPaused, sourceConfig(topic, 1), worker.StatePaused, 0},
				{worker.TargetStopped, sourceConfig(topic, 1), worker.StateStopped, 0},
				{worker.TargetRunning, sourceConfig(topic, 1, sampleconn.KeyFailStart, "true", sampleconn.KeyFailTask, "0"), worker.StateRunning, 1},
			}
			for i, tc := range cases {
				name := fmt.Sprintf("%s-%d", testenv.Unique("st-"), i)
				if _, err := hs.h.CreateConnector(ctx, name, tc.cfg, tc.initial); err != nil {
					t.Fatal(err)
				}
				pollUntil(t, name+" state "+string(tc.state), func() bool {
					st, err := hs.h.ConnectorStatus(ctx, name)
					return err == nil && st.Connector.State == tc.state && len(st.Tasks) == tc.tasks
				})
				st, err := hs.h.ConnectorStatus(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if st.Connector.WorkerID == "" || slices.ContainsFunc(st.Tasks, func(ts TaskStatus) bool { return ts.WorkerID == "" }) {
					t.Errorf("%s: a status without worker_id: %+v", name, st)
				}
			}
			// A task whose Start failed is FAILED with the error as trace,
			// and a task restart brings it back (here: fails again).
			names, err := hs.h.Connectors(ctx)
			if err != nil {
				t.Fatal(err)
			}
			failing := names[slices.IndexFunc(names, func(n string) bool { return strings.HasSuffix(n, "-3") })]
			pollUntil(t, "task FAILED", func() bool {
				ts, err := hs.h.TaskStatus(ctx, worker.TaskID{Connector: failing, Task: 0})
				return err == nil && ts.State == worker.StateFailed && strings.Contains(ts.Trace, "Start failed")
			})
			if _, err := hs.h.TaskStatus(ctx, worker.TaskID{Connector: failing, Task: 7}); !errors.Is(err, ErrNotFound) {
				t.Errorf("unknown task: %v, want ErrNotFound", err)
			}
			// A connector whose Start fails is FAILED, not rejected.
			bad := testenv.Unique("fail-")
			if _, err := hs.h.CreateConnector(ctx, bad, sourceConfig(topic, 1, sampleconn.KeyFailStart, "true"), ""); err != nil {
				t.Fatalf("a Start failure must not fail the create: %v", err)
			}
			pollUntil(t, "connector FAILED", func() bool {
				st, err := hs.h.ConnectorStatus(ctx, bad)
				return err == nil && st.Connector.State == worker.StateFailed && strings.Contains(st.Connector.Trace, "Start failed")
			})
			// Restart with onlyFailed restarts only the failed connector.
			st, err := hs.h.Restart(ctx, bad, true, true)
			if err != nil || st.Connector.State != worker.StateRestarting {
				t.Errorf("restart onlyFailed: %+v %v", st, err)
			}
		})
	}
}

// TestDeleteCleanupFailureThenRetry: a failing cleanup leaves the connector
// visible (FAILED with Deletion) until a retried DELETE succeeds.
func TestDeleteCleanupFailureThenRetry(t *testing.T) {
	for _, kind := range workerKinds {
		t.Run(kind, func(t *testing.T) {
			rec := sampleconn.NewRecorder()
			hs := newHarness(t, kind, t.TempDir(), rec, nil)
			ctx := testCtx(t)
			name := testenv.Unique("flaky-")
			cfg := sourceConfig(testenv.Unique("t-"), 1)
			cfg[KeyConnectorClass] = flakyClass
			if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
				t.Fatal(err)
			}
			hs.awaitRunning(name, 1)
			failCleanup.Store(true)
			t.Cleanup(func() { failCleanup.Store(false) })

			err := hs.h.DeleteConnector(ctx, name)
			var de *DeletionError
			if !errors.As(err, &de) || len(de.Remaining) == 0 {
				t.Fatalf("DeleteConnector with failing cleanup: %v, want *DeletionError with remaining resources", err)
			}
			names, err := hs.h.Connectors(ctx)
			if err != nil || !slices.Contains(names, name) {
				t.Errorf("connector vanished after a failed deletion: %v (%v)", names, err)
			}
			st, err := hs.h.ConnectorStatus(ctx, name)
			if err != nil || st.Connector.State != worker.StateFailed || !strings.Contains(st.Connector.Trace, "cleanup failed") ||
				st.Deletion == nil || st.Deletion.Phase != store.PhaseCleanupFailed || st.Deletion.Attempts != 1 || len(st.Deletion.Remaining) == 0 {
				t.Fatalf("status after failed deletion = %+v (%v)", st, err)
			}
			if err := hs.h.Pause(ctx, name); err == nil {
				t.Errorf("pause during a pending deletion must be refused")
			}
			// The intent survives a restart, and the new herder retries at
			// start-up (still failing: the connector stays visible).
			hs.restart()
			st, err = hs.h.ConnectorStatus(ctx, name)
			if err != nil || st.Deletion == nil || st.Deletion.Attempts != 2 || st.Connector.State != worker.StateFailed {
				t.Fatalf("after restart with failing cleanup: %+v %v", st, err)
			}

			failCleanup.Store(false)
			if err := hs.h.DeleteConnector(ctx, name); err != nil {
				t.Fatalf("retried DeleteConnector: %v", err)
			}
			if _, err := hs.h.ConnectorStatus(ctx, name); !errors.Is(err, ErrNotFound) {
				t.Errorf("after successful retry: %v, want ErrNotFound", err)
			}
			if res := rec.Resources(); len(res) != 0 {
				t.Errorf("resources after successful retry: %v", res)
			}
			if ins, err := hs.st.Intents(ctx); err != nil || len(ins) != 0 {
				t.Errorf("intents left: %v (%v)", ins, err)
			}
			// The retry used a fresh cleanup-only instance that got Stop(true).
			if got := stopCalls(rec, sampleconn.ConnectorInstance(name)); slices.Contains(got, "Stop(false)") {
				t.Errorf("connector got Stop(false) during deletion: %v", got)
			}
		})
	}
}

func TestDeleteBackgroundRetry(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindSync, t.TempDir(), rec, nil, WithDeletionRetry(5_000_000, 20_000_000)) // 5ms..20ms
	ctx := testCtx(t)
	name := testenv.Unique("bg-")
	cfg := sourceConfig("t", 1)
	cfg[KeyConnectorClass] = flakyClass
	if _, err := hs.h.CreateConnector(ctx, name, cfg, ""); err != nil {
		t.Fatal(err)
	}
	failCleanup.Store(true)
	t.Cleanup(func() { failCleanup.Store(false) })
	if err := hs.h.DeleteConnector(ctx, name); err == nil {
		t.Fatal("want a failed deletion")
	}
	pollUntil(t, "a background retry", func() bool {
		st, err := hs.h.ConnectorStatus(ctx, name)
		return err == nil && st.Deletion != nil && st.Deletion.Attempts >= 2
	})
	failCleanup.Store(false)
	pollUntil(t, "the background retry to finish the deletion", func() bool {
		_, err := hs.h.ConnectorStatus(ctx, name)
		return errors.Is(err, ErrNotFound)
	})
	if res := rec.Resources(); len(res) != 0 {
		t.Errorf("resources after background retry: %v", res)
	}
}

// TestStartupCompletesPendingDeletion: an intent found at start-up is
// completed with a cleanup-only instance (Stop(true)) before the connector
// is forgotten.
func TestStartupCompletesPendingDeletion(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rec := sampleconn.NewRecorder()
	name := "pending"
	st, err := store.OpenFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sourceConfig("t", 1)
	cfg[KeyName] = name
	res := rec.CreateResource(sampleconn.ConnectorInstance(name) + "/r1")
	taskRes := rec.CreateResource(sampleconn.TaskInstance(name, 0) + "/r1")
	for _, step := range []error{
		st.PutConnector(ctx, store.ConnectorRecord{Name: name, Config: cfg, Target: worker.TargetRunning, Tasks: []connect.Config{cfg}}),
		st.Ledger(name).Own(ctx, res),
		st.Ledger(name).Own(ctx, taskRes),
		st.Put(ctx, name, []worker.SourceOffset{{Partition: map[string]any{"p": 0}, Offset: map[string]any{"o": 1}}}),
		st.PutIntent(ctx, store.DeletionIntent{Connector: name, Config: cfg, Phase: store.PhaseStoppingTasks, Attempts: 1}),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	st.Close()

	hs := newHarness(t, kindSync, dir, rec, nil)
	if names, err := hs.h.Connectors(ctx); err != nil || len(names) != 0 {
		t.Errorf("connectors after start-up = %v (%v), want the pending deletion completed", names, err)
	}
	inst := sampleconn.ConnectorInstance(name)
	if got := rec.CallsOf(inst); !slices.Equal(got, []string{"Start", "Stop(true)", "Stopped"}) {
		t.Errorf("cleanup instance calls = %v, want Start, Stop(true), Stopped", got)
	}
	if got := rec.CallsOf(sampleconn.TaskInstance(name, 0)); len(got) != 0 {
		t.Errorf("task instance was started during a pending deletion: %v", got)
	}
	if r := rec.Resources(); len(r) != 0 {
		t.Errorf("resources left = %v", r)
	}
	if offs, err := hs.st.AllOffsets(ctx, name); err != nil || len(offs) != 0 {
		t.Errorf("offsets left = %v (%v)", offs, err)
	}
}

func TestMaskingAndUnmask(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindSync, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	cfg := sourceConfig("t", 1, sampleconn.KeyPassword, "s3cret", sampleconn.KeyURL, "postgres://u:pw@h/db", "other.password", "x")
	info, err := hs.h.CreateConnector(ctx, "m", cfg, worker.TargetStopped)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range info.Config {
		if strings.Contains(v, "s3cret") || strings.Contains(v, "pw@") || (k == "other.password" && v == "x") {
			t.Errorf("returned config leaks %s=%s", k, v)
		}
	}
	// Writing the masked config back keeps the secrets.
	if _, _, err := hs.h.PutConnectorConfig(ctx, "m", info.Config); err != nil {
		t.Fatal(err)
	}
	stored, ok, err := hs.st.Connector(ctx, "m")
	if err != nil || !ok {
		t.Fatalf("stored record: %v %v", ok, err)
	}
	if stored.Config[sampleconn.KeyPassword] != "s3cret" || stored.Config[sampleconn.KeyURL] != "postgres://u:pw@h/db" || stored.Config["other.password"] != "x" {
		t.Errorf("secrets overwritten by masks: %v", stored.Config)
	}
	// PATCH with a new secret replaces it; removing a key with nil works.
	np := "new"
	if _, err := hs.h.PatchConnectorConfig(ctx, "m", map[string]*string{sampleconn.KeyPassword: &np, "other.password": nil}); err != nil {
		t.Fatal(err)
	}
	stored, ok, err = hs.st.Connector(ctx, "m")
	if err != nil || !ok {
		t.Fatalf("stored record after PATCH: %v %v", ok, err)
	}
	if stored.Config[sampleconn.KeyPassword] != "new" {
		t.Errorf("patched secret = %q", stored.Config[sampleconn.KeyPassword])
	}
	if _, ok := stored.Config["other.password"]; ok {
		t.Errorf("patch with null did not remove the key")
	}
	if stored.Target != worker.TargetStopped {
		t.Errorf("reconfiguration changed the target state to %s", stored.Target)
	}
}

func TestValidate(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindSync, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	v, err := hs.h.Validate(ctx, sampleconn.SourceClass, connect.Config{sampleconn.KeyPassword: "s3cret", KeyTasksMax: "x"})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]ValidatedKey{}
	for _, k := range v.Configs {
		byName[k.Definition.Name] = k
	}
	if k := byName[sampleconn.KeyPassword]; k.Value == nil || *k.Value != connect.HiddenValue {
		t.Errorf("password value not masked: %+v", k)
	}
	if len(byName[KeyTasksMax].Errors) == 0 || len(byName[sampleconn.KeyTopic].Errors) == 0 {
		t.Errorf("expected errors on tasks.max and sample.topic: %+v", v)
	}
	// name is required too, as in Kafka Connect's validate endpoint.
	if v.ErrorCount != 3 || len(byName[KeyName].Errors) != 1 {
		t.Errorf("ErrorCount = %d, want 3 (name, tasks.max, sample.topic): %+v", v.ErrorCount, v)
	}
	if _, ok := byName[KeyConnectorClass]; !ok || !slices.Contains(v.Groups, commonGroup) {
		t.Errorf("common keys missing from validation: groups %v", v.Groups)
	}
	if _, err := hs.h.Validate(ctx, "nope", nil); err == nil {
		t.Errorf("validate of an unknown class must fail")
	}
	ps, err := hs.h.Plugins(ctx)
	if err != nil || len(ps) != 3 {
		t.Errorf("plugins = %v (%v)", ps, err)
	}
	if _, err := hs.h.PluginConfig(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("PluginConfig(nope) = %v", err)
	}
}

// TestDeleteFromEveryState: whatever state the connector is in, DELETE
// ends with every owned resource dropped by an instance that got Stop(true)
// and no instance getting Stop(false) once the deletion began.
func TestDeleteFromEveryState(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, hs *harness, name string)
		// cleanupOnly: no instance runs, so a fresh cleanup-only one must.
		cleanupOnly bool
	}{
		{"running", func(*testing.T, *harness, string) {}, false},
		{"paused", func(t *testing.T, hs *harness, name string) {
			if err := hs.h.Pause(testCtx(t), name); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"stopped", func(t *testing.T, hs *harness, name string) {
			if err := hs.h.Stop(testCtx(t), name); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"after a restart of the herder", func(t *testing.T, hs *harness, name string) {
			if err := hs.h.Stop(testCtx(t), name); err != nil {
				t.Fatal(err)
			}
			hs.restart()
		}, true},
	}
	for _, kind := range workerKinds {
		for _, tc := range cases {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				rec := sampleconn.NewRecorder()
				hs := newHarness(t, kind, t.TempDir(), rec, nil)
				name := testenv.Unique("del-")
				if _, err := hs.h.CreateConnector(testCtx(t), name, sourceConfig(testenv.Unique("t-"), 2), ""); err != nil {
					t.Fatal(err)
				}
				hs.awaitRunning(name, 2)
				tc.setup(t, hs, name)
				mark := len(rec.Calls())
				if err := hs.h.DeleteConnector(testCtx(t), name); err != nil {
					t.Fatalf("DeleteConnector: %v", err)
				}
				after := rec.Calls()[mark:]
				var connCalls []string
				for _, c := range after {
					if c.Method == "Stop(false)" {
						t.Errorf("%s got Stop(false) during the deletion", c.Instance)
					}
					if c.Instance == sampleconn.ConnectorInstance(name) {
						connCalls = append(connCalls, c.Method)
					}
				}
				want := []string{"Stop(true)", "Stopped"}
				if tc.cleanupOnly {
					want = []string{"Start", "Stop(true)", "Stopped"}
				}
				connCalls = slices.Compact(connCalls) // Stop may repeat
				if !slices.Equal(connCalls, want) {
					t.Errorf("connector calls during deletion = %v, want %v", connCalls, want)
				}
				if res := rec.Resources(); len(res) != 0 {
					t.Errorf("resources left: %v", res)
				}
				if names, err := hs.h.Connectors(testCtx(t)); err != nil || slices.Contains(names, name) {
					t.Errorf("connector still listed: %v (%v)", names, err)
				}
			})
		}
	}
}

// TestDeleteOutlivesItsRequest: when the caller's deadline passes first,
// DeleteConnector returns and the deletion carries on, visible in the
// status, until it completes.
func TestDeleteOutlivesItsRequest(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindSync, t.TempDir(), rec, nil)
	name := testenv.Unique("slow-")
	cfg := sourceConfig("t", 1)
	cfg[KeyConnectorClass] = flakyClass
	if _, err := hs.h.CreateConnector(testCtx(t), name, cfg, ""); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	blockCleanup.Store(&release)
	// Runs before the herder's Close (registered earlier): a test that
	// fails before the release never leaves Stopped blocked.
	t.Cleanup(func() {
		unblock()
		blockCleanup.Store(nil)
	})

	tctx := testCtx(t)
	ctx, cancel := context.WithCancel(tctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- hs.h.DeleteConnector(ctx, name) }()
	pollUntil(t, "the deletion to reach the connector's cleanup", func() bool {
		st, err := hs.h.ConnectorStatus(context.Background(), name)
		return err == nil && st.Deletion != nil && st.Deletion.Phase == store.PhaseStoppingConnector
	})
	cancel() // the REST request's deadline
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "still running") {
			t.Fatalf("DeleteConnector after its ctx ended: %v, want a still-running error", err)
		}
	case <-tctx.Done():
		t.Fatal("DeleteConnector did not return after its ctx ended")
	}
	if st, err := hs.h.ConnectorStatus(context.Background(), name); err != nil || st.Deletion == nil {
		t.Fatalf("status while the deletion carries on: %+v %v", st, err)
	}
	unblock()
	pollUntil(t, "the deletion to finish", func() bool {
		_, err := hs.h.ConnectorStatus(context.Background(), name)
		return errors.Is(err, ErrNotFound)
	})
	if res := rec.Resources(); len(res) != 0 {
		t.Errorf("resources left: %v", res)
	}
}
