// Package deadletter owns the dead_letters table: it records QStash failure callbacks as
// dead letters (CallbackHandler, Record), lists and shows them (List, Get), and redrives
// them (Redrive): their outbox rows go back to pending with a new deduplication generation.
// Dead letters written by the relay (source "relay") are redriven the same way.
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/tracing"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

// Sources of a dead letter.
const (
	SourceRelay    = "relay"    // the relay gave up publishing
	SourceDelivery = "delivery" // QStash gave up delivering (failure callback)
)

// Resolutions of a letter.
const (
	// ResolutionRedriven: Redrive reset the letter's outbox row to pending.
	ResolutionRedriven = "redriven"
	// ResolutionSuperseded: the letter is about an event generation its outbox row has left
	// behind (the event was redriven since): it is history, not work. Record and Sync store
	// such a letter resolved; Redrive resolves one found open and leaves its row alone.
	ResolutionSuperseded = "superseded"
)

// Letter is one dead_letters row.
type Letter struct {
	ID     int64  `json:"id"`
	Source string `json:"source"`
	// OutboxID is the event's outbox row, 0 when unknown.
	OutboxID     outbox.ID `json:"outbox_id,omitempty"`
	Topic        string    `json:"topic,omitempty"`
	PartitionKey string    `json:"partition_key,omitempty"`
	// Payload is the event's JSON (nil when unknown).
	Payload json.RawMessage `json:"payload"`
	// Headers are the event's forwarded headers.
	Headers map[string]string `json:"headers,omitempty"`
	Error   string            `json:"error"`
	// Attempts is the relay's attempt count or QStash's retries; 0 when unknown.
	Attempts int `json:"attempts"`
	// StatusCode is the last HTTP status (QStash's or the destination's); 0 when none.
	StatusCode      int    `json:"status_code,omitempty"`
	QStashMessageID string `json:"qstash_message_id,omitempty"`
	QStashDLQID     string `json:"qstash_dlq_id,omitempty"`
	// ResponseBody is the destination's last response body (delivery letters).
	ResponseBody string    `json:"response_body,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	// ResolvedAt is nil while the letter is open.
	ResolvedAt *time.Time `json:"resolved_at"`
	Resolution string     `json:"resolution,omitempty"`
	// Fingerprint names the letter's failure group (see Group).
	Fingerprint string `json:"fingerprint"`
}

// Resolved reports whether the letter was resolved.
func (l Letter) Resolved() bool { return l.ResolvedAt != nil }

// Filter selects dead letters. Set criteria are ANDed.
type Filter struct {
	// IDs selects these letters. Letters named by id match even when resolved, so
	// Redrive can report them as already resolved.
	IDs          []int64
	Topic        string
	PartitionKey string
	// Fingerprint selects one failure group (Group.Fingerprint; ValidFingerprint).
	Fingerprint string
	// Since (inclusive) and Until (exclusive) bound created_at; zero means unbounded.
	Since, Until time.Time
	// All must be set to select without any criterion: Redrive refuses an empty filter
	// otherwise, so a forgotten flag does not redrive everything. List ignores it.
	All bool
	// IncludeResolved makes List (and criteria other than IDs) match resolved letters too.
	IncludeResolved bool
	// Limit caps List (default DefaultListLimit). Redrive ignores it.
	Limit int
}

// DefaultListLimit is List's default Limit.
const DefaultListLimit = 100

// ErrEmptyFilter is returned by Redrive and Plan for a filter without criteria or All.
var ErrEmptyFilter = errors.New("dead letter filter selects nothing specific; name ids, a group, a topic, a key, a time range, or set All")

// ErrNotFound is returned by Get for an unknown id.
var ErrNotFound = errors.New("dead letter not found")

func (f Filter) empty() bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.PartitionKey == "" && f.Fingerprint == "" &&
		f.Since.IsZero() && f.Until.IsZero()
}

func (f Filter) args() []any {
	var ids []int64
	if len(f.IDs) > 0 {
		ids = f.IDs
	}
	null := postgres.NullIfZero[string]
	return []any{ids, null(f.Topic), null(f.PartitionKey), postgres.NullIfZero(f.Since), postgres.NullIfZero(f.Until),
		f.IncludeResolved || len(f.IDs) > 0, null(f.Fingerprint)}
}

// Querier runs queries: pgx.Tx, *pgx.Conn and *pgxpool.Pool satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// List returns letters matching f, newest first. Without IncludeResolved only open
// letters are listed (letters named in IDs are listed either way).
func List(ctx context.Context, db Querier, f Filter) ([]Letter, error) {
	return listLimited(ctx, db, f, qList, "list dead letters", scanLetter)
}

// listLimited runs sql, a listing over f's criteria (args) and a limit, with f.Limit
// (default DefaultListLimit), and reads each row with scan; what names it in errors.
func listLimited[T any](ctx context.Context, db Querier, f Filter, sql, what string, scan pgx.RowToFunc[T]) ([]T, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	rows, err := db.Query(ctx, sql, append(f.args(), limit)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// Get returns one letter, or an error wrapping ErrNotFound.
func Get(ctx context.Context, db Querier, id int64) (Letter, error) {
	rows, err := db.Query(ctx, qGet, id)
	if err != nil {
		return Letter{}, fmt.Errorf("get dead letter %d: %w", id, err)
	}
	l, err := pgx.CollectExactlyOneRow(rows, scanLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return Letter{}, fmt.Errorf("get dead letter %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Letter{}, fmt.Errorf("get dead letter %d: %w", id, err)
	}
	return l, nil
}

func scanLetter(row pgx.CollectableRow) (Letter, error) {
	var (
		l                Letter
		outboxID         *outbox.ID
		payload, headers *string
		attempts, status *int32
	)
	err := row.Scan(&l.ID, &l.Source, &outboxID, &l.Topic, &l.PartitionKey, &payload, &headers,
		&l.Error, &attempts, &status, &l.QStashMessageID, &l.QStashDLQID, &l.ResponseBody,
		&l.CreatedAt, &l.ResolvedAt, &l.Resolution, &l.Fingerprint)
	if err != nil {
		return Letter{}, err
	}
	if outboxID != nil {
		l.OutboxID = *outboxID
	}
	if payload != nil {
		l.Payload = json.RawMessage(*payload)
	}
	if headers != nil {
		// Headers are a JSON object of strings when written by this project; anything
		// else written by hand is kept out rather than failing the whole listing.
		_ = json.Unmarshal([]byte(*headers), &l.Headers)
	}
	if attempts != nil {
		l.Attempts = int(*attempts)
	}
	if status != nil {
		l.StatusCode = int(*status)
	}
	return l, nil
}

// RedriveResult says what Redrive did (or, from Plan, would do) with each matching letter.
type RedriveResult struct {
	// Redriven letters were resolved and their outbox rows reset to pending.
	Redriven []Redriven `json:"redriven"`
	// AlreadyPending letters were resolved, but their outbox row was already pending
	// (redriven before, or still being relayed), so it was left alone.
	AlreadyPending []Redriven `json:"already_pending"`
	// AlreadyResolved letters (named by id) were resolved before: nothing was done.
	AlreadyResolved []int64 `json:"already_resolved"`
	// Superseded letters are about an event generation their outbox row has left behind
	// (the event was redriven since): they were resolved as superseded and their row left
	// alone, whatever its state (a newer generation may have been delivered). Generation
	// is the row's current generation.
	Superseded []Redriven `json:"superseded"`
	// OutboxMissing letters have no outbox row any more (deleted by retention, or never
	// known): they stay open; redeliver them by hand from their payload.
	OutboxMissing []int64 `json:"outbox_missing"`
	// NotFound ids named in the filter do not exist.
	NotFound []int64 `json:"not_found"`
	// DryRun is true for a Plan.
	DryRun bool `json:"dry_run"`
}

// Redriven pairs a letter with its outbox row.
type Redriven struct {
	LetterID int64     `json:"letter_id"`
	OutboxID outbox.ID `json:"outbox_id"`
	// Generation is the outbox row's generation after the redrive (unchanged for
	// AlreadyPending and in a Plan).
	Generation int `json:"generation"`
}

// Plan reports what Redrive(ctx, db, f, nil) would do, without changing anything.
func Plan(ctx context.Context, db Querier, f Filter) (RedriveResult, error) {
	if f.empty() && !f.All {
		return RedriveResult{}, ErrEmptyFilter
	}
	rows, err := db.Query(ctx, qSelectForRedrive, f.args()...)
	if err != nil {
		return RedriveResult{}, fmt.Errorf("plan redrive: %w", err)
	}
	res, _, err := classify(rows, f.IDs)
	if err != nil {
		return RedriveResult{}, fmt.Errorf("plan redrive: %w", err)
	}
	res.DryRun = true
	return res, nil
}

// Redrive resolves every matching open letter and resets its outbox row to pending
// (attempts 0, available now, lease cleared, last_error cleared, generation+1 so the
// QStash deduplication id changes), all in one transaction of four statements however
// many letters match. Letters already resolved, letters whose outbox row is gone, and
// unknown ids are reported in the result, not treated as errors. A letter about a
// generation its row has left behind never resets the row: it is resolved as superseded. The consumer still
// dedupes on the outbox id, so an event that was in fact processed is not applied twice.
// With a tracer (nil: none), the redrive is a span of tr linked to the producer span of
// every redriven event (the traceparent in its letter's headers), so an event's trace leads
// to the redrive that sent it again.
func Redrive(ctx context.Context, db Beginner, f Filter, tr trace.Tracer) (RedriveResult, error) {
	if f.empty() && !f.All {
		return RedriveResult{}, ErrEmptyFilter
	}
	if tr == nil {
		return redrive(ctx, db, f, nil)
	}
	ctx, span := tr.Start(ctx, "redrive dead letters", trace.WithAttributes(
		attribute.String("outbox.dead_letter.filter.topic", f.Topic),
		attribute.Int("outbox.dead_letter.filter.ids", len(f.IDs)),
		attribute.Bool("outbox.dead_letter.filter.all", f.All)))
	defer span.End()
	res, err := redrive(ctx, db, f, span)
	if err != nil {
		span.SetStatus(codes.Error, "redrive rolled back")
		return res, err
	}
	span.SetAttributes(
		attribute.Int("outbox.dead_letter.redriven", len(res.Redriven)),
		attribute.Int("outbox.dead_letter.already_pending", len(res.AlreadyPending)),
		attribute.Int("outbox.dead_letter.already_resolved", len(res.AlreadyResolved)),
		attribute.Int("outbox.dead_letter.superseded", len(res.Superseded)),
		attribute.Int("outbox.dead_letter.outbox_missing", len(res.OutboxMissing)),
		attribute.Int("outbox.dead_letter.not_found", len(res.NotFound)))
	return res, nil
}

// redrive is Redrive; span, when set, gets a link per redriven event's producer span.
func redrive(ctx context.Context, db Beginner, f Filter, span trace.Span) (RedriveResult, error) {
	var res RedriveResult
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, qSelectForRedrive+qLockSuffix, f.args()...)
		if err != nil {
			return fmt.Errorf("select dead letters: %w", err)
		}
		var finished resets
		res, finished, err = classify(rows, f.IDs)
		if err != nil {
			return fmt.Errorf("select dead letters: %w", err)
		}
		if len(res.Redriven) == 0 && len(res.AlreadyPending) == 0 && len(res.Superseded) == 0 {
			return nil
		}
		rows, err = tx.Query(ctx, qResetOutbox, finished.outboxIDs, finished.generations)
		if err != nil {
			return fmt.Errorf("reset outbox rows: %w", err)
		}
		gens := map[int64]int{}
		var id int64
		var gen int32
		if _, err := pgx.ForEachRow(rows, []any{&id, &gen}, func() error { gens[id] = int(gen); return nil }); err != nil {
			return fmt.Errorf("reset outbox rows: %w", err)
		}
		// A letter whose row the reset skipped (it became pending meanwhile) is reported as
		// already pending; two letters of one row both report the row's new generation.
		var redriven, pending []Redriven
		for _, r := range append(res.Redriven, res.AlreadyPending...) {
			if g, ok := gens[int64(r.OutboxID)]; ok {
				r.Generation = g
				redriven = append(redriven, r)
			} else {
				pending = append(pending, r)
			}
		}
		res.Redriven, res.AlreadyPending = redriven, pending

		var ids []int64
		var resolutions []string
		for _, r := range append(redriven, pending...) {
			ids, resolutions = append(ids, r.LetterID), append(resolutions, ResolutionRedriven)
		}
		for _, r := range res.Superseded {
			ids, resolutions = append(ids, r.LetterID), append(resolutions, ResolutionSuperseded)
		}
		if _, err := tx.Exec(ctx, qResolve, ids, resolutions); err != nil {
			return fmt.Errorf("resolve dead letters: %w", err)
		}
		if span != nil && len(redriven) > 0 {
			return linkProducers(ctx, tx, span, redriven)
		}
		return nil
	})
	if err != nil {
		return RedriveResult{}, fmt.Errorf("redrive dead letters: %w", err)
	}
	return res, nil
}

// linkProducers links span to the producer span of each redriven letter's event.
func linkProducers(ctx context.Context, tx pgx.Tx, span trace.Span, redriven []Redriven) error {
	ids := make([]int64, len(redriven))
	for i, r := range redriven {
		ids[i] = r.LetterID
	}
	rows, err := tx.Query(ctx, qLetterHeaders, ids)
	if err != nil {
		return fmt.Errorf("read redriven letters' headers: %w", err)
	}
	var raw *string
	_, err = pgx.ForEachRow(rows, []any{&raw}, func() error {
		var h map[string]string
		if raw != nil && json.Unmarshal([]byte(*raw), &h) == nil {
			if l, ok := tracing.Link(h); ok {
				span.AddLink(l)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read redriven letters' headers: %w", err)
	}
	return nil
}

// resets are the outbox rows a redrive resets, each with the generation of the letter
// that asked for it (qResetOutbox's arguments).
type resets struct {
	outboxIDs   []int64
	generations []int32
}

// classify sorts the rows of qSelectForRedrive into a result; the Generation fields are
// left 0, except the superseded letters' (their row's current generation). It also returns
// the finished rows to reset.
func classify(rows pgx.Rows, requested []int64) (RedriveResult, resets, error) {
	var (
		res                  RedriveResult
		finished             resets
		queued               = map[outbox.ID]bool{}
		seen                 = map[int64]bool{}
		id                   int64
		outboxID             *outbox.ID
		resolved, exists     bool
		superseded, pending  bool
		letterGen, outboxGen int32
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &outboxID, &resolved, &exists, &superseded, &pending, &letterGen, &outboxGen}, func() error {
		seen[id] = true
		switch {
		case resolved:
			res.AlreadyResolved = append(res.AlreadyResolved, id)
		case !exists:
			res.OutboxMissing = append(res.OutboxMissing, id)
		case superseded:
			res.Superseded = append(res.Superseded, Redriven{LetterID: id, OutboxID: *outboxID, Generation: int(outboxGen)})
		case pending:
			res.AlreadyPending = append(res.AlreadyPending, Redriven{LetterID: id, OutboxID: *outboxID})
		default:
			res.Redriven = append(res.Redriven, Redriven{LetterID: id, OutboxID: *outboxID})
			if !queued[*outboxID] {
				queued[*outboxID] = true
				finished.outboxIDs = append(finished.outboxIDs, int64(*outboxID))
				finished.generations = append(finished.generations, letterGen)
			}
		}
		return nil
	})
	if err != nil {
		return RedriveResult{}, resets{}, err
	}
	for _, want := range requested {
		if !seen[want] {
			seen[want] = true // report a repeated id once
			res.NotFound = append(res.NotFound, want)
		}
	}
	return res, finished, nil
}

// isDataError reports a Postgres data exception (class 22), e.g. invalid JSON text.
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && len(pgErr.Code) == 5 && pgErr.Code[:2] == "22"
}
