package awstest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster"
	"github.com/outbox-relay/outbox-relay/v3/internal/pgcluster/clustertest"
)

// DB is a database whose password lives in a Secrets Manager secret, as an RDS instance's
// does: a throwaway Postgres cluster that demands a password over TCP (scram-sha-256) and
// trusts its Unix socket, with a role app owning a database app, and the secret in the
// RDS rotation shape in the account. Rotate changes both, as a rotation does.
type DB struct {
	// SecretARN names the secret (DB_SECRET_ARN).
	SecretARN string
	// Cluster is the server; its AdminURL is the superuser's, over the socket.
	Cluster *pgcluster.Cluster
	// AppAdminURL connects to database app as the superuser, over the socket: it sees
	// what app's sessions wrote and is never refused by a rotation.
	AppAdminURL string

	acct *Account
}

// DBUser and FirstPassword are the database role and its password until the first Rotate.
const (
	DBUser        = "app"
	FirstPassword = "first-password"
)

// StartDB starts a DB whose secret is in a; both go away when the test ends. Without the
// Postgres server binaries the test is skipped, or fails under CI.
func (a *Account) StartDB(tb testing.TB) *DB {
	tb.Helper()
	cluster := clustertest.StartPassword(tb)
	d := &DB{Cluster: cluster, acct: a,
		AppAdminURL: fmt.Sprintf("postgres://postgres@/app?host=%s&port=%d&sslmode=disable", cluster.Dir, cluster.Port)}
	d.exec(tb, cluster.AdminURL(), `CREATE ROLE `+DBUser+` LOGIN PASSWORD '`+FirstPassword+`'`)
	d.exec(tb, cluster.AdminURL(), `CREATE DATABASE app OWNER `+DBUser)
	d.SecretARN = a.CreateSecret(tb, "rds/app", d.Secret(FirstPassword))
	return d
}

// Secret is the secret's value with password pw: the RDS rotation shape, port a number.
func (d *DB) Secret(pw string) string {
	b, _ := json.Marshal(map[string]any{"engine": "postgres", "username": DBUser, "password": pw,
		"host": "127.0.0.1", "port": d.Cluster.Port, "dbname": "app"})
	return string(b)
}

// Rotate changes the password as RDS rotation does: the role's, then the secret's
// (PutSecretValue). Open sessions stay open.
func (d *DB) Rotate(tb testing.TB, pw string) {
	tb.Helper()
	d.exec(tb, d.Cluster.AdminURL(), `ALTER ROLE `+DBUser+` PASSWORD '`+pw+`'`)
	d.acct.PutSecretValue(tb, d.SecretARN, d.Secret(pw))
}

// TerminateSessions ends every session of the app role, as the sockets of a frozen Lambda
// environment die: the next statement on each needs a new connection.
func (d *DB) TerminateSessions(tb testing.TB) {
	tb.Helper()
	d.exec(tb, d.Cluster.AdminURL(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '`+DBUser+`'`)
}

func (d *DB) exec(tb testing.TB, url, sql string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("awstest: connect to the throwaway cluster: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		tb.Fatalf("awstest: %s: %v", sql, err)
	}
}
