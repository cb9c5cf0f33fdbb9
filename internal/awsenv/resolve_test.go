package awsenv_test

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/awstest"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(awstest.Main(m)) }

// secretName names the database secret in each test's own account on moto_server.
const secretName = "outbox/db"

// secretARN is a well-formed ARN of a secret no account holds. Table tests write it where
// the ARN of the secret they create goes: moto gives that one a random suffix.
const secretARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:outbox/db-AbCdEf"

// resolver returns a Resolver whose real SDK clients talk to a fresh account on moto.
func resolver(t *testing.T) (awsenv.Resolver, *awstest.Account) {
	t.Helper()
	acct := awstest.New(t)
	cfg := acct.Config
	return awsenv.Resolver{AWSConfig: &cfg}, acct
}

// resolve is r.Resolve over vars, failing the test on an error.
func resolve(t *testing.T, r awsenv.Resolver, vars map[string]string) func(string) string {
	t.Helper()
	getenv, err := r.Resolve(t.Context(), envOf(vars))
	if err != nil {
		t.Fatal(err)
	}
	return getenv
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestResolveRDSSecretIntoWorkingDSN(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	server, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	password := server.Password
	if password == "" {
		password = "ignored by trust auth" // the secret must hold one
	}
	r, acct := resolver(t)
	// The rotation-template shape, port as a number; the password is the server's own
	// (trust auth ignores it locally, a CI server may not).
	secretARN := acct.CreateSecret(t, secretName, `{"engine":"postgres","username":`+jsonString(server.User)+`,"password":`+jsonString(password)+
		`,"host":`+jsonString(server.Host)+`,"port":`+strconv.Itoa(int(server.Port))+`,"dbname":`+jsonString(server.Database)+`}`)
	sslmode := "require"
	if strings.Contains(db.URL, "sslmode=disable") {
		sslmode = "disable"
	}
	getenv := resolve(t, r, map[string]string{awsenv.VarDBSecretARN: secretARN, awsenv.VarDBSSLMode: sslmode})
	dsn := getenv("DATABASE_URL")
	pool, err := awsenv.NewPool(context.Background(), dsn, awsenv.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var one int
	if err := pool.QueryRow(context.Background(), "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query through the resolved DSN: %v", err)
	}
	if got := pool.Config().MaxConns; got != awsenv.DefaultMaxConns {
		t.Errorf("MaxConns = %d, want %d", got, awsenv.DefaultMaxConns)
	}
}

func TestResolveDSNEscapesEveryPart(t *testing.T) {
	t.Parallel()
	r, acct := resolver(t)
	password := `p@ss:w/rd?#%20&x y'"\`
	secretARN := acct.CreateSecret(t, secretName, `{"username":"app user","password":`+jsonString(password)+`,"host":"db.internal","port":"6432","dbname":"my db"}`)
	getenv := resolve(t, r, map[string]string{awsenv.VarDBSecretARN: secretARN})
	cc, err := pgx.ParseConfig(getenv("DATABASE_URL"))
	if err != nil {
		t.Fatalf("parse resolved DSN: %v", err)
	}
	if cc.User != "app user" || cc.Password != password || cc.Host != "db.internal" || cc.Port != 6432 || cc.Database != "my db" {
		t.Fatalf("parsed %q:%q@%s:%d/%s", cc.User, cc.Password, cc.Host, cc.Port, cc.Database)
	}
	if cc.TLSConfig == nil || len(cc.Fallbacks) != 0 {
		t.Errorf("default sslmode must be require (TLS, no plaintext fallback)")
	}
	if cc.ConnectTimeout != awsenv.DefaultConnectTimeout*time.Second {
		t.Errorf("connect timeout = %v", cc.ConnectTimeout)
	}
	if cc.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		t.Errorf("exec mode %v without DB_PROXY", cc.DefaultQueryExecMode)
	}
}

func TestResolveRDSManagedSecretWithEndpointVariables(t *testing.T) {
	t.Parallel()
	r, acct := resolver(t)
	// ManageMasterUserPassword secrets hold only username and password.
	secretARN := acct.CreateSecret(t, secretName, `{"username":"relay","password":"pw"}`)
	getenv := resolve(t, r, map[string]string{
		awsenv.VarDBSecretARN: secretARN, awsenv.VarDBHost: "proxy.proxy-abc.eu-west-1.rds.amazonaws.com",
		awsenv.VarDBPort: "5433", awsenv.VarDBName: "outbox", awsenv.VarDBProxy: "true",
	})
	cc, err := pgx.ParseConfig(getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	if cc.User != "relay" || cc.Password != "pw" || cc.Host != "proxy.proxy-abc.eu-west-1.rds.amazonaws.com" || cc.Port != 5433 || cc.Database != "outbox" {
		t.Fatalf("parsed %s:%s@%s:%d/%s", cc.User, cc.Password, cc.Host, cc.Port, cc.Database)
	}
	if cc.DefaultQueryExecMode != pgx.QueryExecModeExec {
		t.Errorf("DB_PROXY=true: exec mode %v, want exec", cc.DefaultQueryExecMode)
	}
}

func TestResolveIAMAuthWithoutSecret(t *testing.T) {
	t.Parallel()
	r, acct := resolver(t)
	getenv := resolve(t, r, map[string]string{
		awsenv.VarDBHost: "db.internal", awsenv.VarDBUser: "relay", awsenv.VarDBIAMAuth: "true",
	})
	u, err := url.Parse(getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	if _, has := u.User.Password(); has || u.User.Username() != "relay" || u.Query().Get("rds_iam_auth") != "true" {
		t.Fatalf("DSN %s: want user relay, no password, rds_iam_auth=true", u.Redacted())
	}
	if n := acct.Requests(awstest.TargetGetSecretValue); n != 0 {
		t.Errorf("%d secret reads without DB_SECRET_ARN", n)
	}
}

func TestResolveQStashParametersInOneCall(t *testing.T) {
	t.Parallel()
	r, acct := resolver(t)
	acct.PutParameter(t, "/outbox/qstash/token", "tok-123\n")
	acct.PutParameter(t, "/outbox/qstash/current", "sig_current")
	acct.PutParameter(t, "/outbox/qstash/next", "sig_next")
	getenv := resolve(t, r, map[string]string{
		"QSTASH_TOKEN_PARAM":               "/outbox/qstash/token",
		"QSTASH_CURRENT_SIGNING_KEY_PARAM": "/outbox/qstash/current",
		"QSTASH_NEXT_SIGNING_KEY_PARAM":    "/outbox/qstash/next",
		"QSTASH_URL":                       "http://127.0.0.1:1",
	})
	for i := 0; i < 3; i++ { // the overlay never calls AWS again
		for k, want := range map[string]string{
			"QSTASH_TOKEN": "tok-123", "QSTASH_CURRENT_SIGNING_KEY": "sig_current",
			"QSTASH_NEXT_SIGNING_KEY": "sig_next", "QSTASH_URL": "http://127.0.0.1:1",
		} {
			if got := getenv(k); got != want {
				t.Errorf("%s = %q, want %q", k, got, want)
			}
		}
	}
	if n := acct.Requests(awstest.TargetGetParameters); n != 1 {
		t.Errorf("GetParameters called %d times, want 1 (batched, once per cold start)", n)
	}
}

// The token rotated at its source after the cold start: the reader returns the new value
// on each call; without QSTASH_TOKEN_PARAM there is no reader.
func TestParameterReaderRereads(t *testing.T) {
	t.Parallel()
	r, acct := resolver(t)
	env := envOf(map[string]string{"QSTASH_TOKEN_PARAM": "/outbox/qstash/token"})
	if read := r.ParameterReader(envOf(map[string]string{"QSTASH_TOKEN": "tok"}), "QSTASH_TOKEN"); read != nil {
		t.Fatal("a reader for a plain QSTASH_TOKEN")
	}
	read := r.ParameterReader(env, "QSTASH_TOKEN")
	acct.PutParameter(t, "/outbox/qstash/token", "tok-1")
	if v, err := read(context.Background()); err != nil || v != "tok-1" {
		t.Fatalf("%q, %v", v, err)
	}
	acct.PutParameter(t, "/outbox/qstash/token", "tok-2\n")
	if v, err := read(context.Background()); err != nil || v != "tok-2" {
		t.Fatalf("after the rotation: %q, %v", v, err)
	}
	acct.PutParameter(t, "/outbox/qstash/token", " ")
	if _, err := read(context.Background()); err == nil || !strings.Contains(err.Error(), "QSTASH_TOKEN_PARAM") || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("an emptied parameter: %v", err)
	}
}

func TestResolveWithoutReferencesCallsNothing(t *testing.T) {
	t.Parallel()
	// No AWSConfig: loading one would be the bug (local runs have no AWS configuration).
	env := map[string]string{"DATABASE_URL": "postgres://u@h/db", "QSTASH_TOKEN": "t"}
	getenv := resolve(t, awsenv.Resolver{}, env)
	if getenv("DATABASE_URL") != env["DATABASE_URL"] || getenv("QSTASH_TOKEN") != "t" {
		t.Fatal("values not passed through")
	}
}

func TestResolveErrorsNameTheSecret(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		secret string // "" = absent
		params map[string]string
		env    map[string]string
		want   []string
	}{
		{"missing secret", "", nil, map[string]string{awsenv.VarDBSecretARN: secretARN},
			[]string{secretARN, "DB_SECRET_ARN", "ResourceNotFoundException"}},
		{"malformed JSON", `{"username":`, nil, map[string]string{awsenv.VarDBSecretARN: secretARN},
			[]string{secretARN, "not RDS credentials JSON"}},
		{"not an object", `"just-a-password"`, nil, map[string]string{awsenv.VarDBSecretARN: secretARN},
			[]string{secretARN, "not RDS credentials JSON"}},
		{"no password", `{"username":"u","host":"h"}`, nil, map[string]string{awsenv.VarDBSecretARN: secretARN},
			[]string{secretARN, `no "password" field`}},
		{"managed secret without DB_HOST", `{"username":"u","password":"p"}`, nil, map[string]string{awsenv.VarDBSecretARN: secretARN},
			[]string{secretARN, `no "host" field and DB_HOST is not set`}},
		{"bad port", `{"username":"u","password":"p","host":"h","port":true}`, nil, map[string]string{awsenv.VarDBSecretARN: secretARN},
			[]string{`"port" must be a number`}},
		{"both DATABASE_URL and secret", `{}`, nil, map[string]string{awsenv.VarDBSecretARN: secretARN, "DATABASE_URL": "postgres://x"},
			[]string{"DATABASE_URL and DB_SECRET_ARN are both set"}},
		{"host without credentials", "", nil, map[string]string{awsenv.VarDBHost: "h", awsenv.VarDBUser: "u"},
			[]string{"DB_HOST is set without DB_SECRET_ARN"}},
		{"bad sslmode", `{"username":"u","password":"p","host":"h"}`, nil, map[string]string{awsenv.VarDBSecretARN: secretARN, awsenv.VarDBSSLMode: "on"},
			[]string{`DB_SSLMODE "on"`}},
		{"missing parameters", "", map[string]string{"/p/next": "n", "/p/empty": " "},
			map[string]string{"QSTASH_CURRENT_SIGNING_KEY_PARAM": "/p/current", "QSTASH_NEXT_SIGNING_KEY_PARAM": "/p/next", "QSTASH_TOKEN_PARAM": "/p/empty"},
			[]string{"SSM parameter /p/current (QSTASH_CURRENT_SIGNING_KEY_PARAM) does not exist", "SSM parameter /p/empty (QSTASH_TOKEN_PARAM) is empty"}},
		{"value and parameter", "", nil, map[string]string{"QSTASH_TOKEN": "t", "QSTASH_TOKEN_PARAM": "/p/token"},
			[]string{"QSTASH_TOKEN and QSTASH_TOKEN_PARAM are both set"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, acct := resolver(t)
			arn := secretARN
			if tt.secret != "" {
				arn = acct.CreateSecret(t, secretName, tt.secret)
			}
			env := map[string]string{}
			for k, v := range tt.env {
				env[k] = strings.ReplaceAll(v, secretARN, arn)
			}
			for k, v := range tt.params {
				acct.PutParameter(t, k, v)
			}
			_, err := r.Resolve(context.Background(), envOf(env))
			if err == nil {
				t.Fatal("Resolve succeeded")
			}
			for _, w := range tt.want {
				w = strings.ReplaceAll(w, secretARN, arn)
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), `"p"`) || strings.Contains(err.Error(), ":p@") {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
}

func TestResolveUnreachableEndpointIsBounded(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + l.Addr().String()
	l.Close() // nothing listens there any more
	cfg := awstest.Config(endpoint)
	start := time.Now()
	_, err = awsenv.Resolver{AWSConfig: &cfg, Timeout: 2 * time.Second}.Resolve(context.Background(),
		envOf(map[string]string{awsenv.VarDBSecretARN: secretARN}))
	if err == nil || !strings.Contains(err.Error(), secretARN) {
		t.Fatalf("err = %v, want one naming %s", err, secretARN)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v with a 2s timeout", d)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
