package inbox_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/inbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// HandleOnce makes an at-least-once delivery apply once: the side effect and the dedupe
// record commit in one transaction, so a redelivery of the same message id finds the
// record and skips the work. webhook.Handler calls it for every verified delivery; call it
// yourself in a consumer that is not an HTTP handler.
func ExampleHandleOnce() {
	ctx := context.Background()
	db := pgtest.MustOpen(ctx, `CREATE TABLE credits (account text PRIMARY KEY, cents bigint NOT NULL)`)
	defer db.Close()

	body := []byte(`{"account":"a-1","cents":500}`)
	hash := sha256.Sum256(body)
	credit := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO credits VALUES ('a-1', 500)
			ON CONFLICT (account) DO UPDATE SET cents = credits.cents + 500`)
		return err
	}
	// The same message delivered twice, as QStash may after a timeout.
	for range 2 {
		outcome, err := inbox.HandleOnce(ctx, db.Pool, inbox.Message{Consumer: "billing", ID: "outbox-7", PayloadHash: hash[:]}, credit)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome)
	}
	var cents int64
	if err := db.Pool.QueryRow(ctx, `SELECT cents FROM credits WHERE account = 'a-1'`).Scan(&cents); err != nil {
		log.Fatal(err)
	}
	fmt.Println("credited cents:", cents)
	// Output:
	// processed
	// duplicate
	// credited cents: 500
}
