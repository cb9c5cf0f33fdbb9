package receiverconfig

import (
	"log/slog"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnvDefaultsAndOverrides(t *testing.T) {
	m := map[string]string{
		"DATABASE_URL":               "postgres://u@127.0.0.1:5432/db",
		"QSTASH_CURRENT_SIGNING_KEY": "cur",
		"QSTASH_NEXT_SIGNING_KEY":    "next",
	}
	c, err := FromEnv(env(m), 4096)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBodyBytes != 4096 || c.LogLevel != slog.LevelInfo || c.ListenAddr != "" || c.MetricsNamespace != "" {
		t.Fatalf("defaults: %+v", c)
	}
	if _, err := c.Verifier(); err != nil {
		t.Fatalf("verifier from valid keys: %v", err)
	}
	m["MAX_BODY_BYTES"], m["LOG_LEVEL"], m["LISTEN_ADDR"], m["METRICS_NAMESPACE"] = "10", "WARN", "127.0.0.1:0", "Ns"
	if c, err = FromEnv(env(m), 4096); err != nil {
		t.Fatal(err)
	}
	if c.MaxBodyBytes != 10 || c.LogLevel != slog.LevelWarn || c.ListenAddr != "127.0.0.1:0" || c.MetricsNamespace != "Ns" {
		t.Fatalf("overrides: %+v", c)
	}
}

func TestFromEnvReportsEveryProblemWithoutSecrets(t *testing.T) {
	_, err := FromEnv(env(map[string]string{
		"DATABASE_URL":   "postgres://u:hunter2@host:notaport/db",
		"MAX_BODY_BYTES": "-1",
		"LOG_LEVEL":      "loud",
	}), 4096)
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{"DATABASE_URL is invalid", "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY", "MAX_BODY_BYTES", "LOG_LEVEL"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %s:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "hunter2") {
		t.Errorf("error leaks the database password:\n%s", msg)
	}
}
