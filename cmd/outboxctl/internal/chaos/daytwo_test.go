package chaos_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/chaos"
	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster/clustertest"
	"github.com/outbox-relay/outbox-relay/v3/migrations"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

// dayTwoFromVersion is the schema the day-two run starts on: before the fillfactor (0013)
// and the sleeper wake-up (0014), both of which take a lock on the busy outbox.
const dayTwoFromVersion = 11

// TestChaosDayTwo runs the faults of TestChaosFIFO through a deployment's ordinary life:
// on a Postgres that checks passwords, starting some migrations behind, the pending
// migrations are applied under load, the password is rotated while sessions opened with
// the old one stay open (RDS rotation), and the QStash API fails every request for
// several seconds. The relays' retry budget is cut to 5 attempts, which an outage used to
// spend within a second or two (every failed call charged an attempt to each message in
// it): now an outage costs no attempt, so no healthy event may be dead-lettered.
func TestChaosDayTwo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := clustertest.StartPassword(t)
	admin, err := pgx.Connect(ctx, cluster.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, sql := range []string{`CREATE ROLE app LOGIN PASSWORD 'before-rotation'`, `CREATE DATABASE app OWNER app`} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	appURL := func(password string) string {
		return fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/app?sslmode=disable", password, cluster.Port)
	}
	var secret atomic.Value // the secret store: what a re-read returns
	secret.Store(appURL("before-rotation"))
	migrateTo(t, appURL("before-rotation"), dayTwoFromVersion)

	// On failure, what the dead letters of healthy events say (the run's own database is
	// gone with the cluster after the test).
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		db, err := pgx.Connect(ctx, strings.Replace(cluster.AdminURL(), "/postgres?", "/app?", 1))
		if err != nil {
			t.Logf("debug connect: %v", err)
			return
		}
		defer db.Close(ctx)
		rows, err := db.Query(ctx, `SELECT d.outbox_id, d.source, coalesce(d.status_code, 0), left(d.error, 200), o.attempts, o.relay_deaths, o.generation
			FROM dead_letters d JOIN outbox o ON o.id = d.outbox_id JOIN demo_orders od ON od.id = o.payload->>'order_id'
			WHERE NOT od.poison AND d.resolution IS DISTINCT FROM 'superseded'`)
		if err != nil {
			t.Logf("debug query: %v", err)
			return
		}
		for rows.Next() {
			v, _ := rows.Values()
			t.Logf("healthy event's letter: %v", v)
		}
	})
	var migrated atomic.Bool
	seed := chaosSeed(t)
	rep := runChaosOn(t, chaos.Options{
		DatabaseURL: appURL("before-rotation"),
		Events:      chaosEvents(t, 2000), Seed: seed, Relays: 2, Faults: chaos.DefaultFaults(),
		MaxAttempts: 5,
		DayTwo: chaos.DayTwo{
			Migrate: func(ctx context.Context) error {
				// As a deploy job would: the secret read when it starts, re-read if the
				// password changes under it.
				read := func(context.Context) (string, error) { return secret.Load().(string), nil }
				pool, err := awsenv.NewPool(ctx, secret.Load().(string), awsenv.PoolConfig{MaxConns: 2, Credentials: awsenv.NewCredentials(read)})
				if err != nil {
					return err
				}
				defer pool.Close()
				// A migration that meets the rotation on a new connection fails once (its
				// statements are not retried; the pool re-reads the secret for the next
				// connection): a deploy job runs it again.
				for range 3 {
					if _, err = postgres.Migrate(ctx, pool, nil); !awsenv.IsAuthFailure(err) {
						break
					}
				}
				migrated.Store(err == nil)
				return err
			},
			RotatePassword: func(ctx context.Context) error {
				if _, err := admin.Exec(ctx, `ALTER ROLE app PASSWORD 'after-rotation'`); err != nil {
					return err
				}
				secret.Store(appURL("after-rotation"))
				return nil
			},
			ReadDatabaseURL: func(context.Context) (string, error) { return secret.Load().(string), nil },
			Outage:          4 * time.Second,
		},
	})
	for _, kind := range []string{chaos.FaultMigration, chaos.FaultPasswordRotation, chaos.FaultQStashOutage} {
		if rep.Faults[kind] != 1 {
			t.Errorf("day-two event %s injected %d times, want once (seed %d)", kind, rep.Faults[kind], seed)
		}
	}
	if !migrated.Load() {
		t.Error("the migration under load did not complete")
	}
}

// migrateTo applies the embedded migrations up to version, as a deployment of that release
// had them.
func migrateTo(t *testing.T, url string, version int64) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatal(err)
	}
}
