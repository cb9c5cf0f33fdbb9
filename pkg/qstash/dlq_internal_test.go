package qstash

import "testing"

// TestDecodeDLQPage: header values as lists or strings, bodies as text or base64, numbers
// as numbers or strings (qstash-contract.md §9); an entry in forms QStash does not document
// does not fail the page, what cannot be read is left empty.
func TestDecodeDLQPage(t *testing.T) {
	t.Parallel()
	page, next, err := decodeDLQPage([]byte(`{"cursor":"c2","messages":[{"dlqId":"1725323658779-0","messageId":"msg_1",
		"url":"https://hooks.example.com/events/order.created?outbox_id=7&generation=1",
		"header":{"X-Outbox-Id":["7"],"Content-Type":"application/json"},"body":"{\"a\":1}","maxRetries":"3",
		"queueName":"outbox-2","responseStatus":500,"responseHeader":{"Retry-After":"10"},
		"responseBodyBase64":"/w=="}]}`))
	if err != nil || next != "c2" || len(page) != 1 {
		t.Fatalf("first page: %+v %q %v", page, next, err)
	}
	e := page[0]
	if e.DLQID != "1725323658779-0" || e.MessageID != "msg_1" || e.Header.Get("X-Outbox-Id") != "7" || e.Header.Get("Content-Type") != "application/json" ||
		string(e.Body) != `{"a":1}` || e.MaxRetries != 3 || e.QueueName != "outbox-2" || e.ResponseStatus != 500 ||
		e.ResponseHeader.Get("Retry-After") != "10" || string(e.ResponseBody) != "\xff" {
		t.Fatalf("entry %+v", e)
	}
	page, next, err = decodeDLQPage([]byte(`{"messages":[{"dlqId":"d2","messageId":"msg_2","url":"https://x/","bodyBase64":"AAE=","responseBody":"oops"},
		{"dlqId":"d3","header":{"X-Outbox-Id":7,"A":["b"]},"bodyBase64":"%%%","maxRetries":"many","responseStatus":{}}]}`))
	if err != nil || next != "" || len(page) != 2 || string(page[0].Body) != "\x00\x01" || string(page[0].ResponseBody) != "oops" {
		t.Fatalf("last page: %+v %q %v", page, next, err)
	}
	if odd := page[1]; odd.DLQID != "d3" || odd.MessageID != "" || odd.Header.Get("X-Outbox-Id") != "" || odd.Header.Get("A") != "b" ||
		odd.Body != nil || odd.MaxRetries != 0 || odd.ResponseStatus != 0 {
		t.Fatalf("odd entry %+v", odd)
	}
	if _, _, err := decodeDLQPage([]byte(`<html>`)); err == nil {
		t.Fatal("a page that is not JSON decoded")
	}
}
