// Package testenv finds the services integration tests run against.
//
// An environment variable wins (CI sets them to the machine's services);
// otherwise, when a Docker engine answers, testcontainers starts the service
// once per test binary; otherwise the test is skipped with a message naming
// the variable to set. Kafka is the in-process kfake broker unless
// TIDYCONNECT_TEST_KAFKA_BROKERS names a real one.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcrabbitmq "github.com/testcontainers/testcontainers-go/modules/rabbitmq"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Environment variables naming the services.
const (
	PostgresEnv = "TIDYCONNECT_TEST_POSTGRES_URL"
	RabbitMQEnv = "TIDYCONNECT_TEST_RABBITMQ_URL"
	KafkaEnv    = "TIDYCONNECT_TEST_KAFKA_BROKERS"
	// RequireEnv, when set to 1, turns a missing service into a failure
	// instead of a skip: CI sets it so integration tests can never pass by
	// not running.
	RequireEnv = "TIDYCONNECT_TEST_REQUIRE_SERVICES"
)

var (
	pgOnce sync.Once
	pgURL  string
	pgErr  error

	rmqOnce sync.Once
	rmqURL  string
	rmqErr  error
)

// PostgresURL returns a PostgreSQL URL for the test, or skips it.
func PostgresURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(PostgresEnv); u != "" {
		return u
	}
	requireDocker(t, PostgresEnv)
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
			tcpostgres.WithDatabase("test"), tcpostgres.WithUsername("postgres"),
			tcpostgres.WithPassword("postgres"), tcpostgres.BasicWaitStrategies(),
			// pgaudit's two-phase commit test prepares transactions.
			testcontainers.WithCmdArgs("-c", "max_prepared_transactions=16", "-c", "wal_level=logical"))
		if err != nil {
			pgErr = err
			return
		}
		pgURL, pgErr = c.ConnectionString(ctx, "sslmode=disable")
	})
	if pgErr != nil {
		t.Fatalf("starting PostgreSQL with testcontainers (set %s to use a running server instead): %v", PostgresEnv, pgErr)
	}
	return pgURL
}

// RabbitMQURL returns an AMQP URL for the test, or skips it.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(RabbitMQEnv); u != "" {
		return u
	}
	requireDocker(t, RabbitMQEnv)
	rmqOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c, err := tcrabbitmq.Run(ctx, "rabbitmq:3.13-management-alpine")
		if err != nil {
			rmqErr = err
			return
		}
		rmqURL, rmqErr = c.AmqpURL(ctx)
	})
	if rmqErr != nil {
		t.Fatalf("starting RabbitMQ with testcontainers (set %s to use a running broker instead): %v", RabbitMQEnv, rmqErr)
	}
	return rmqURL
}

// KafkaBrokers returns seed brokers for the test: the real ones named by
// TIDYCONNECT_TEST_KAFKA_BROKERS, or a fresh in-process kfake cluster that is
// shut down when the test ends.
func KafkaBrokers(t testing.TB, opts ...kfake.Opt) []string {
	t.Helper()
	if s := os.Getenv(KafkaEnv); s != "" {
		return strings.Split(s, ",")
	}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation()}, opts...)...)
	if err != nil {
		t.Fatalf("starting the in-process kfake broker: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// Unique returns prefix followed by a random suffix, for names of schemas,
// queues, topics and connectors that must not collide between tests.
func Unique(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Skip skips a test that cannot run here (a missing tool, a service it
// cannot reach in the way it needs), unless TIDYCONNECT_TEST_REQUIRE_SERVICES
// is 1: then it fails, so CI never passes a test by not running it.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("cannot run and %s=1: "+format, append([]any{RequireEnv}, args...)...)
	}
	t.Skipf(format, args...)
}

var (
	dockerOnce sync.Once
	dockerOK   bool
)

func requireDocker(t testing.TB, env string) {
	t.Helper()
	dockerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			return
		}
		defer p.Close()
		dockerOK = p.Health(ctx) == nil
	})
	if !dockerOK {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("no service for this integration test and %s=1: set %s", RequireEnv, env)
		}
		t.Skipf("no service for this integration test: set %s (or run where a Docker engine is available for testcontainers)", env)
	}
}
