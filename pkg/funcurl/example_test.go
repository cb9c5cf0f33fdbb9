package funcurl_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"

	"github.com/aws/aws-lambda-go/events"

	"github.com/outbox-relay/outbox-relay/v3/pkg/funcurl"
)

// New turns an http.Handler into a Function URL Lambda's handler: the event becomes a
// request (its body base64-decoded when the event says so) and the response an event.
// A Lambda's main passes the result to lambda.Start, or calls funcurl.Serve, which also
// serves the handler over plain HTTP for local runs.
func ExampleNew() {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, "%s %s%s got %s", r.Method, r.Host, r.URL.Path, body)
	})
	fn := funcurl.New(h, funcurl.Config{})

	res, err := fn(context.Background(), events.LambdaFunctionURLRequest{
		RawPath: "/events/order.created",
		Body:    "eyJvcmRlciI6Im8tMSJ9", // {"order":"o-1"}
		RequestContext: events.LambdaFunctionURLRequestContext{
			DomainName: "abc123.lambda-url.eu-west-1.on.aws",
			HTTP:       events.LambdaFunctionURLRequestContextHTTPDescription{Method: http.MethodPost},
		},
		IsBase64Encoded: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.StatusCode, res.Body)
	// Output:
	// 202 POST abc123.lambda-url.eu-west-1.on.aws/events/order.created got {"order":"o-1"}
}
