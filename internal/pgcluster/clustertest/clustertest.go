// Package clustertest starts throwaway Postgres clusters (package pgcluster) for tests
// that need a server of their own: one they restart, or one that demands a password.
package clustertest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
)

// Start starts a cluster that trusts every connection (pgcluster.StartCluster); it stops
// when the test ends. Without the Postgres server binaries the test is skipped, or fails
// under CI.
func Start(tb testing.TB) *pgcluster.Cluster {
	tb.Helper()
	return start(tb, pgcluster.StartCluster)
}

// StartPassword is Start with a cluster that demands a password over TCP
// (pgcluster.StartPasswordCluster).
func StartPassword(tb testing.TB) *pgcluster.Cluster {
	tb.Helper()
	return start(tb, pgcluster.StartPasswordCluster)
}

func start(tb testing.TB, startCluster func(context.Context, string) (*pgcluster.Cluster, error)) *pgcluster.Cluster {
	tb.Helper()
	if _, err := pgcluster.FindPostgresBin(); err != nil {
		prereq.Missing(tb, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "clustertest-") // not TempDir: the postgres user must reach it
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	c, err := startCluster(ctx, dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Stop() })
	return c
}
