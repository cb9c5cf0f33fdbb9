// Package outboxstore runs the relay's statements on the outbox table: claim a batch under
// a lease, then mark, reschedule, dead-letter or release it, every statement after the
// claim fenced by the lease token. Producers never need it (package outbox is theirs); the
// relay engine and the benchmarks that measure its SQL use it.
package outboxstore

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// Store runs the relay's statements on the outbox table. Every statement after Claim is
// fenced by the claim's lease token: a relay whose lease expired (and whose rows another
// relay claimed since) changes nothing, and the returned count says so.
//
// On a *pgxpool.Pool each statement is bounded on the server by its context's deadline
// and run once more on a live connection when it never ran (a session the server ended,
// a connection refused): see statement.go. An error of a statement that ran out of time
// wraps ErrTimeout.
type Store struct {
	db outbox.Querier
	// window is the next claim's window (0: the batch size), learned from the last claim.
	window atomic.Int64
	// rows is the next claim's row limit (0: the batch size), learned from the last claim
	// the byte budget cut (see Claim).
	rows atomic.Int64
	// textPerStored is the payloads' text size per stored byte (math.Float64bits; 0:
	// not yet learned), learned from the last claim (see Claim).
	textPerStored atomic.Uint64
	// walks bounds the claim's index walks (walk.go).
	walks walks
	// pre0020Until: until this instant (unix nanoseconds) the claim runs qClaimPre0020,
	// the schema having no relay_deaths column when it last looked (giveback.go).
	pre0020Until atomic.Int64
}

// NewStore returns a Store over db (a *pgxpool.Pool in practice).
func NewStore(db outbox.Querier) *Store { return &Store{db: db} }

// Lease identifies one claim. Token is fresh per claim.
type Lease struct {
	Token pgtype.UUID
}

// NewLease returns a lease with a random token.
func NewLease() (Lease, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Lease{}, fmt.Errorf("generate lease token: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return Lease{Token: pgtype.UUID{Bytes: b, Valid: true}}, nil
}

// String returns the token in canonical UUID form, for logs.
func (l Lease) String() string {
	b := l.Token.Bytes
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Claimed is what one claim leased.
type Claimed struct {
	// Messages are the leased rows, sorted by id.
	Messages []outbox.Message
	// Undecodable are leased rows that must not be published, sorted by id, each with the
	// reason: rows that cannot become an outbox.Message (headers that are not a JSON object
	// of string values, written around Enqueue), payloads over ClaimRequest.MaxEventBytes,
	// and rows the relay died holding ClaimRequest.MaxDeaths times. The caller
	// dead-letters them under the same lease, so one bad row never holds the rest of the
	// batch.
	Undecodable []Failure
	// More is true when rows beyond what was looked at may be ready: the caller should
	// claim again even if the batch was short.
	More bool
	// Window is how many ready rows the claim looked at, at most (see Claim).
	Window int
	// Bytes is the size of the leased payloads as the caller holds them (the sum of
	// len(Payload), undecodable rows included).
	Bytes int64
	// BytesCut is true when the byte budget left out rows the claim had chosen (see
	// Claim); More is then true as well.
	BytesCut bool
	// Isolated is true when the claim holds alone a row whose last claim died holding it,
	// or stopped before one (see Claim); More is then true as well. BytesCut is then
	// false: memory did not shape the batch.
	Isolated bool
	// Deaths is the most times in a row a relay died holding one of the leased rows, the
	// death this claim found included (0 on a schema without migration 0020). A row
	// claimed with Deaths one short of ClaimRequest.MaxDeaths is dead-lettered if this
	// process dies too: the caller publishes it with no other batch in flight, so that no
	// other row dies with it.
	Deaths int
}

// Len is the number of rows the claim leased.
func (c Claimed) Len() int { return len(c.Messages) + len(c.Undecodable) }

// ErrBadHeaders is the reason a row whose headers are not a JSON object of string values
// cannot be published.
var ErrBadHeaders = errors.New("headers must be a JSON object of string values")

// ClaimRequest is what one claim asks for.
type ClaimRequest struct {
	// Lease is the claim's token; every later statement on its rows is fenced by it.
	Lease Lease
	// Rows is the most rows to lease (the batch size, n below).
	Rows int
	// KeyRun is the caller's number of batches in flight (see Claim).
	KeyRun int
	// MaxBytes is the payload budget of the batch (see Claim); 0 or less: none.
	MaxBytes int64
	// MaxEventBytes is the largest payload the caller can hold (0 or less: any); a
	// larger one is returned in Undecodable, its payload never copied, for the caller to
	// dead-letter: publishing it could kill the process, and every process after it.
	MaxEventBytes int64
	// MaxDeaths: a row whose claims ended without an outcome this many times in a row
	// (its relay died holding it) is returned in Undecodable, its payload never copied.
	// 0: DefaultMaxDeaths.
	MaxDeaths int
	// For is how long the lease lasts.
	For time.Duration
	// Now overrides the database clock (tests); nil in production.
	Now *time.Time
}

// Claim leases up to r.Rows ready rows for r.For, and no more rows than fit in r.MaxBytes
// of payload (at least one, so an event larger than the budget still moves). Rows are
// eligible under the per-key FIFO rule documented on qClaim. r.KeyRun is the caller's
// number of batches in flight: a key gets up to KeyRun of its
// events in this batch even when the batch has room for one from every key (qClaim's
// lim), so the next claims find keys that are not held. A row is decoded on its own:
// one that cannot be decoded is returned in Undecodable, never as an error, because the
// lease is already taken and an error would leave the whole batch leased.
//
// The window is how many ready rows the claim looks at; each costs one index probe (its
// key's head), and a head probe walks past the index entries of the key's dispatched
// events until vacuum removes them. n rows always suffice: keys that repeat in the window
// are filled up from their runs (measured: a window of 2n cost a third more per claim for
// no larger batches). When keys have backlogs, far fewer do: a batch of 1,000 over 1,000
// keys with runs of 8 takes its rows from the first ~130 keys. So after a full batch that
// needed at most a quarter of its window (keys_end), the next claim looks at twice what
// it needed; after any other, at n again. A window that turns out too small costs one
// short batch, which says More. Keys with one or two events each never shrink it, so
// their batches are never cut short.
//
// The statement counts bytes as Postgres stores the payload (pg_column_size: known
// without reading a TOASTed value), not as the caller receives it (its JSON text, which
// Postgres would have to render for every chosen row to measure: 3.3 ms per 400 kB row
// on the dev machine). The two differ both ways: a 116-byte order event is 164 bytes of
// jsonb, and 400 kB of JSON order lines compressed to 202 kB, repeated line items to
// 4 kB. So the store learns the text size per stored byte from each claim's rows and
// turns maxBytes into stored bytes with it; the first claim of a process assumes the
// compression of repetitive JSON (coldTextPerStored). That only spares the wire: the
// budget itself is kept on the text as the rows arrive, one at a time, a payload's size
// read before it is copied (pgx holds one row at a time). A row whose payload would take
// the kept bytes over maxBytes (never the first) is given back, with every later row of
// its key, under the same lease and without counting an attempt (Release). So a claim
// holds at most maxBytes of payload, or its first row alone, whatever the payloads'
// compression, on the first claim of a cold process too. A batch the budget cut says
// More, and the next claim chooses only twice the rows the budget let through (not n
// that it would lock and leave), until a claim is not cut.
//
// A row that a claim died holding (its lease ended with no outcome) is claimed alone
// (qClaim's suspects), and after r.MaxDeaths such deaths in a row it is returned in
// Undecodable to be dead-lettered, as is a payload over r.MaxEventBytes: neither is ever
// retried into the same death.
func (s *Store) Claim(ctx context.Context, r ClaimRequest) (Claimed, error) {
	lease, n, keyRun, d, now := r.Lease, r.Rows, r.KeyRun, r.For, r.Now
	maxBytes := r.MaxBytes
	if maxBytes <= 0 {
		maxBytes = math.MaxInt64
	}
	limit := n
	if rows := int(s.rows.Load()); rows > 0 && rows < n {
		limit = rows
	}
	window := limit
	if w := int(s.window.Load()); w > 0 && w < limit {
		window = w
	}
	budget := storedBudget(maxBytes, math.Float64frombits(s.textPerStored.Load()))
	wp, claimNo := s.walks.next(time.Now(), now)
	if !wp.probeBelow.IsZero() {
		s.startProbe(wp.probeBelow, now)
	}
	rows, err := s.claimQuery(ctx, claimArgs(limit, lease.Token, now, d, window, max(keyRun, 1), budget, wp))
	if err != nil {
		return Claimed{}, fmt.Errorf("claim outbox batch: %w", err)
	}
	c := Claimed{Messages: make([]outbox.Message, 0, limit), Window: window}
	cut := byteCut{max: maxBytes}
	seen, err := readClaim(rows, r, &c, &cut)
	if err != nil {
		return Claimed{}, fmt.Errorf("claim outbox batch: %w", err)
	}
	c.BytesCut = c.BytesCut && !c.Isolated
	if c.Len() > 0 {
		s.walks.offer(claimNo, wp, seen.view)
	}
	c.Bytes -= cut.settle(&c)
	if len(cut.back) > 0 {
		// Given back now rather than left to the lease: the rows are ready again at once,
		// and a lease left to run out would count as a death (qClaim's suspects). If this
		// fails they come back when the lease ends.
		_, _ = s.Release(ctx, lease, cut.back, now)
		c.BytesCut = true
	}

	slices.SortFunc(c.Messages, func(a, b outbox.Message) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(c.Undecodable, func(a, b Failure) int { return cmp.Compare(a.ID, b.ID) })
	c.More = c.Len() == limit || len(cut.back) > 0 || (c.Len() > 0 && (seen.windowRows >= int64(window) || seen.runCut || c.BytesCut || c.Isolated))
	s.learn(c, limit, seen)
	return c, nil
}

// claimSeen is what a claim's rows say beyond the rows themselves.
type claimSeen struct {
	windowRows, keysEnd, storedSum int64
	runCut                         bool
	view                           walkView
}

// readClaim reads a claim's rows into c one at a time, keeping a payload only while the
// batch fits cut (see byteCut) and refusing, unread, a row over r.MaxEventBytes or one
// its relays died holding r.MaxDeaths times; it closes rows.
func readClaim(rows pgx.Rows, r ClaimRequest, c *Claimed, cut *byteCut) (claimSeen, error) {
	defer rows.Close()
	maxDeaths := int32(cmp.Or(r.MaxDeaths, DefaultMaxDeaths))
	var seen claimSeen
	var stored int64
	var deaths pgtype.Int4
	var headers []byte
	for rows.Next() {
		// Scanned in place: a local Message would escape to the heap through Scan, once
		// per row. The payload is not scanned (pgx skips a nil destination): its size
		// decides first whether it is copied at all.
		c.Messages = append(c.Messages, outbox.Message{})
		m := &c.Messages[len(c.Messages)-1]
		v := &seen.view
		if err := rows.Scan(&m.ID, &m.Topic, &m.PartitionKey, nil, &headers, &m.Attempt, &m.Generation, &m.CreatedAt,
			&stored, &deaths, &c.Isolated, &seen.windowRows, &seen.runCut, &seen.keysEnd, &c.BytesCut,
			&v.dbNow, &v.readyFrom, &v.pendingFrom, &v.maxID, &v.reopened, &v.xid, &v.xip); err != nil {
			return seen, err
		}
		if deaths.Valid {
			c.Deaths = max(c.Deaths, int(deaths.Int32))
		}
		payload := rows.RawValues()[3]
		size := int64(len(payload))
		var refused string
		switch {
		case deaths.Valid && deaths.Int32 >= maxDeaths:
			refused = diedError(m.ID, deaths.Int32)
		case r.MaxEventBytes > 0 && size > r.MaxEventBytes:
			refused = tooLargeError(m.ID, size, r.MaxEventBytes)
		case !cut.fits(m.ID, m.PartitionKey, size, c.Bytes):
			c.Messages = c.Messages[:len(c.Messages)-1]
			continue
		default:
			m.Payload = bytes.Clone(payload)
			c.Bytes += size
			seen.storedSum += stored
			if err := decodeHeaders(headers, &m.Headers); err != nil {
				refused = fmt.Sprintf("decode outbox row %d: %v", m.ID, err)
			}
		}
		if refused != "" {
			c.Undecodable = append(c.Undecodable, Failure{ID: m.ID, PartitionKey: m.PartitionKey, Error: refused})
			c.Messages = c.Messages[:len(c.Messages)-1]
		}
	}
	return seen, rows.Err()
}

// learn sizes the next claim from this one (see Claim): its window, its row limit after
// a cut, and the payloads' text size per stored byte.
func (s *Store) learn(c Claimed, limit int, seen claimSeen) {
	next := int64(0) // the batch size
	if c.Len() == limit && 4*seen.keysEnd <= int64(limit) {
		next = 2 * seen.keysEnd
	}
	s.window.Store(next)
	nextRows := int64(0) // the batch size
	if c.BytesCut {
		// At least one: a claim whose every row was given back (a key's later row came
		// first and was kept, its earlier one did not fit) takes one row next time, the
		// oldest key's head, which is always kept.
		nextRows = max(2*int64(c.Len()), 1)
	}
	s.rows.Store(nextRows)
	if seen.storedSum > 0 && c.Bytes > 0 {
		s.textPerStored.Store(math.Float64bits(float64(c.Bytes) / float64(seen.storedSum)))
	}
}

// claimArgs are qClaim's named arguments (see its comment); lease is an interval: a
// time.Duration, or text in tests.
func claimArgs(n int, token pgtype.UUID, now *time.Time, lease any, window, keyRun int, budget int64, p walkParams) pgx.NamedArgs {
	return pgx.NamedArgs{
		"batch": n, "token": token, "now": now, "lease": lease, "window": window, "key_run": keyRun, "budget": budget,
		"ready_from": p.readyFrom, "id_from": p.idFrom, "pending_from": p.pendingFrom, "reopened": p.reopened,
		"writers": nonNil(p.writers), "writer_ids": nonNil(p.writerIDs), "writer_ats": nonNil(p.writerAts),
	}
}

// nonNil returns s, or an empty slice for nil: pgx sends a nil slice as NULL, and unnest
// of NULL arrays of different types has no type to plan with.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// startProbe runs probeBelow beside the claims on a pool; a transaction or a single
// connection serves one statement at a time, so there it runs before the claim instead.
func (s *Store) startProbe(bound time.Time, now *time.Time) {
	if now != nil {
		c := *now // the caller's, copied: the probe outlives the claim
		now = &c
	}
	if _, pool := s.db.(*pgxpool.Pool); pool {
		go s.probeBelow(bound, now)
		return
	}
	s.probeBelow(bound, now)
}

// probeBelow looks for the oldest ready row below the claims' ready bound (walk.go), on
// a connection of its own so that no claim waits for it, and hands what it found to the
// next claims. It gives up after probeTimeout; the next probe tries again.
func (s *Store) probeBelow(bound time.Time, now *time.Time) {
	var at pgtype.Timestamptz
	began := time.Now()
	defer func() { s.walks.probed(at, time.Since(began)) }()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	if err := s.db.QueryRow(ctx, qBelowBound, bound, now).Scan(&at); err != nil {
		at = pgtype.Timestamptz{}
	}
}

// probeTimeout bounds one probe below the ready bound.
const probeTimeout = time.Minute

// coldTextPerStored is the text size per stored byte the first claim of a process
// assumes: about what Postgres's compression reaches on repetitive JSON. The claim keeps
// the budget on the text whatever this says; it bounds what Postgres renders and sends
// for the claim to give back. Assuming one to one, a claim of 1,000 payloads of 400 kB
// stored in 4 kB each rendered and sent 400 MB to keep 8 MB; this way it sends about
// 8 MB of them. The cost is a smaller first batch of small payloads (about 420 of 1,000
// events of 300 bytes, with an 8 MiB budget), and the next claims ramp up as the ratio
// is learnt.
const coldTextPerStored = 64

// storedBudget turns a budget in payload text bytes into stored bytes, at textPerStored
// text bytes per stored byte (0: unknown, taken as coldTextPerStored).
func storedBudget(maxBytes int64, textPerStored float64) int64 {
	if maxBytes <= 0 {
		return 1 // one row, whatever its size
	}
	if maxBytes == math.MaxInt64 {
		return maxBytes
	}
	if textPerStored <= 0 {
		textPerStored = coldTextPerStored
	}
	b := float64(maxBytes) / textPerStored
	if b >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(int64(b), 1)
}

// decodeHeaders decodes a jsonb headers value; null and {} are no headers. {} (the
// column's default, as Postgres prints it) skips encoding/json: the claim decodes every
// row while the next claim waits for it.
func decodeHeaders(b []byte, h *map[string]string) error {
	if string(b) == "{}" {
		*h = nil
		return nil
	}
	if err := json.Unmarshal(b, h); err != nil {
		return fmt.Errorf("%w: %v", ErrBadHeaders, err)
	}
	return nil
}

// settle runs query, one of the statements that end a lease on n of its rows, and
// returns how many rows the lease still held; what names it in an error. With no rows it
// sends nothing.
func (s *Store) settle(ctx context.Context, n int, what, query string, args ...any) (int64, error) {
	if n == 0 {
		return 0, nil
	}
	tag, err := s.exec(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return tag.RowsAffected(), nil
}

// MarkDispatched records ids as published. It returns how many rows the lease still held.
func (s *Store) MarkDispatched(ctx context.Context, lease Lease, ids []outbox.ID, now *time.Time) (int64, error) {
	return s.settle(ctx, len(ids), "mark outbox rows dispatched", qMarkDispatched, ids, lease.Token, now)
}

// Retry is a retryable failure to put back after Delay.
type Retry struct {
	ID    outbox.ID
	Delay time.Duration
	Error string
}

// Reschedule puts retryable failures back, each after its own delay.
func (s *Store) Reschedule(ctx context.Context, lease Lease, retries []Retry, now *time.Time) (int64, error) {
	ids := make([]outbox.ID, len(retries))
	delays := make([]int64, len(retries))
	errs := make([]string, len(retries))
	for i, r := range retries {
		ids[i], delays[i], errs[i] = r.ID, r.Delay.Milliseconds(), r.Error
	}
	return s.settle(ctx, len(retries), "reschedule outbox rows", qReschedule, ids, delays, errs, lease.Token, now)
}

// Failure is a message to dead-letter, with the error and the HTTP status if known.
type Failure struct {
	ID outbox.ID
	// PartitionKey is informational (the relay holds the key's later events behind it);
	// DeadLetter does not use it.
	PartitionKey string
	Error        string
	StatusCode   int
}

// DeadLetter marks rows dead-lettered and inserts their dead_letters rows atomically.
func (s *Store) DeadLetter(ctx context.Context, lease Lease, fails []Failure, now *time.Time) (int64, error) {
	ids := make([]outbox.ID, len(fails))
	errs := make([]string, len(fails))
	codes := make([]int32, len(fails))
	for i, f := range fails {
		ids[i], errs[i], codes[i] = f.ID, f.Error, int32(f.StatusCode)
	}
	return s.settle(ctx, len(fails), "dead-letter outbox rows", qDeadLetter, ids, errs, codes, lease.Token, now)
}

// ReleaseLease releases every row lease holds (qReleaseLease): a claim whose session was
// lost may have committed, and its rows would otherwise wait for the lease to end and
// then count as a relay death.
func (s *Store) ReleaseLease(ctx context.Context, lease Lease) (int64, error) {
	tag, err := s.exec(ctx, qReleaseLease, lease.Token)
	if err != nil {
		return 0, fmt.Errorf("release the rows of a lost claim: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Unclaim hands back suspects (rows a relay died holding) that a claim took but will not
// publish, as though it had not taken them: Release would count as an outcome and wipe
// their deaths. It needs migration 0020's relay_deaths, as every claim that reports a
// death does.
func (s *Store) Unclaim(ctx context.Context, lease Lease, ids []outbox.ID, now *time.Time) (int64, error) {
	return s.settle(ctx, len(ids), "hand back claimed outbox rows", qUnclaim, ids, lease.Token, now)
}

// Release returns claimed rows that were not published, without counting an attempt.
func (s *Store) Release(ctx context.Context, lease Lease, ids []outbox.ID, now *time.Time) (int64, error) {
	return s.settle(ctx, len(ids), "release outbox rows", qRelease, ids, lease.Token, now)
}
