package pgcluster_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster/clustertest"
)

// TestThrowawayCluster: a started cluster answers queries, and again after a restart.
func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	selectOne(t, c)
	if err := c.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	selectOne(t, c)
}

// selectOne connects to c and runs SELECT 1.
func selectOne(t *testing.T, c *pgcluster.Cluster) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	var one int
	if err := conn.QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query: %v", err)
	}
}
