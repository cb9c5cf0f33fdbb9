package qstash_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

func TestDecodeFailureCallback(t *testing.T) {
	t.Parallel()
	created := time.UnixMilli(1725323658779).UTC()
	notBefore := time.UnixMilli(1725323658000).UTC()
	full := qstash.FailureCallback{
		Status:          500,
		Header:          http.Header{"Content-Type": {"text/plain"}, "X-Multi": {"a", "b"}},
		Body:            []byte("boom"),
		Retried:         3,
		MaxRetries:      3,
		DLQID:           "1725323658779-0",
		SourceMessageID: "msg_abc",
		URL:             "https://example.com/events/order.created",
		Method:          "POST",
		SourceHeader:    http.Header{"X-Outbox-Id": {"42"}, "Content-Type": {"application/json"}},
		SourceBody:      []byte(`{"order_id":"o-1"}`),
		NotBefore:       notBefore,
		CreatedAt:       created,
		TopicName:       "group",
		EndpointName:    "ep",
		ScheduleID:      "scd_1",
		CallerIP:        "127.0.0.1",
	}
	tests := []struct {
		name string
		in   string
		want qstash.FailureCallback
	}{
		{
			name: "numbers and header lists",
			in: `{"status":500,"header":{"Content-Type":["text/plain"],"X-Multi":["a","b"]},"body":"Ym9vbQ==",
				"retried":3,"maxRetries":3,"dlqId":"1725323658779-0","sourceMessageId":"msg_abc",
				"url":"https://example.com/events/order.created","method":"POST",
				"sourceHeader":{"X-Outbox-Id":["42"],"Content-Type":["application/json"]},
				"sourceBody":"eyJvcmRlcl9pZCI6Im8tMSJ9","notBefore":1725323658000,"createdAt":1725323658779,
				"topicName":"group","endpointName":"ep","scheduleId":"scd_1","callerIP":"127.0.0.1"}`,
			want: full,
		},
		{
			name: "strings for timestamps and header values, unknown fields, unpadded base64",
			in: `{"status":"500","header":{"content-type":"text/plain","X-Multi":["a","b"]},"body":"Ym9vbQ",
				"retried":"3","maxRetries":3,"dlqId":"1725323658779-0","sourceMessageId":"msg_abc",
				"url":"https://example.com/events/order.created","method":"POST",
				"sourceHeader":{"x-outbox-id":"42","Content-Type":"application/json"},
				"sourceBody":"eyJvcmRlcl9pZCI6Im8tMSJ9","notBefore":"1725323658000","createdAt":"1725323658779",
				"topicName":"group","endpointName":"ep","scheduleId":"scd_1","callerIP":"127.0.0.1",
				"label":"x","somethingNew":{"nested":[1,2]}}`,
			want: full,
		},
		{
			name: "minimal",
			in:   `{"sourceMessageId":"msg_1","status":0,"header":null,"notBefore":null}`,
			want: qstash.FailureCallback{SourceMessageID: "msg_1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := qstash.DecodeFailureCallback([]byte(tt.in))
			if err != nil {
				t.Fatalf("DecodeFailureCallback: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestDecodeFailureCallbackRejects(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"not json":               `<html>502</html>`,
		"array":                  `[{"sourceMessageId":"m"}]`,
		"missing source id":      `{"status":500,"body":"Ym9vbQ=="}`,
		"empty source id":        `{"sourceMessageId":""}`,
		"bad body base64":        `{"sourceMessageId":"m","body":"***"}`,
		"bad sourceBody base64":  `{"sourceMessageId":"m","sourceBody":"%%%"}`,
		"non numeric status":     `{"sourceMessageId":"m","status":"five hundred"}`,
		"fractional createdAt":   `{"sourceMessageId":"m","createdAt":1.5}`,
		"header value is object": `{"sourceMessageId":"m","header":{"A":{"b":1}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := qstash.DecodeFailureCallback([]byte(in))
			if !errors.Is(err, qstash.ErrBadFailureCallback) {
				t.Fatalf("err = %v, want ErrBadFailureCallback", err)
			}
		})
	}
}

func TestFailureCallbackMarshalRoundTrip(t *testing.T) {
	t.Parallel()
	in := qstash.FailureCallback{
		Status: 489, Header: http.Header{"Upstash-Nonretryable-Error": {"true"}}, Body: []byte{0, 1, 2},
		Retried: 0, MaxRetries: 3, DLQID: "1-0", SourceMessageID: "msg_x", URL: "http://127.0.0.1/x",
		Method: "POST", SourceHeader: http.Header{"X-Outbox-Id": {"7"}}, SourceBody: []byte("{}"),
		CreatedAt: time.UnixMilli(1700000000123).UTC(),
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := qstash.DecodeFailureCallback(b)
	if err != nil {
		t.Fatalf("decode own encoding %s: %v", b, err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n in  %+v\n out %+v", in, out)
	}
}

// FuzzDecodeFailureCallback: the decoder never panics, never accepts a body without a source
// message id, and whatever it accepts survives MarshalJSON and a second decode unchanged.
func FuzzDecodeFailureCallback(f *testing.F) {
	f.Add([]byte(`{"sourceMessageId":"msg_1","status":500,"body":"Ym9vbQ==","createdAt":"1725323658779"}`))
	f.Add([]byte(`{"sourceMessageId":"m","sourceHeader":{"a":"b","c":["d","e"]},"notBefore":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fc, err := qstash.DecodeFailureCallback(data)
		if err != nil {
			if !errors.Is(err, qstash.ErrBadFailureCallback) {
				t.Fatalf("error does not wrap ErrBadFailureCallback: %v", err)
			}
			return
		}
		if fc.SourceMessageID == "" {
			t.Fatal("accepted a callback without sourceMessageId")
		}
		enc, err := json.Marshal(fc)
		if err != nil {
			t.Fatalf("marshal decoded callback: %v", err)
		}
		again, err := qstash.DecodeFailureCallback(enc)
		if err != nil {
			t.Fatalf("decode own encoding %s: %v", enc, err)
		}
		enc2, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("not stable:\n%s\n%s", enc, enc2)
		}
	})
}
