package relayenv_test

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/relayenv"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// FuzzRelayConfig: whatever the environment, FromEnv does not panic; a configuration it
// accepts builds a Publisher and satisfies the relay's own Validate; an error never
// echoes the database password.
func FuzzRelayConfig(f *testing.F) {
	f.Add("postgres://app:pw-secret@db:5432/app", "30s", "10s", "100", "12", "30s", "1h", "3", "fifo", "8", "14d")
	f.Add("postgres://app:pw-secret@db:notaport/app", "1s", "10s", "0", "-1", "0s", "1ms", "x", "lifo", "0", "1s")
	f.Add("", "", "", "", "", "", "", "", "", "", "")
	f.Add("host=db password=pw-secret", "7d", "1ns", "10001", "1", "1s", "1s", "100", "publish", "1000", "2d")
	f.Fuzz(func(t *testing.T, dbURL, lease, publishTimeout, batch, attempts, base, maxB, retries, ordering, queues, dedupe string) {
		env := map[string]string{
			"DATABASE_URL": dbURL, "QSTASH_TOKEN": "tok", "PUBLIC_BASE_URL": "https://hooks.example.com",
			"LEASE": lease, "PUBLISH_TIMEOUT": publishTimeout, "BATCH_SIZE": batch, "MAX_ATTEMPTS": attempts,
			"BACKOFF_BASE": base, "BACKOFF_MAX": maxB, "QSTASH_RETRIES": retries, "ORDERING": ordering,
			"FIFO_QUEUES": queues, "DEDUPE_TTL": dedupe,
		}
		cfg, err := relayenv.Read(func(k string) string { return env[k] })
		if err != nil {
			if i := strings.Index(dbURL, "pw-secret"); i >= 0 && strings.Contains(err.Error(), "pw-secret") {
				t.Fatalf("config error echoes the database password: %v", err)
			}
			return
		}
		if err := cfg.Relay.WithDefaults().Validate(); err != nil {
			t.Fatalf("FromEnv accepted a relay config that relay rejects: %v", err)
		}
		if _, err := qstash.NewPublisher(cfg.Publisher); err != nil {
			t.Fatalf("FromEnv accepted a publisher config that NewPublisher rejects: %v", err)
		}
	})
}

// TestSecretsNotEchoed: a DATABASE_URL that does not parse is reported without its
// password. (Missing variables, every one at once:
// TestFromEnvReportsEverythingAtOnce.)
func TestSecretsNotEchoed(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://app:hunter2-secret@db.example.com:notaport/app", "QSTASH_TOKEN": "qstash-token-secret"}
	_, err := relayenv.Read(func(k string) string { return env[k] })
	if err == nil {
		t.Fatal("FromEnv accepted a bad DATABASE_URL and no PUBLIC_BASE_URL")
	}
	for _, secret := range []string{"hunter2-secret", "qstash-token-secret"} {
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("config error echoes a secret: %v", err)
		}
	}
}
