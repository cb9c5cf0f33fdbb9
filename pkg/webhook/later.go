package webhook

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
)

// Defaults for the webhook's answers to a delivery it cannot apply now.
const (
	// DefaultHandlerTimeout bounds one delivery's handler and inbox transaction: below
	// the receiver's own timeout (the template's ReceiverTimeout, 15 s), so the webhook
	// answers 503 before the function is cut off. QStash delays every delivery to a host
	// after timeouts; an answer, even a failure, does not.
	DefaultHandlerTimeout = 10 * time.Second
	// AnswerMargin is how long before the request's own deadline (a Lambda invocation's)
	// the handler budget ends at the latest, whatever HandlerTimeout says: time to roll
	// back and answer.
	AnswerMargin = time.Second
	// DefaultRetryAfter is the Retry-After of a delivery the webhook could not apply for a
	// reason outside the event: its database unreachable, or the handler over its budget.
	// QStash waits that long instead of its own backoff (12 s, 2.5 min, 30 min), so a
	// lasting outage reaches the failure callback within minutes, which puts the event
	// back in the outbox and opens the topic's circuit (docs/reliability.md).
	DefaultRetryAfter = 30 * time.Second
)

// maxRetryAfter is the longest Retry-After QStash honours (longer ones are ignored and its
// own backoff applies).
const maxRetryAfter = 24 * time.Hour

// Later marks a handler error as "not now": the webhook rolls the delivery back and
// answers 503 with Retry-After: after (whole seconds, rounded up, at most a day), and
// QStash retries it then instead of on its own schedule. Use it when the handler knows
// when to come back: a downstream service rate-limiting you, a dependency in maintenance.
// Like any transient failure it is never dead-lettered: once QStash's retries run out, the
// failure callback puts the event back in the outbox.
func Later(after time.Duration, err error) error {
	if err == nil {
		err = errors.New("handler asked to retry later")
	}
	return &laterError{after: after, err: err}
}

type laterError struct {
	after time.Duration
	err   error
}

func (e *laterError) Error() string { return fmt.Sprintf("retry after %v: %v", e.after, e.err) }
func (e *laterError) Unwrap() error { return e.err }

// The webhook's rows for "not now": 503 with Retry-After.
var (
	replyLater      = receive.Reply{Status: http.StatusServiceUnavailable, Code: "later", Outcome: OutcomeTransient}
	replyDatabase   = receive.Reply{Status: http.StatusServiceUnavailable, Code: "database_unavailable", Outcome: OutcomeTransient}
	replyOverBudget = receive.Reply{Status: http.StatusServiceUnavailable, Code: "handler_timeout", Outcome: OutcomeTransient}
)

// handlerBudget returns ctx bounded by the handler budget: HandlerTimeout, and AnswerMargin
// before ctx's own deadline.
func (h *Handler) handlerBudget(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(h.cfg.HandlerTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-AnswerMargin).Before(deadline) {
		deadline = dl.Add(-AnswerMargin)
	}
	return context.WithDeadline(ctx, deadline)
}

// notNow classifies a transient failure the webhook can say more about: the handler's
// Later, its own database unreachable, or the budget spent while the request was still
// live. It returns the reply, the Retry-After and true, or false for a plain transient
// failure (500, QStash's own backoff).
func notNow(err error, budget, request context.Context) (receive.Reply, time.Duration, bool) {
	var later *laterError
	var connect *pgconn.ConnectError
	switch {
	case errors.As(err, &later):
		return replyLater, later.after, true
	case errors.As(err, &connect):
		return replyDatabase, DefaultRetryAfter, true
	case errors.Is(budget.Err(), context.DeadlineExceeded) && request.Err() == nil:
		return replyOverBudget, DefaultRetryAfter, true
	}
	return receive.Reply{}, 0, false
}

// setRetryAfter writes Retry-After in whole seconds, rounded up, within what QStash honours.
func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	d = min(max(d, 0), maxRetryAfter)
	w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10))
}
