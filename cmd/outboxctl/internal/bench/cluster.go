package bench

import (
	"context"
	"fmt"
	"os"

	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
)

// ThrowawayCluster describes a bench run on a cluster StartThrowawayCluster made.
const ThrowawayCluster = "throwaway cluster with PostgreSQL's defaults (initdb, autovacuum on), started because DATABASE_URL is unset"

// StartThrowawayCluster initialises and starts a PostgreSQL cluster with the server's
// defaults (autovacuum on, unlike the CI machines' shared server) in a temporary directory.
// stop shuts it down and removes the directory.
func StartThrowawayCluster(ctx context.Context) (url string, stop func() error, err error) {
	dir, err := os.MkdirTemp("", "outbox-bench-pg-")
	if err != nil {
		return "", nil, fmt.Errorf("start throwaway cluster: %w", err)
	}
	c, err := pgcluster.StartCluster(ctx, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	return c.URL, func() error {
		err := c.Stop()
		if rerr := os.RemoveAll(dir); err == nil && rerr != nil {
			err = fmt.Errorf("remove throwaway cluster: %w", rerr)
		}
		return err
	}, nil
}
