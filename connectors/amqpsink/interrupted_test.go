package amqpsink

import (
	"context"
	"errors"
	"testing"
)

// interrupted tells a stop from the caller's cancellation. Stop closes
// stopCh and only then does guard cancel the call's context, so a stopped
// task can meet a context that is live, or one whose cause is not (yet)
// errStopping: both are a stop, and Put returns nil for it. This is the
// state TestStopInterruptsWaitForConfirms hit now and then under load
// ("context canceled" from a Put that Stop interrupted).
func TestInterruptedTellsAStopFromTheCaller(t *testing.T) {
	other := errors.New("publish failed")
	tests := []struct {
		name    string
		stopped bool
		ctx     func() context.Context
		err     error
		want    error
	}{
		{"stop before guard cancelled the call", true, context.Background, errStopping, nil},
		{"stop, call cancelled without the stop as cause", true, func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, context.Canceled, nil},
		{"stop, guard cancelled the call", true, func() context.Context {
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(errStopping)
			return ctx
		}, context.Canceled, nil},
		{"caller cancelled (a pause)", false, func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, errStopping, context.Canceled},
		{"other error", false, context.Background, other, other},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := &Task{stopCh: make(chan struct{})}
			if tt.stopped {
				close(task.stopCh)
			}
			if got := task.interrupted(tt.ctx(), tt.err); !errors.Is(got, tt.want) || (tt.want == nil && got != nil) {
				t.Errorf("interrupted = %v, want %v", got, tt.want)
			}
		})
	}
}
