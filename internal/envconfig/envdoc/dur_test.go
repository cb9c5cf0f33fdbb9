package envdoc

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
)

// TestDurReadsBackAsWritten: every default the reference prints is what the readers would
// parse back; "30s" once printed as "3" (a zero tail was cut from inside a unit).
func TestDurReadsBackAsWritten(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		30 * time.Second:           "30s",
		10 * time.Second:           "10s",
		time.Second:                "1s",
		500 * time.Millisecond:     "500ms",
		time.Minute:                "1m",
		10 * time.Minute:           "10m",
		90 * time.Second:           "1m30s",
		time.Hour:                  "1h",
		20 * time.Hour:             "20h",
		90 * time.Minute:           "1h30m",
		time.Hour + 10*time.Second: "1h0m10s",
		7 * 24 * time.Hour:         "7d",
		0:                          "0s",
	} {
		got := dur(d)
		if got != want {
			t.Errorf("dur(%v) = %q, want %q", d, got, want)
		}
		back, err := envconfig.ParseDuration(got)
		if err != nil || back != d {
			t.Errorf("dur(%v) = %q reads back as %v, %v", d, got, back, err)
		}
	}
}
