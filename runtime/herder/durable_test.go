package herder

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidyconnect/tidyconnect/internal/testenv"
	"github.com/tidyconnect/tidyconnect/runtime/connect"
	"github.com/tidyconnect/tidyconnect/runtime/internal/sampleconn"
	"github.com/tidyconnect/tidyconnect/runtime/store"
	"github.com/tidyconnect/tidyconnect/runtime/worker"
)

// Environment of the crash child process.
const (
	crashChildEnv = "TIDYCONNECT_HERDER_CRASH_CHILD"
	crashDirEnv   = "TIDYCONNECT_HERDER_CRASH_DIR"
	crashNameEnv  = "TIDYCONNECT_HERDER_CRASH_NAME"
	crashKindEnv  = "TIDYCONNECT_HERDER_CRASH_KIND"
	crashSeedsEnv = "TIDYCONNECT_HERDER_CRASH_SEEDS"
	crashPointEnv = "TIDYCONNECT_HERDER_CRASH_POINT"
)

const crashTasks = 2

// TestMain runs the crash child instead of the tests when the parent test
// started this binary as one, so that no test shows up as skipped.
func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		// testing.Main runs crashChild as a test and exits.
		testing.Main(func(pat, str string) (bool, error) { return regexp.MatchString(pat, str) },
			[]testing.InternalTest{{Name: "CrashChild", F: crashChild}}, nil, nil)
	}
	os.Exit(m.Run())
}

// crashChild is the process the crash test SIGKILLs: it creates a
// connector, deletes it, and kills itself at the hook point.
func crashChild(t *testing.T) {
	point := os.Getenv(crashPointEnv)
	kill := withHook(func(p, _ string) {
		if p == point {
			// Process death: nothing stops gracefully, no deferred code runs.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	})
	var seeds []string
	if s := os.Getenv(crashSeedsEnv); s != "" {
		seeds = strings.Split(s, ",")
	}
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, os.Getenv(crashKindEnv), os.Getenv(crashDirEnv), rec, seeds, kill)
	name := os.Getenv(crashNameEnv)
	if _, err := hs.h.CreateConnector(testCtx(t), name, sourceConfig(name+"-topic", crashTasks), ""); err != nil {
		t.Fatal(err)
	}
	hs.awaitRunning(name, crashTasks)
	err := hs.h.DeleteConnector(testCtx(t), name)
	t.Fatalf("the hook did not kill the process (DeleteConnector: %v)", err)
}

// TestDurableDeletionAfterCrash kills a herder process right after the
// deletion intent was written (and, second case, after the tasks stopped),
// then starts a new herder on the same data directory: it completes the
// deletion with connectorDeleted=true and forgets the connector.
func TestDurableDeletionAfterCrash(t *testing.T) {
	for _, kind := range workerKinds {
		for _, point := range []string{hookIntentWritten, hookTasksStopped} {
			t.Run(kind+"/"+point, func(t *testing.T) {
				dir := t.TempDir()
				name := testenv.Unique("crash-")
				var seeds []string
				if kind == kindReal {
					seeds = testenv.KafkaBrokers(t)
				}
				cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(cctx, os.Args[0], "-test.run=^CrashChild$", "-test.count=1", "-test.v")
				cmd.Env = append(os.Environ(), crashChildEnv+"=1", crashDirEnv+"="+dir, crashNameEnv+"="+name,
					crashKindEnv+"="+kind, crashSeedsEnv+"="+strings.Join(seeds, ","), crashPointEnv+"="+point)
				out, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("child did not die by SIGKILL: %v\n%s", err, out)
				}

				st, err := store.OpenFile(dir)
				if err != nil {
					t.Fatal(err)
				}
				ins, err := st.Intents(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				led, err := st.Ledger(name).List(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Close(); err != nil {
					t.Fatal(err)
				}
				if len(ins) != 1 || ins[0].Connector != name {
					t.Fatalf("intents after the crash = %+v, want the deletion of %s", ins, name)
				}
				if len(led) == 0 && point == hookIntentWritten {
					t.Fatalf("ledger empty after the crash; the test needs owned resources")
				}

				// The external system outlives the process: recreate in the
				// new recorder what the ledger lists.
				rec := sampleconn.NewRecorder()
				for _, r := range led {
					rec.CreateResource(r.Name)
				}
				hs := newHarness(t, kind, dir, rec, seeds)
				hs.dropTopic(name + "-topic") // the child's, committed there
				ctx := testCtx(t)
				if names, err := hs.h.Connectors(ctx); err != nil || slices.Contains(names, name) {
					t.Errorf("connector still listed after recovery: %v (%v)", names, err)
				}
				if _, err := hs.h.ConnectorStatus(ctx, name); !errors.Is(err, ErrNotFound) {
					t.Errorf("status after recovery: %v, want ErrNotFound", err)
				}
				inst := sampleconn.ConnectorInstance(name)
				calls := rec.CallsOf(inst)
				if !slices.Contains(calls, "Stop(true)") || slices.Contains(calls, "Stop(false)") || calls[len(calls)-1] != "Stopped" {
					t.Errorf("recovery instance calls = %v, want Stop(true) only, Stopped last", calls)
				}
				for i := range crashTasks {
					if got := rec.CallsOf(sampleconn.TaskInstance(name, i)); len(got) != 0 {
						t.Errorf("task %d was started during recovery: %v", i, got)
					}
				}
				if res := rec.Resources(); len(res) != 0 {
					t.Errorf("resources left after recovery: %v", res)
				}
				// Each reports how much is left; an error is not "nothing".
				for what, left := range map[string]func() (int, error){
					"intents": func() (int, error) { x, err := hs.st.Intents(ctx); return len(x), err },
					"config": func() (int, error) {
						_, ok, err := hs.st.Connector(ctx, name)
						if ok {
							return 1, err
						}
						return 0, err
					},
					"ledger":  func() (int, error) { x, err := hs.st.Ledger(name).List(ctx); return len(x), err },
					"offsets": func() (int, error) { x, err := hs.st.AllOffsets(ctx, name); return len(x), err },
				} {
					if n, err := left(); err != nil || n != 0 {
						t.Errorf("%s not forgotten after recovery: %d left (%v)", what, n, err)
					}
				}
			})
		}
	}
}

// TestRestartAfterClose: after Close (SIGTERM) and a new herder on the same
// data directory, connectors resume in their target states with their
// resources intact, having received Stop(false) only; sources resume from
// their offsets.
func TestRestartAfterClose(t *testing.T) {
	for _, kind := range workerKinds {
		t.Run(kind, func(t *testing.T) {
			rec := sampleconn.NewRecorder()
			hs := newHarness(t, kind, t.TempDir(), rec, nil)
			ctx := testCtx(t)
			running, paused, stopped := testenv.Unique("run-"), testenv.Unique("pause-"), testenv.Unique("stop-")
			topic := testenv.Unique("t-")
			for name, target := range map[string]worker.TargetState{running: worker.TargetRunning, paused: worker.TargetRunning, stopped: worker.TargetStopped} {
				if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(topic, 1), target); err != nil {
					t.Fatal(err)
				}
			}
			// Paused once running (one created PAUSED starts nothing).
			hs.awaitRunning(paused, 1)
			if err := hs.h.Pause(ctx, paused); err != nil {
				t.Fatal(err)
			}
			hs.awaitRunning(running, 1)
			if kind == kindReal {
				awaitCommitted(t, rec, running, 20)
			}
			resBefore := rec.Resources()
			ledBefore, err := hs.st.Ledger(running).List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			committedBefore := len(rec.Committed(running))

			hs.restart()

			for _, inst := range []string{sampleconn.ConnectorInstance(running), sampleconn.TaskInstance(running, 0), sampleconn.ConnectorInstance(paused), sampleconn.TaskInstance(paused, 0)} {
				got := stopCalls(rec, inst)
				if len(got) == 0 || slices.ContainsFunc(got, func(s string) bool { return s != "Stop(false)" }) {
					t.Errorf("%s got %v at shutdown, want Stop(false) only", inst, got)
				}
			}
			if got := rec.CallsOf(sampleconn.ConnectorInstance(stopped)); len(got) != 0 {
				t.Errorf("a STOPPED connector was started: %v", got)
			}
			hs.awaitRunning(running, 1)
			pollUntil(t, "paused connector PAUSED after restart", func() bool {
				st, err := hs.h.ConnectorStatus(ctx, paused)
				return err == nil && st.Connector.State == worker.StatePaused
			})
			if st, err := hs.h.ConnectorStatus(ctx, stopped); err != nil || st.Connector.State != worker.StateStopped {
				t.Errorf("stopped connector after restart: %+v (%v)", st, err)
			}
			if res := rec.Resources(); !slices.Equal(res, resBefore) {
				t.Errorf("resources after restart = %v, want %v", res, resBefore)
			}
			if led, err := hs.st.Ledger(running).List(ctx); err != nil || !slices.Equal(led, ledBefore) {
				t.Errorf("ledger after restart = %v (%v), want %v", led, err, ledBefore)
			}
			if kind == kindReal {
				awaitCommitted(t, rec, running, committedBefore+10)
				after := rec.Committed(running)[committedBefore]
				if pos, ok := sampleconn.Position(after.SourceOffset); !ok || pos == 0 {
					t.Errorf("source restarted from position %d (%v) instead of its stored offset", pos, after.SourceOffset)
				}
			}
		})
	}
}

func awaitCommitted(t testing.TB, rec *sampleconn.Recorder, name string, n int) {
	t.Helper()
	ctx, cancel := awaitCtx(t)
	defer cancel()
	if err := rec.Await(ctx, func(r *sampleconn.Recorder) bool { return len(r.Committed(name)) >= n }); err != nil {
		t.Fatalf("waiting for %d committed records of %s: %v (got %d)", n, name, err, len(rec.Committed(name)))
	}
}

// TestSourceOffsetsEndpoints: reading works any time; altering and
// resetting only while STOPPED. With the real worker, the resumed task
// continues after the altered offset.
func TestSourceOffsetsEndpoints(t *testing.T) {
	for _, kind := range workerKinds {
		t.Run(kind, func(t *testing.T) {
			rec := sampleconn.NewRecorder()
			hs := newHarness(t, kind, t.TempDir(), rec, nil)
			ctx := testCtx(t)
			name := testenv.Unique("offs-")
			if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(testenv.Unique("t-"), 1), ""); err != nil {
				t.Fatal(err)
			}
			part := map[string]any{"task": "0", "partition": "0"}
			alter := ConnectorOffsets{Offsets: []worker.SourceOffset{{Partition: part, Offset: map[string]any{"position": float64(41)}}}}
			if err := hs.h.AlterOffsets(ctx, name, alter); !errors.Is(err, ErrNotStopped) {
				t.Fatalf("alter while running: %v, want ErrNotStopped", err)
			}
			if err := hs.h.ResetOffsets(ctx, name); !errors.Is(err, ErrNotStopped) {
				t.Fatalf("reset while running: %v, want ErrNotStopped", err)
			}
			if kind == kindReal {
				// Past the altered position, so that a resume from the
				// task's own offset would not look like one from 41.
				awaitCommitted(t, rec, name, 60)
			}
			if err := hs.h.Stop(ctx, name); err != nil {
				t.Fatal(err)
			}
			bad := ConnectorOffsets{Offsets: []worker.SourceOffset{{Partition: nil, Offset: map[string]any{"x": 1}}}}
			var be *BadRequestError
			if err := hs.h.AlterOffsets(ctx, name, bad); !errors.As(err, &be) {
				t.Errorf("alter with an empty partition: %v, want BadRequestError", err)
			}
			if err := hs.h.AlterOffsets(ctx, name, alter); err != nil {
				t.Fatal(err)
			}
			got, err := hs.h.Offsets(ctx, name)
			if err != nil || len(got.Offsets) != 1 || got.Offsets[0].Offset["position"] != int64(41) {
				t.Fatalf("offsets after alter = %+v, %v", got, err)
			}
			committedBefore := len(rec.Committed(name))
			if err := hs.h.Resume(ctx, name); err != nil {
				t.Fatal(err)
			}
			hs.awaitRunning(name, 1)
			if kind == kindReal {
				// Resumed, the task continues after the altered offset.
				awaitCommitted(t, rec, name, committedBefore+1)
				first := rec.Committed(name)[committedBefore]
				if pos, ok := sampleconn.Position(first.SourceOffset); !ok || pos != 42 {
					t.Errorf("first record committed after the resume has offset %v, want position 42 (after the altered 41)", first.SourceOffset)
				}
			}
			if err := hs.h.Stop(ctx, name); err != nil {
				t.Fatal(err)
			}
			if err := hs.h.ResetOffsets(ctx, name); err != nil {
				t.Fatal(err)
			}
			if got, err := hs.h.Offsets(ctx, name); err != nil || len(got.Offsets) != 0 {
				t.Errorf("offsets after reset = %+v (%v)", got, err)
			}
			if _, err := hs.h.Offsets(ctx, "nope"); !errors.Is(err, ErrNotFound) {
				t.Errorf("offsets of an unknown connector: %v", err)
			}
		})
	}
}

// TestSinkOffsetsEndpoints uses the consumer group connect-<name> on Kafka.
func TestSinkOffsetsEndpoints(t *testing.T) {
	rec := sampleconn.NewRecorder()
	seeds := testenv.KafkaBrokers(t)
	hs := &harness{t: t, kind: kindSync, dir: t.TempDir(), rec: rec, reg: testPlugins(t, rec), seeds: seeds}
	hs.adm = newAdmin(t, seeds)
	hs.dropKafkaObjectsAtCleanup()
	hs.start()
	ctx := testCtx(t)
	name := testenv.Unique("sink-")
	topic := testenv.Unique("st-")
	if _, err := hs.adm.CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	hs.dropTopic(topic)
	cfg := connect.Config{KeyConnectorClass: sampleconn.SinkClass, KeyTopics: topic}
	if _, err := hs.h.CreateConnector(ctx, name, cfg, worker.TargetStopped); err != nil {
		t.Fatal(err)
	}
	alter := ConnectorOffsets{Offsets: []worker.SourceOffset{
		{Partition: map[string]any{"kafka_topic": topic, "kafka_partition": float64(0)}, Offset: map[string]any{"kafka_offset": float64(5)}},
		{Partition: map[string]any{"kafka_topic": topic, "kafka_partition": float64(1)}, Offset: map[string]any{"kafka_offset": float64(0)}},
	}}
	if err := hs.h.AlterOffsets(ctx, name, alter); err != nil {
		t.Fatal(err)
	}
	got, err := hs.h.Offsets(ctx, name)
	if err != nil || len(got.Offsets) != 2 || got.Offsets[0].Offset["kafka_offset"] != int64(5) || got.Offsets[0].Partition["kafka_topic"] != topic {
		t.Fatalf("sink offsets = %+v, %v", got, err)
	}
	bad := ConnectorOffsets{Offsets: []worker.SourceOffset{{Partition: map[string]any{"kafka_partition": "x"}, Offset: map[string]any{"kafka_offset": -1}}}}
	var be *BadRequestError
	if err := hs.h.AlterOffsets(ctx, name, bad); !errors.As(err, &be) || !strings.Contains(be.Msg, "kafka_topic") || !strings.Contains(be.Msg, "kafka_partition") || !strings.Contains(be.Msg, "kafka_offset") {
		t.Errorf("bad sink offsets: %v, want a BadRequestError naming every bad field", err)
	}
	if err := hs.h.ResetOffsets(ctx, name); err != nil {
		t.Fatal(err)
	}
	if got, err := hs.h.Offsets(ctx, name); err != nil || len(got.Offsets) != 0 {
		t.Errorf("sink offsets after reset = %+v (%v)", got, err)
	}
	// Deleting the connector deletes the group too (nothing to delete here,
	// which must not fail the deletion).
	if err := hs.h.DeleteConnector(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// TestBlockingStartDoesNotHoldUpARestart: after a restart, a connector whose
// Start blocks neither delays NewStandalone (so REST can answer) nor the
// other connectors; Close interrupts it.
func TestBlockingStartDoesNotHoldUpARestart(t *testing.T) {
	for _, kind := range workerKinds {
		t.Run(kind, func(t *testing.T) {
			rec := sampleconn.NewRecorder()
			dir := t.TempDir()
			hs := newHarness(t, kind, dir, rec, nil, WithDeletionAttemptTimeout(2*time.Second))
			ctx := testCtx(t)
			slow, fine := testenv.Unique("slow-"), testenv.Unique("fine-")
			topic := testenv.Unique("t-")
			if _, err := hs.h.CreateConnector(ctx, slow, sourceConfig(topic, 1, sampleconn.KeyBlockStart, sampleconn.BlockUntilCtx), worker.TargetStopped); err != nil {
				t.Fatal(err)
			}
			if _, err := hs.h.CreateConnector(ctx, fine, sourceConfig(topic, 1), ""); err != nil {
				t.Fatal(err)
			}
			hs.closeFn()
			// As if it had been RUNNING when the worker stopped.
			st, err := store.OpenFile(dir)
			if err != nil {
				t.Fatal(err)
			}
			r, ok, err := st.Connector(ctx, slow)
			if err != nil || !ok {
				t.Fatalf("the stored record of %s: %v %v", slow, ok, err)
			}
			r.Target = worker.TargetRunning
			if err := st.PutConnector(ctx, r); err != nil {
				t.Fatal(err)
			}
			// It owns something (its Start never got that far itself), so a
			// deletion needs a cleanup-only instance.
			owned := rec.CreateResource(sampleconn.ConnectorInstance(slow) + "/r1")
			if err := st.Ledger(slow).Own(ctx, owned); err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}

			hs.start() // returns although slow's Start blocks
			hs.awaitRunning(fine, 1)
			status, err := hs.h.ConnectorStatus(ctx, slow)
			if err != nil || status.Connector.State == worker.StateRunning || status.Connector.State == worker.StateFailed {
				t.Errorf("slow connector while its Start blocks: %+v %v; want neither RUNNING nor FAILED", status, err)
			}
			hs.closeFn() // must interrupt the blocked Start
			if got := rec.CallsOf(sampleconn.ConnectorInstance(slow)); len(got) == 0 || got[len(got)-1] != "Stopped" {
				t.Errorf("slow connector calls = %v, want Stopped last after Close", got)
			}

			// Started again (blocking again), a DELETE interrupts the start
			// instead of waiting for it; the cleanup-only instance's Start
			// blocks too (the system is "unreachable"), so the attempt
			// times out and the failure is visible, not a hang.
			hs.start()
			dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			var de *DeletionError
			if err := hs.h.DeleteConnector(dctx, slow); !errors.As(err, &de) {
				t.Fatalf("deleting a connector whose Start blocks: %v, want a *DeletionError after the attempt timeout", err)
			}
			status, err = hs.h.ConnectorStatus(ctx, slow)
			if err != nil || status.Connector.State != worker.StateFailed || status.Deletion == nil || status.Deletion.Phase != store.PhaseCleanupFailed {
				t.Errorf("after a timed-out deletion attempt: %+v %v", status, err)
			}
		})
	}
}

// TestTopicsPersistedWhenFirstUsed: a topic is in the store as soon as a
// task used it, with no stop and no GET topics (which both persist it), so
// a crash (kill -9 of the worker) does not lose it.
func TestTopicsPersistedWhenFirstUsed(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	name, topic := testenv.Unique("topics-seen-"), testenv.Unique("t-")
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(topic, 1), ""); err != nil {
		t.Fatal(err)
	}
	awaitCommitted(t, rec, name, 5)
	pollUntil(t, "the used topic to be persisted", func() bool {
		got, err := hs.st.Topics(ctx, name)
		return err == nil && slices.Equal(got, []string{topic})
	})
}

// TestTopicsPersistAndReset: the topics a connector used survive a restart
// of the herder; reset clears them.
func TestTopicsPersistAndReset(t *testing.T) {
	rec := sampleconn.NewRecorder()
	hs := newHarness(t, kindReal, t.TempDir(), rec, nil)
	ctx := testCtx(t)
	name, topic := testenv.Unique("topics-"), testenv.Unique("t-")
	if _, err := hs.h.CreateConnector(ctx, name, sourceConfig(topic, 1), ""); err != nil {
		t.Fatal(err)
	}
	awaitCommitted(t, rec, name, 5)
	if got, err := hs.h.Topics(ctx, name); err != nil || !slices.Equal(got, []string{topic}) {
		t.Fatalf("topics = %v, %v; want [%s]", got, err, topic)
	}
	if err := hs.h.Stop(ctx, name); err != nil {
		t.Fatal(err)
	}
	hs.restart()
	if got, err := hs.h.Topics(ctx, name); err != nil || !slices.Equal(got, []string{topic}) {
		t.Errorf("topics after restart = %v (%v), want [%s]", got, err, topic)
	}
	if err := hs.h.ResetTopics(ctx, name); err != nil {
		t.Fatal(err)
	}
	if got, err := hs.h.Topics(ctx, name); err != nil || len(got) != 0 {
		t.Errorf("topics after reset = %v (%v)", got, err)
	}
	if _, err := hs.h.Topics(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("topics of an unknown connector: %v", err)
	}
}
