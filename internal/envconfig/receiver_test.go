package envconfig

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

func TestReadWebhookDefaultsAndOverrides(t *testing.T) {
	m := map[string]string{
		"DATABASE_URL":               "postgres://u@127.0.0.1:5432/db",
		"QSTASH_CURRENT_SIGNING_KEY": "cur",
		"QSTASH_NEXT_SIGNING_KEY":    "next",
	}
	c, err := ReadWebhook(4096)(env(m))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBodyBytes != 4096 || c.LogLevel != slog.LevelInfo || c.ListenAddr != "" || c.MetricsNamespace != "" {
		t.Fatalf("defaults: %+v", c)
	}
	if _, err := qstash.NewVerifier(c.VerifierConfig()); err != nil {
		t.Fatalf("verifier from valid keys: %v", err)
	}
	m["MAX_BODY_BYTES"], m["LOG_LEVEL"], m["LISTEN_ADDR"], m["METRICS_NAMESPACE"] = "10", "WARN", "127.0.0.1:0", "Ns"
	if c, err = ReadWebhook(4096)(env(m)); err != nil {
		t.Fatal(err)
	}
	if c.MaxBodyBytes != 10 || c.LogLevel != slog.LevelWarn || c.ListenAddr != "127.0.0.1:0" || c.MetricsNamespace != "Ns" {
		t.Fatalf("overrides: %+v", c)
	}
}

func TestReadReceiverReportsEveryProblemWithoutSecrets(t *testing.T) {
	_, err := ReadWebhook(4096)(env(map[string]string{
		"DATABASE_URL":   "postgres://u:hunter2@host:notaport/db",
		"MAX_BODY_BYTES": "-1",
		"LOG_LEVEL":      "loud",
	}))
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{"DATABASE_URL: is not a valid", "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY", "MAX_BODY_BYTES", "LOG_LEVEL"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %s:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "hunter2") {
		t.Errorf("error leaks the database password:\n%s", msg)
	}
}

// TestReceiverURLs: each receiver reads its own public URL under the one name the relay
// uses for it too, and refuses a relative one naming the variable.
func TestReceiverURLs(t *testing.T) {
	t.Parallel()
	m := map[string]string{
		"DATABASE_URL": "postgres://u@127.0.0.1:5432/db", "QSTASH_CURRENT_SIGNING_KEY": "c", "QSTASH_NEXT_SIGNING_KEY": "n",
		"PUBLIC_BASE_URL": "https://hooks.example.com", "FAILURE_CALLBACK_URL": "https://fail.example.com/cb",
	}
	w, err := ReadWebhook(1)(env(m))
	if err != nil || w.PublicURL != "https://hooks.example.com" {
		t.Fatalf("webhook: %+v %v", w, err)
	}
	f, err := ReadFailure(1)(env(m))
	if err != nil || f.PublicURL != "https://fail.example.com/cb" {
		t.Fatalf("failure: %+v %v", f, err)
	}
	m["FAILURE_CALLBACK_URL"], m["PUBLIC_BASE_URL"] = "/cb", "hooks.example.com"
	if _, err := ReadFailure(1)(env(m)); !vars(err)["FAILURE_CALLBACK_URL"] {
		t.Fatalf("relative FAILURE_CALLBACK_URL: %v", err)
	}
	if _, err := ReadWebhook(1)(env(m)); !vars(err)["PUBLIC_BASE_URL"] {
		t.Fatalf("PUBLIC_BASE_URL without a scheme: %v", err)
	}
}

// TestByVariableNamesReceiverVariables: a field the webhook, the failure callback or the
// verifier refuses is reported under the variable that set it; a field no variable sets
// stays the library's *publish.ConfigError.
func TestByVariableNamesReceiverVariables(t *testing.T) {
	t.Parallel()
	m := map[string]string{
		"DATABASE_URL": "postgres://u@127.0.0.1:5432/db", "QSTASH_CURRENT_SIGNING_KEY": "c", "QSTASH_NEXT_SIGNING_KEY": "n",
		"PUBLIC_BASE_URL": "https://hooks.example.com/#top",
	}
	// The reader and the webhook check a base URL alike (configcheck.BaseURL): the reader
	// refuses the fragment itself, and a fragment added after it is the webhook's to refuse.
	if _, err := ReadWebhook(1)(env(m)); !slices.Equal(Vars(err), []string{"PUBLIC_BASE_URL"}) {
		t.Fatalf("PUBLIC_BASE_URL with a fragment: %v", err)
	}
	m["PUBLIC_BASE_URL"] = "https://hooks.example.com/"
	w, err := ReadWebhook(1)(env(m))
	if err != nil {
		t.Fatal(err)
	}
	_, err = webhook.New(webhook.Config{PublicBaseURL: w.PublicURL + "#top", Handlers: webhook.Handlers{"t": nil}})
	err = w.ByVariable(err)
	if got := Vars(err); !slices.Equal(got, []string{"PUBLIC_BASE_URL"}) || !strings.Contains(err.Error(), "PUBLIC_BASE_URL: webhook config PublicBaseURL:") {
		t.Fatalf("variables %v in:\n%v", got, err)
	}
	var ce *publish.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Pool" {
		t.Fatalf("the first problem is not the Pool's ConfigError: %v", err)
	}

	f, err := ReadFailure(1)(env(m))
	if err != nil {
		t.Fatal(err)
	}
	_, err = deadletter.NewCallbackHandler(deadletter.CallbackConfig{FailureURL: "nope", MaxBodyBytes: -1})
	if got := Vars(f.ByVariable(err)); !slices.Equal(got, []string{"MAX_BODY_BYTES", "FAILURE_CALLBACK_URL"}) {
		t.Fatalf("failure callback: variables %v in:\n%v", got, err)
	}
	_, err = qstash.NewVerifier(qstash.VerifierConfig{CurrentSigningKey: "c"})
	if got := Vars(f.ByVariable(err)); !slices.Equal(got, []string{"QSTASH_NEXT_SIGNING_KEY"}) {
		t.Fatalf("verifier: variables %v in:\n%v", got, err)
	}
	plain := errors.New("connect: refused")
	if got := f.ByVariable(plain); got != plain {
		t.Fatalf("an error without a ConfigError changed: %v", got)
	}
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "0d": 0, "90s": 90 * time.Second, "1h30m": 90 * time.Minute} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"d", "1.5d", "x", "-d"} {
		if _, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) accepted", in)
		}
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func vars(err error) map[string]bool {
	out := map[string]bool{}
	for _, v := range Vars(err) {
		out[v] = true
	}
	return out
}
