package receive_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/v3/internal/receive"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

func TestFromURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		query string
		want  qstash.Identity
		err   error
	}{
		{"outbox_id=42&generation=0", qstash.Identity{OutboxID: 42}, nil},
		{"generation=3&x=1&outbox_id=0042", qstash.Identity{OutboxID: 42, Generation: 3}, nil},
		{"", qstash.Identity{}, receive.ErrNoIdentity},
		{"src=relay", qstash.Identity{}, receive.ErrNoIdentity},
		{"outbox_id=42", qstash.Identity{}, receive.ErrInvalidIdentity},
		{"generation=1", qstash.Identity{}, receive.ErrInvalidIdentity},
		{"outbox_id=42&outbox_id=43&generation=0", qstash.Identity{}, receive.ErrInvalidIdentity},
		{"outbox_id=0&generation=0", qstash.Identity{}, receive.ErrInvalidIdentity},
		{"outbox_id=-1&generation=0", qstash.Identity{}, receive.ErrInvalidIdentity},
		{"outbox_id=x&generation=0", qstash.Identity{}, receive.ErrInvalidIdentity},
		{"outbox_id=1&generation=-1", qstash.Identity{}, receive.ErrInvalidIdentity},
		{"outbox_id=1&generation=99999999999", qstash.Identity{}, receive.ErrInvalidIdentity},
		{"outbox_id=1&generation=0;x", qstash.Identity{}, receive.ErrInvalidIdentity},
	}
	for _, c := range cases {
		got, err := receive.FromURL(&url.URL{RawQuery: c.query})
		if !errors.Is(err, c.err) || (c.err == nil && got != c.want) {
			t.Errorf("%q: %+v %v, want %+v %v", c.query, got, err, c.want, c.err)
		}
	}
	if got, err := receive.FromRawURL("https://h.example/events/t?outbox_id=7&generation=2"); err != nil || got.MessageID() != "7" || got.Generation != 2 {
		t.Errorf("FromRawURL: %+v %v", got, err)
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	id := qstash.Identity{OutboxID: 5, Generation: 1}
	h := http.Header{}
	if receive.Contradicts(id, h.Get) {
		t.Error("absent headers contradict")
	}
	h.Set("X-Outbox-Id", "5")
	h.Set("X-Outbox-Generation", "1")
	if receive.Contradicts(id, h.Get) {
		t.Error("agreeing headers contradict")
	}
	for name, v := range map[string]string{"X-Outbox-Id": "6", "X-Outbox-Generation": "0"} {
		bad := h.Clone()
		bad.Set(name, v)
		if !receive.Contradicts(id, bad.Get) {
			t.Errorf("%s: %s does not contradict", name, v)
		}
	}
	fwd := http.Header{"Upstash-Forward-X-Outbox-Id": {"6"}}
	if !receive.Contradicts(id, fwd.Get) {
		t.Error("Upstash-Forward-X-Outbox-Id: 6 does not contradict")
	}
	m := receive.HeaderMap(map[string][]string{"upstash-forward-x-outbox-id": {" 9 "}, "X-OUTBOX-GENERATION": {"2"}})
	if got, err := receive.FromHeaders(m); err != nil || got != (qstash.Identity{OutboxID: 9, Generation: 2}) {
		t.Errorf("FromHeaders: %+v %v", got, err)
	}
	if _, err := receive.FromHeaders(http.Header{}.Get); !errors.Is(err, receive.ErrNoIdentity) {
		t.Errorf("no headers: %v", err)
	}
}

func TestReplyWrite(t *testing.T) {
	t.Parallel()
	if receive.ReplyTooLarge.Status != receive.StatusNonRetryable {
		t.Fatalf("an oversized body is answered %d; QStash retries (and bills) anything but 489 + %s", receive.ReplyTooLarge.Status, receive.HeaderNonRetryable)
	}
	for _, c := range []struct {
		rep          receive.Reply
		body         string
		nonRetryable bool
	}{
		{receive.Reply{Status: 200, Code: "processed"}, `{"outcome":"processed"}` + "\n", false},
		{receive.Reply{Status: receive.StatusNonRetryable, Code: "rejected"}, `{"error":"rejected"}` + "\n", true},
		{receive.ReplyTooLarge, `{"error":"body_too_large"}` + "\n", true},
		// QStash documents no other non-retryable status: a 413 would be retried anyway.
		{receive.Reply{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large"}, `{"error":"body_too_large"}` + "\n", false},
		{receive.ReplyUnauthorized, `{"error":"unauthorized"}` + "\n", false},
		{receive.ReplyConfig, `{"error":"configuration_error"}` + "\n", false},
	} {
		w := httptest.NewRecorder()
		c.rep.Write(w)
		if w.Code != c.rep.Status || w.Body.String() != c.body || (w.Header().Get(receive.HeaderNonRetryable) == "true") != c.nonRetryable ||
			w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%+v: %d %q %v", c.rep, w.Code, w.Body, w.Header())
		}
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in    string
		limit int
		want  string
	}{
		{"", 10, ""},
		{"amount_cents 0 is not positive", 100, "amount_cents 0 is not positive"},
		{"  line one\n\tline two\r\n", 100, "line one line two"},
		{"nul\x00and\x1bescape", 100, "nul and escape"},
		{"bad \xff byte", 100, "bad \uFFFD byte"},
		{"abcdefghij", 10, "abcdefghij"},
		{"abcdefghijk", 10, "abcdefg…"},
		// Cut at a rune boundary: "é" is two bytes, and the cut must not split it.
		{"ééééé", 8, "éé…"},
	} {
		got := receive.OneLine(c.in, c.limit)
		if got != c.want || len(got) > c.limit || !utf8.ValidString(got) {
			t.Errorf("OneLine(%q, %d) = %q, want %q", c.in, c.limit, got, c.want)
		}
	}
}

// TestAnswerMessage: a message set on the Answer goes in the body beside the code, as JSON.
func TestAnswerMessage(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	a := &receive.Answer{W: w, R: httptest.NewRequest(http.MethodPost, "/", nil), Log: slog.New(slog.DiscardHandler),
		Message: `order "o-1": amount <0>`}
	a.Reply(receive.Reply{Status: receive.StatusNonRetryable, Code: "rejected"}, slog.LevelWarn, "rejected")
	var body map[string]string
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || len(body) != 2 || body["error"] != "rejected" || body["message"] != a.Message {
		t.Fatalf("body %q (%v)", w.Body, err)
	}
}
