package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
)

// errSuperseded is the inbox work's answer to a delivery of an event generation its outbox
// row has left behind: rolled back, acknowledged, not applied.
var errSuperseded = errors.New("delivery of an event generation its outbox row has left behind")

// replySuperseded acknowledges such a delivery: QStash stops, and the FIFO queue moves on.
var replySuperseded = receive.Reply{Status: http.StatusOK, Code: "superseded", Outcome: OutcomeDuplicate}

// qOutboxGeneration reads the current generation of the delivery's outbox row (one
// primary-key probe); no row (deleted by retention) reads nothing.
const qOutboxGeneration = `SELECT generation FROM outbox WHERE id = $1`

// superseded reports whether d is of a generation its outbox row (in tx's database, Config
// SharesOutbox) has left behind: the event was put back in the outbox (a consumer outage's
// reschedule, or a redrive) and will be delivered again under its new generation, in its
// key's order. Applying the old delivery now could put it before an earlier event of its
// key that is waiting to be delivered again.
func superseded(ctx context.Context, tx pgx.Tx, d Delivery) (bool, error) {
	id, err := strconv.ParseInt(d.MessageID, 10, 64)
	if err != nil {
		return false, nil
	}
	var gen int
	switch err := tx.QueryRow(ctx, qOutboxGeneration, id).Scan(&gen); {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read outbox generation: %w", err)
	}
	return gen > d.Generation, nil
}
