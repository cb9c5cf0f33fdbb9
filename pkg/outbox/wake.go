package outbox

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Waker wakes the relay after a commit: package kick's *Kicker (an asynchronous Lambda
// invoke, coalesced). Kick must return at once and cannot fail: the events are committed,
// and the relay's schedule delivers them if the wake-up is lost.
type Waker interface {
	Kick()
}

// BeginFunc runs fn in a transaction on db (*pgxpool.Pool, *pgx.Conn), as pgx.BeginFunc
// does (commit when fn returns nil, roll back otherwise), and after the commit calls
// w.Kick, so the relay Lambda wakes at once instead of at its next scheduled tick. The
// kick is never on the commit path: it happens after the commit returned and does not
// wait for the network. A rolled back or failed transaction kicks nothing. w may be nil.
//
// A caller that manages its own transaction calls w.Kick after its Commit returned nil,
// and so does one that enqueues on a pool outside any transaction (each statement
// commits by itself). A commit whose outcome is unknown (the connection broke during
// COMMIT) returns an error and kicks nothing; if it did commit, the schedule delivers its
// events.
func BeginFunc(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, w Waker, fn func(pgx.Tx) error) error {
	if err := pgx.BeginFunc(ctx, db, fn); err != nil {
		return err
	}
	if w != nil {
		w.Kick()
	}
	return nil
}
