package awsenv

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/awstest"
	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

func testAWS() *aws.Config {
	c := awstest.Config("")
	return &c
}

// withSSLMode returns the test server's URL with sslmode replaced.
func withSSLMode(t *testing.T, raw, mode string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", mode)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestNewPoolDefaultsAndDSNOverrides(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	pool, err := NewPool(ctx, db.URL, PoolConfig{Pooler: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := pool.Config()
	if c.MaxConns != DefaultMaxConns || c.PingTimeout != DefaultPingTimeout {
		t.Errorf("MaxConns %d PingTimeout %v", c.MaxConns, c.PingTimeout)
	}
	if c.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeExec {
		t.Errorf("Pooler: exec mode %v", c.ConnConfig.DefaultQueryExecMode)
	}
	// A parameterised query in exec mode (no named prepared statement) against the schema.
	var n int
	if err := pool.QueryRow(ctx, "select count(*) from outbox where topic = $1", "x").Scan(&n); err != nil {
		t.Fatalf("query in exec mode: %v", err)
	}
	var prepared int
	if err := pool.QueryRow(ctx, "select count(*) from pg_prepared_statements").Scan(&prepared); err != nil || prepared != 0 {
		t.Errorf("server-side prepared statements: %d (%v), want 0 behind a pooler", prepared, err)
	}

	u, _ := url.Parse(db.URL)
	q := u.Query()
	q.Set("pool_max_conns", "5")
	q.Set("pool_ping_timeout", "750ms")
	u.RawQuery = q.Encode()
	pool2, err := NewPool(ctx, u.String(), PoolConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool2.Close()
	if c := pool2.Config(); c.MaxConns != 5 || c.PingTimeout != 750*time.Millisecond {
		t.Errorf("DSN pool keys must win: MaxConns %d PingTimeout %v", c.MaxConns, c.PingTimeout)
	}
}

func TestNewPoolUnreachableDatabaseIsNotFatalButBounded(t *testing.T) {
	t.Parallel()
	start := time.Now()
	pool, err := NewPool(context.Background(), "postgres://u@127.0.0.1:1/db?sslmode=disable", PoolConfig{InitPingTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("unreachable database at init: %v (the invocation should fail, not the init)", err)
	}
	pool.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("init took %v", d)
	}
	if _, err := NewPool(context.Background(), "postgres://u:hunter2@h/db?sslmode=bogus", PoolConfig{}); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("bad DSN: err = %v (must fail without quoting the password)", err)
	}
}

// A command (MustConnect) gets the unreachable database as its error, with no pool left
// open; a reachable one opens as without it.
func TestNewPoolMustConnect(t *testing.T) {
	t.Parallel()
	pool, err := NewPool(context.Background(), "postgres://u@127.0.0.1:1/db?sslmode=disable", PoolConfig{InitPingTimeout: 300 * time.Millisecond, MustConnect: true})
	if err == nil || pool != nil || !strings.Contains(err.Error(), "connect to database") {
		t.Fatalf("unreachable database with MustConnect: pool %v, err %v", pool, err)
	}
	pool, err = NewPool(context.Background(), pgtest.URL(), PoolConfig{MustConnect: true})
	if err != nil {
		t.Fatalf("reachable database with MustConnect: %v", err)
	}
	pool.Close()
}

func TestNewPoolIAMAuth(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	// sslmode=prefer falls back to plaintext: a token must never go out in clear text.
	for _, mode := range []string{"disable", "prefer", "allow"} {
		if _, err := NewPool(ctx, withSSLMode(t, db.URL, mode)+"&rds_iam_auth=true", PoolConfig{AWSConfig: testAWS()}); err == nil || !strings.Contains(err.Error(), "needs TLS") {
			t.Errorf("sslmode=%s with IAM auth: err = %v, want a TLS error", mode, err)
		}
	}
	if _, err := NewPool(ctx, withSSLMode(t, db.URL, "require"), PoolConfig{IAMAuth: true, AWSConfig: &aws.Config{}}); err == nil || !strings.Contains(err.Error(), "region") {
		t.Errorf("IAM auth without region: err = %v", err)
	}
	// The local server trusts 127.0.0.1, so the token is sent but not checked: this proves
	// the key is stripped (the server would reject an unknown rds_iam_auth parameter) and
	// that TLS connections work with the hook installed.
	pool, err := NewPool(ctx, withSSLMode(t, db.URL, "require")+"&rds_iam_auth=true", PoolConfig{AWSConfig: testAWS()})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if pool.Config().BeforeConnect == nil {
		t.Fatal("no BeforeConnect with rds_iam_auth=true")
	}
	var ssl bool
	if err := pool.QueryRow(ctx, "select ssl from pg_stat_ssl where pid = pg_backend_pid()").Scan(&ssl); err != nil {
		prereq.Missing(t, "server without TLS (Debian's postgresql ships ssl = on): %v", err)
	}
	if !ssl {
		t.Error("IAM-auth connection is not TLS")
	}
}

func TestIAMAuthTokenPerConnection(t *testing.T) {
	t.Parallel()
	hook := iamAuth(awstest.Region, testAWS().Credentials)
	cc, err := pgx.ParseConfig("postgres://relay@db.abc.eu-west-1.rds.amazonaws.com:5432/app?sslmode=require")
	if err != nil {
		t.Fatal(err)
	}
	if err := hook(context.Background(), cc); err != nil {
		t.Fatal(err)
	}
	tok := cc.Password
	if !strings.HasPrefix(tok, "db.abc.eu-west-1.rds.amazonaws.com:5432?") {
		t.Fatalf("token %q is not a presigned connect URL for the endpoint", tok)
	}
	q, err := url.ParseQuery(tok[strings.Index(tok, "?")+1:])
	if err != nil {
		t.Fatal(err)
	}
	if q.Get("Action") != "connect" || q.Get("DBUser") != "relay" ||
		!strings.HasPrefix(q.Get("X-Amz-Credential"), awstest.AccessKeyID+"/") || !strings.HasSuffix(q.Get("X-Amz-Credential"), "/eu-west-1/rds-db/aws4_request") ||
		q.Get("X-Amz-Expires") != "900" || q.Get("X-Amz-Signature") == "" {
		t.Errorf("token query %v", q)
	}
}
