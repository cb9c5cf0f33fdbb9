package relay

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestRetryOutcome: an outcome statement whose session was lost (a connection reset while
// its answer was awaited, a terminated backend) runs again until it succeeds or the mark
// timeout ends; an answer of the database (a constraint, a syntax error) and the timeout
// itself are returned at once.
func TestRetryOutcome(t *testing.T) {
	t.Parallel()
	lost := []error{io.ErrUnexpectedEOF, &pgconn.PgError{Code: "57P01"}, errors.New("write tcp: connection reset by peer")}
	for _, first := range lost {
		calls := 0
		n, err := retryOutcome(t.Context(), func() (int64, error) {
			calls++
			if calls < 3 {
				return 0, first
			}
			return 7, nil
		})
		if err != nil || n != 7 || calls != 3 {
			t.Errorf("after %v: %d, %v in %d calls; want 7 after 3", first, n, err, calls)
		}
	}
	for _, answer := range []error{&pgconn.PgError{Code: "23505"}, context.DeadlineExceeded} {
		calls := 0
		_, err := retryOutcome(t.Context(), func() (int64, error) { calls++; return 0, answer })
		if !errors.Is(err, answer) || calls != 1 {
			t.Errorf("%v: %v in %d calls, want it returned after 1", answer, err, calls)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	calls := 0
	if _, err := retryOutcome(ctx, func() (int64, error) { calls++; return 0, io.ErrUnexpectedEOF }); !errors.Is(err, io.ErrUnexpectedEOF) || calls < 2 {
		t.Errorf("a session lost until the timeout: %v in %d calls, want the loss after several", err, calls)
	}
}
