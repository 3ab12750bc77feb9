// Package integration holds the end-to-end tests of tidyconnect: the compose
// file check (no Docker engine needed) and the full chain PostgreSQL ->
// pgaudit -> Kafka -> amqpsink -> RabbitMQ driven through the REST API of the
// built tidyconnect binary, run as a subprocess so SIGTERM and SIGKILL are
// real.
//
// Services come from internal/testenv: TIDYCONNECT_TEST_POSTGRES_URL,
// TIDYCONNECT_TEST_RABBITMQ_URL and (optionally) TIDYCONNECT_TEST_KAFKA_BROKERS;
// without them the chain tests use testcontainers when a Docker engine answers
// and skip otherwise. Kafka is the worker's embedded broker unless a broker
// is named.
package integration
