// Command amqptool is the demo script's RabbitMQ helper for stacks without
// the management HTTP API (e.g. a plain RabbitMQ on the host): it declares a
// queue, reads messages, and deletes a queue the demo created itself.
//
//	go run ./scripts/amqptool -url amqp://guest:guest@localhost:5672/ declare demo.preexisting quorum
//	go run ./scripts/amqptool -url ... get demo.shop.customers 10 5s
//	go run ./scripts/amqptool -url ... delete demo.preexisting
//
// get prints one message body per line and exits 0 even when fewer messages
// than asked arrived before the timeout (the caller checks what it got).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url := flag.String("url", os.Getenv("DEMO_RABBITMQ_URL"), "AMQP URL (default $DEMO_RABBITMQ_URL)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: amqptool -url URL declare QUEUE [quorum|classic] | get QUEUE [N] [TIMEOUT] | delete QUEUE")
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *url, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "amqptool:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url string, args []string) error {
	if url == "" || len(args) < 2 {
		flag.Usage()
		return errors.New("an AMQP URL (-url or DEMO_RABBITMQ_URL), a command and a queue name are required")
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connecting to RabbitMQ (check the URL and that the broker runs): %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel: %w", err)
	}
	defer ch.Close()

	cmd, queue := args[0], args[1]
	switch cmd {
	case "declare":
		typ := "quorum"
		if len(args) > 2 {
			typ = args[2]
		}
		_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": typ})
		if err != nil {
			return fmt.Errorf("declaring queue %s: %w", queue, err)
		}
		return nil
	case "delete":
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			return fmt.Errorf("deleting queue %s: %w", queue, err)
		}
		return nil
	case "get":
		n, timeout := 10, 5*time.Second
		if len(args) > 2 {
			if n, err = strconv.Atoi(args[2]); err != nil || n < 1 {
				return fmt.Errorf("get: N must be a positive integer, got %q", args[2])
			}
		}
		if len(args) > 3 {
			if timeout, err = time.ParseDuration(args[3]); err != nil {
				return fmt.Errorf("get: TIMEOUT must be a duration like 5s: %w", err)
			}
		}
		return get(ctx, ch, queue, n, timeout)
	default:
		flag.Usage()
		return fmt.Errorf("unknown command %q", cmd)
	}
}

func get(ctx context.Context, ch *amqp.Channel, queue string, n int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for got := 0; got < n; {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return fmt.Errorf("reading from queue %s: %w", queue, err)
		}
		if ok {
			fmt.Println(string(d.Body))
			got++
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}
