package outboxstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPromises: the database has no outbox_relay_awake table (before migration 0022).
// Kickers then send every kick, and a relay drains without promising.
var ErrNoPromises = errors.New("no outbox_relay_awake table: run migrate up (0022)")

// Promises of a claim to come (migration 0022, package kick). Durations are passed in
// microseconds and every instant is the database's clock, so relay and producers never
// compare their own clocks with each other's.
const (
	// qPromise writes a relay's promise and drops promises that ended a minute ago
	// (a relay that died holding one).
	qPromise = `
WITH gone AS (
    DELETE FROM outbox_relay_awake WHERE until < clock_timestamp() - interval '1 minute'
)
INSERT INTO outbox_relay_awake (token, until)
VALUES (gen_random_uuid(), clock_timestamp() + $1 * interval '1 microsecond')
RETURNING token::text`
	qKeepPromise = `UPDATE outbox_relay_awake SET until = greatest(until, clock_timestamp() + $2 * interval '1 microsecond') WHERE token = $1::uuid`
	// qEndPromise deletes the promise and says how long it still runs.
	qEndPromise = `
DELETE FROM outbox_relay_awake WHERE token = $1::uuid
RETURNING (extract(epoch FROM greatest(until - clock_timestamp(), interval '0')) * 1e6)::bigint`
)

// Promise writes a promise that a claim of this relay starts after d from now, and
// returns its token.
func (s *Store) Promise(ctx context.Context, d time.Duration) (string, error) {
	var token string
	if err := s.db.QueryRow(ctx, qPromise, d.Microseconds()).Scan(&token); err != nil {
		return "", promiseErr("promise a claim", err)
	}
	return token, nil
}

// KeepPromise moves the promise's end to d from now (never earlier than it was).
func (s *Store) KeepPromise(ctx context.Context, token string, d time.Duration) error {
	_, err := s.exec(ctx, qKeepPromise, token, d.Microseconds())
	return promiseErr("keep the promise of a claim", err)
}

// EndPromise deletes the promise and returns how long it still runs: a claim that starts
// after that keeps it.
func (s *Store) EndPromise(ctx context.Context, token string) (time.Duration, error) {
	var left int64
	err := s.db.QueryRow(ctx, qEndPromise, token).Scan(&left)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, promiseErr("end the promise of a claim", err)
	}
	return time.Duration(left) * time.Microsecond, nil
}

func promiseErr(what string, err error) error { return tableErr(what, err, ErrNoPromises) }
