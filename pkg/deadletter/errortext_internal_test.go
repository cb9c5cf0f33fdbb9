package deadletter

import (
	"strings"
	"testing"
)

// TestErrorTextCarriesTheReason: a destination's "message" (the webhook's reason for a
// Permanent handler error) follows the status in the letter's error, on one line, without
// NUL and bounded; without one the text is the status alone.
func TestErrorTextCarriesTheReason(t *testing.T) {
	t.Parallel()
	const head = "qstash delivery failed: HTTP 489 after 0 of 3 retries"
	long := strings.Repeat("x", 2*maxReasonBytes)
	for _, c := range []struct{ body, want string }{
		{``, head},
		{`{"error":"rejected"}`, head},
		{`not json`, head},
		{`{"error":"rejected","message":"  "}`, head},
		{`{"error":"rejected","message":"amount_cents 0 is not positive"}`, head + ": amount_cents 0 is not positive"},
		{`{"error":"rejected","message":"a\u0000b\nc"}`, head + ": a b c"},
		{`{"error":"rejected","message":"` + long + `"}`, head + ": " + long[:maxReasonBytes-len("…")] + "…"},
	} {
		f := DeliveryFailure{Status: 489, MaxRetries: 3, ResponseBody: []byte(c.body)}
		if got := f.errorText(); got != c.want {
			t.Errorf("body %.40q: error %q, want %q", c.body, got, c.want)
		}
	}
}
