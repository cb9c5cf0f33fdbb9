package outboxstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// DefaultMaxDeaths is ClaimRequest.MaxDeaths' default: a row is dead-lettered at the
// claim that finds the relay died holding it this many times in a row (the first death in
// a batch, the next ones with the row claimed alone).
const DefaultMaxDeaths = 3

// qClaimPre0020 is qClaim on a schema without migration 0020's relay_deaths: suspects are
// still claimed alone (the lease token tells them), but their deaths are not counted, so
// none is dead-lettered for dying. A relay deployed before `migrate up` claims with it
// instead of failing every claim until the migration runs.
var qClaimPre0020 = strings.NewReplacer(
	"    relay_deaths = CASE WHEN o.lease_token IS NULL THEN NULL ELSE coalesce(o.relay_deaths, 0) + 1 END,\n", "",
	"pg_column_size(o.payload) AS stored, o.relay_deaths,", "pg_column_size(o.payload) AS stored, NULL::int AS relay_deaths,",
).Replace(qClaim)

// schemaRecheck is how long a Store that found no relay_deaths column claims with
// qClaimPre0020 before it tries qClaim again (the migration may have run meanwhile).
const schemaRecheck = time.Minute

// claimQuery sends the claim: qClaim, or qClaimPre0020 while the schema lacks migration
// 0020's column. The column's absence fails the statement as it is planned, before any
// row is leased, so running the other one at once is safe.
func (s *Store) claimQuery(ctx context.Context, args pgx.NamedArgs) (pgx.Rows, error) {
	if time.Now().UnixNano() < s.pre0020Until.Load() {
		return s.query(ctx, qClaimPlanner, qClaimPre0020, args)
	}
	rows, err := s.query(ctx, qClaimPlanner, qClaim, args)
	if err == nil || !missingDeathsColumn(err) {
		return rows, err
	}
	s.pre0020Until.Store(time.Now().Add(schemaRecheck).UnixNano())
	return s.query(ctx, qClaimPlanner, qClaimPre0020, args)
}

// missingDeathsColumn reports whether err is Postgres refusing qClaim for want of
// relay_deaths (undefined_column).
func missingDeathsColumn(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42703" && strings.Contains(pgErr.Message, "relay_deaths")
}

// diedError is the dead letter's error for a row the relay died holding deaths times.
func diedError(id outbox.ID, deaths int32) string {
	return fmt.Sprintf("the relay died %d times while holding this row (outbox row %d): each claim of it ended without an outcome "+
		"(the process was killed for memory, panicked or ran out of time), the last ones with the row claimed alone; "+
		"dead-lettered so that it stops taking the relay down; find why in the relay's logs at its claims, then redrive it", deaths, id)
}

// tooLargeError is the dead letter's error for a payload over ClaimRequest.MaxEventBytes.
func tooLargeError(id outbox.ID, size, limit int64) string {
	return fmt.Sprintf("outbox row %d: payload of %d bytes is larger than the relay can hold (%d bytes, its in-flight byte budget): "+
		"publishing it could kill the process, and every process after it; store large data elsewhere and send a reference", id, size, limit)
}

// byteCut decides, row by row as the claim's rows arrive, which payloads the claim keeps
// within its byte budget (their text, as the caller will hold them) and which rows it
// gives back.
type byteCut struct {
	max int64
	// kept counts the rows whose payload was kept; the first is kept whatever its size.
	kept int
	// back are the rows to give back; cutFrom is, per key, the smallest id among them.
	back    []outbox.ID
	cutFrom map[string]outbox.ID
}

// fits reports whether a payload of size bytes of row id fits beside the used bytes kept
// so far; if not, the row is to be given back.
func (b *byteCut) fits(id outbox.ID, key string, size, used int64) bool {
	if cut, ok := b.cutFrom[key]; ok && id > cut {
		b.giveBack(id, key)
		return false
	}
	if b.kept > 0 && used+size > b.max {
		b.giveBack(id, key)
		return false
	}
	b.kept++
	return true
}

func (b *byteCut) giveBack(id outbox.ID, key string) {
	b.back = append(b.back, id)
	if b.cutFrom == nil {
		b.cutFrom = map[string]outbox.ID{}
	}
	if cut, ok := b.cutFrom[key]; !ok || id < cut {
		b.cutFrom[key] = id
	}
}

// settle gives back, from what c kept, every row with a same-key row given back before it
// (the claim's rows arrive in no particular order, and a key's events go out in id order),
// and returns the bytes of payload that dropped out.
func (b *byteCut) settle(c *Claimed) (dropped int64) {
	if len(b.cutFrom) == 0 {
		return 0
	}
	after := func(id outbox.ID, key string) bool {
		cut, ok := b.cutFrom[key]
		return ok && id > cut
	}
	msgs := c.Messages[:0]
	for _, m := range c.Messages {
		if after(m.ID, m.PartitionKey) {
			b.back = append(b.back, m.ID)
			dropped += int64(len(m.Payload))
			continue
		}
		msgs = append(msgs, m)
	}
	clear(c.Messages[len(msgs):]) // the payloads given back are garbage now
	c.Messages = msgs
	fails := c.Undecodable[:0]
	for _, f := range c.Undecodable {
		if after(f.ID, f.PartitionKey) {
			b.back = append(b.back, f.ID)
			continue
		}
		fails = append(fails, f)
	}
	c.Undecodable = fails
	return dropped
}
