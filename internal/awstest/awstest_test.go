package awstest_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	smtypes "github.com/aws/aws-sdk-go-v2/service/secretsmanager/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/outbox-relay/outbox-relay/v3/internal/awstest"
)

func TestMain(m *testing.M) { os.Exit(awstest.Main(m)) }

// Two accounts on the one server hold the same name apart, and each counts only its own
// requests.
func TestAccountsAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := awstest.New(t), awstest.New(t)
	if a.ID == b.ID || a.URL == b.URL {
		t.Fatalf("accounts share id %s or endpoint %s", a.ID, a.URL)
	}
	arn := a.CreateSecret(t, "app/db", "in-a")
	_, err := b.SecretsManager.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String("app/db")})
	if nf := (*smtypes.ResourceNotFoundException)(nil); !errors.As(err, &nf) {
		t.Fatalf("account b reads a's secret: %v", err)
	}
	b.CreateSecret(t, "app/db", "in-b")
	a.PutSecretValue(t, arn, "in-a, rotated")
	for acct, want := range map[*awstest.Account]string{a: "in-a, rotated", b: "in-b"} {
		out, err := acct.SecretsManager.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String("app/db")})
		if err != nil || aws.ToString(out.SecretString) != want {
			t.Fatalf("account %s: %v %v, want %q", acct.ID, err, out, want)
		}
	}
	if n := a.Requests(awstest.TargetGetSecretValue); n != 1 {
		t.Errorf("account a counted %d GetSecretValue, want 1", n)
	}
	if n := b.Requests(awstest.TargetGetSecretValue); n != 2 {
		t.Errorf("account b counted %d GetSecretValue, want 2", n)
	}
}

// A SecureString reads back as its value only with decryption, as in AWS.
func TestSecureStringNeedsDecryption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := awstest.New(t)
	a.PutParameter(t, "/app/token", "tok-1")
	a.PutParameter(t, "/app/token", "tok-2") // overwrites
	for _, decrypt := range []bool{false, true} {
		out, err := a.SSM.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String("/app/token"), WithDecryption: aws.Bool(decrypt)})
		if err != nil {
			t.Fatal(err)
		}
		if got := aws.ToString(out.Parameter.Value); (got == "tok-2") != decrypt {
			t.Errorf("WithDecryption=%v: value %q", decrypt, got)
		}
	}
}
