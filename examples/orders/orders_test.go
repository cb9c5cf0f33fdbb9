package orders_test

import (
	"errors"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/examples/orders"
)

func TestParseOrderCreated(t *testing.T) {
	t.Parallel()
	valid := orders.Payload{OrderID: "o-1", AmountCents: 1250, Currency: "EUR"}
	cases := []struct {
		name string
		in   string
		ok   bool
	}{
		{"valid", `{"order_id":"o-1","amount_cents":1250,"currency":"EUR"}`, true},
		{"unknown fields ignored", `{"order_id":"o-1","amount_cents":1250,"currency":"EUR","note":{"x":1}}`, true},
		{"not an object", `[1,2]`, false},
		{"null", `null`, false},
		{"string", `"x"`, false},
		{"missing order_id", `{"amount_cents":1250,"currency":"EUR"}`, false},
		{"empty order_id", `{"order_id":"","amount_cents":1250,"currency":"EUR"}`, false},
		{"null order_id", `{"order_id":null,"amount_cents":1250,"currency":"EUR"}`, false},
		{"numeric order_id", `{"order_id":7,"amount_cents":1250,"currency":"EUR"}`, false},
		{"control char in order_id", `{"order_id":"a\nb","amount_cents":1250,"currency":"EUR"}`, false},
		{"long order_id", `{"order_id":"` + string(make129()) + `","amount_cents":1250,"currency":"EUR"}`, false},
		{"missing amount", `{"order_id":"o-1","currency":"EUR"}`, false},
		{"zero amount", `{"order_id":"o-1","amount_cents":0,"currency":"EUR"}`, false},
		{"negative amount", `{"order_id":"o-1","amount_cents":-5,"currency":"EUR"}`, false},
		{"fractional amount", `{"order_id":"o-1","amount_cents":12.5,"currency":"EUR"}`, false},
		{"float-spelled amount", `{"order_id":"o-1","amount_cents":1.0,"currency":"EUR"}`, false},
		{"exponent amount", `{"order_id":"o-1","amount_cents":1e3,"currency":"EUR"}`, false},
		{"string amount", `{"order_id":"o-1","amount_cents":"1250","currency":"EUR"}`, false},
		{"overflowing amount", `{"order_id":"o-1","amount_cents":99999999999999999999,"currency":"EUR"}`, false},
		{"lower-case currency", `{"order_id":"o-1","amount_cents":1250,"currency":"eur"}`, false},
		{"long currency", `{"order_id":"o-1","amount_cents":1250,"currency":"EURO"}`, false},
		{"missing currency", `{"order_id":"o-1","amount_cents":1250}`, false},
	}
	for _, c := range cases {
		p, err := orders.Parse([]byte(c.in))
		if c.ok {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			} else if p != valid {
				t.Errorf("%s: got %+v", c.name, p)
			}
			continue
		}
		if !errors.Is(err, orders.ErrInvalidPayload) {
			t.Errorf("%s: error %v, want ErrInvalidPayload", c.name, err)
		}
	}
}

func make129() []byte {
	b := make([]byte, orders.MaxOrderIDBytes+1)
	for i := range b {
		b[i] = 'a'
	}
	return b
}
