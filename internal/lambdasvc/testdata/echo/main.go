// Command echo is the Lambda function of package lambdasvc's tests: it sleeps as asked,
// fails when asked, and returns its payload.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
)

type request struct {
	SleepMS int    `json:"sleep_ms"`
	Fail    string `json:"fail"`
	ID      int    `json:"id"`
}

func handle(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
	var r request
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	select {
	case <-time.After(time.Duration(r.SleepMS) * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if r.Fail != "" {
		return nil, errors.New(r.Fail)
	}
	return raw, nil
}

func main() { lambda.Start(handle) }
