package webhook

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// LegacyDelivery is a verified delivery whose signed URL carries no identity (published
// before the relay put outbox_id in the URL), with the identity its unsigned X-Outbox-Id
// and X-Outbox-Generation headers claim.
type LegacyDelivery struct {
	Identity qstash.Identity
	Topic    string
	Payload  []byte
}

// LegacyCheck decides whether a legacy delivery may be processed under the identity its
// headers claim. It must make a replay with altered headers impossible or harmless.
type LegacyCheck func(ctx context.Context, d LegacyDelivery) (bool, error)

// Querier runs one query: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// LegacyOutbox is the LegacyCheck of a webhook that shares the outbox's database (as the
// webhook function does). It accepts the claimed id only
//
//   - while the legacy window is open (legacy_identity.accept_until, set by migration 0007
//     to seven days after the upgrade, closed from the start on a new database), and
//   - when the outbox row of that id has the delivery's topic and exactly its payload.
//
// The signature covers the topic (URL path) and the payload, so a replay under another id
// passes only if that id's own event has the same topic and content: processing it then
// is that event's delivery, once (its own delivery later finds the dedupe record), and no
// dedupe record is ever planted under an id whose event differs. Ids of future events have
// no row yet and are refused. A database without the legacy_identity or outbox table
// refuses every legacy delivery.
func LegacyOutbox(db Querier) LegacyCheck {
	return func(ctx context.Context, d LegacyDelivery) (bool, error) {
		var ok bool
		err := db.QueryRow(ctx, qLegacyIdentity, d.Identity.OutboxID, d.Topic, string(d.Payload)).Scan(&ok)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "22P05" || pgErr.Code == "22021"):
			// undefined_table: not the outbox's database. The other two: text the
			// payload column could never hold, so no row matches.
			return false, nil
		case err != nil:
			return false, fmt.Errorf("check legacy delivery identity: %w", err)
		}
		return ok, nil
	}
}
