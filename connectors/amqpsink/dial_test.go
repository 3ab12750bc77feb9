package amqpsink

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// A broker that accepts the TCP connection but never answers the AMQP
// handshake holds dial only until its context ends (a Stop, a shutdown),
// not for the whole 15 s handshake bound.
func TestDialHonoursItsContextDuringTheHandshake(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	}()
	s, err := parse(baseConfig(t, "amqp://guest:guest@"+ln.Addr().String()+"/", "t"), "dial-test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		conn, err := dial(ctx, s, "dial-test")
		if conn != nil {
			conn.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("dial: %v, want it interrupted by its context", err)
		}
	case <-time.After(10 * time.Second): // far below the 15 s handshake bound, far above 300 ms
		t.Fatal("dial waited for the handshake after its context ended")
	}
}
