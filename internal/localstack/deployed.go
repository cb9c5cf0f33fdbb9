package localstack

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/lambdasvc"
	"github.com/outbox-relay/outbox-relay/v3/internal/rie"
	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
)

// deployedRelay is the relay as `sam deploy` runs it: the built functions/relay bootstrap
// under aws-lambda-rie behind the local Lambda service (reserved concurrency 2 and a
// 50-s timeout, as the template's defaults), kicked by the demo producer after each commit
// (package kick), with a scheduled tick as the backstop.
type deployedRelay struct {
	svc       *lambdasvc.Service
	kicker    *kick.Kicker
	stopTicks func()
	dir       string
}

// startDeployedRelay builds the relay bootstrap (from the module's source: run from the
// repository) and serves it on the pipeline, with dbURL its DATABASE_URL.
func startDeployedRelay(ctx context.Context, pl *Pipeline, pool *pgxpool.Pool, dbURL string, opts Options) (*deployedRelay, error) {
	dir, err := os.MkdirTemp("", "outbox-dev-relay-")
	if err != nil {
		return nil, fmt.Errorf("start deployed relay: %w", err)
	}
	d := &deployedRelay{dir: dir, stopTicks: func() {}}
	if err := d.start(ctx, pl, pool, dbURL, opts); err != nil {
		d.stop()
		return nil, fmt.Errorf("start deployed relay: %w", err)
	}
	return d, nil
}

func (d *deployedRelay) start(ctx context.Context, pl *Pipeline, pool *pgxpool.Pool, dbURL string, opts Options) error {
	bin, err := rie.Build(ctx, "./functions/relay", d.dir)
	if err != nil {
		return err
	}
	if _, err := rie.Path(); err != nil {
		return fmt.Errorf("%w (make rie-install)", err)
	}
	d.svc, err = lambdasvc.Start(lambdasvc.FunctionConfig{
		Name: "relay", Bootstrap: bin, Timeout: 50 * time.Second, ReservedConcurrency: 2, Log: io.Discard,
		Env: map[string]string{
			"DATABASE_URL": dbURL, "QSTASH_URL": pl.QStashURL, "QSTASH_TOKEN": pl.Token,
			"PUBLIC_BASE_URL": pl.BaseURL, "FAILURE_CALLBACK_URL": pl.FailureURL,
			"ORDERING": string(opts.Ordering), "BATCH_SIZE": "100", "LOG_LEVEL": "warn",
		},
	})
	if err != nil {
		return err
	}
	if d.stopTicks, err = d.svc.Schedule("relay", opts.Schedule, []byte(`{"task":"drain"}`)); err != nil {
		return err
	}
	// The producer's Lambda client, pointed at the local service as AWS_ENDPOINT_URL_LAMBDA
	// would point it.
	d.kicker, err = kick.New(ctx, kick.Config{Function: "relay", DB: pool, Client: lambdasvc.Client(d.svc.URL), Logger: opts.Logger})
	return err
}

// stop sends the kick still owed, stops the ticks and the service, and removes the build.
func (d *deployedRelay) stop() {
	if d.kicker != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = d.kicker.Close(ctx)
		cancel()
	}
	d.stopTicks()
	if d.svc != nil {
		d.svc.Close()
	}
	_ = os.RemoveAll(d.dir)
}
