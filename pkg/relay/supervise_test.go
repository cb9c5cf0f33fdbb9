package relay_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
)

// TestSuperviseReplacesDeadAndFailedRuns: the first run dies mid-publish (Goexit, holding
// its lease), the second fails (its publisher's context is never usable: the relay's
// database is closed), and the third, a fresh relay, drains everything. Supervise reports
// each run and returns nil once stopped.
func TestSuperviseReplacesDeadAndFailedRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	seed(t, db, 50, func(i int) string { return "k" })

	closed := pgtest.New(t)
	closed.Pool.Close()

	var (
		mu   sync.Mutex
		errs []error
	)
	stop, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- relay.Supervise(stop, func(run int) (*relay.Relay, error) {
			switch run {
			case 0:
				return newRelay(t, db, relay.PublisherFunc(func(context.Context, []outbox.Message) []publish.Result { runtime.Goexit(); return nil }),
					relay.Config{Lease: 2 * time.Second, PublishTimeout: time.Second, MarkTimeout: 500 * time.Millisecond, PollInterval: 10 * time.Millisecond}), nil
			case 1:
				return newRelay(t, closed, &fakePublisher{}, relay.Config{PollInterval: 10 * time.Millisecond}), nil
			default:
				return newRelay(t, db, &fakePublisher{}, relay.Config{PollInterval: 10 * time.Millisecond}), nil
			}
		}, relay.SuperviseConfig{RestartMin: 10 * time.Millisecond, RestartMax: 20 * time.Millisecond, OnRun: func(_ relay.Stats, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}})
	}()

	testwait.EventuallyNil(t, 30*time.Second, func() error {
		if s := states(t, db); s.dispatched < 50 {
			return fmt.Errorf("not drained after the dead and failed runs: %+v", s)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Supervise returned %v after stop", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) < 2 || !errors.Is(errs[0], relay.ErrRunDied) || errs[1] == nil || errors.Is(errs[1], relay.ErrRunDied) {
		t.Fatalf("runs reported %v; want ErrRunDied, then a database error", errs)
	}
}

// TestSuperviseReturnsNextError: a relay that cannot be built stops the supervisor.
func TestSuperviseReturnsNextError(t *testing.T) {
	t.Parallel()
	want := errors.New("bad config")
	err := relay.Supervise(t.Context(), func(int) (*relay.Relay, error) { return nil, want }, relay.SuperviseConfig{})
	if !errors.Is(err, want) {
		t.Fatalf("got %v, want %v", err, want)
	}
}
