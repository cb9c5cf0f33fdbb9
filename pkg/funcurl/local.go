package funcurl

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
)

// NewLocalServer returns the net/http server a receiver function uses when it runs outside
// Lambda (LISTEN_ADDR): the same handler, with every timeout set, because unlike a Function
// URL (which buffers the request) a plain server would let a slow body hold a handler and
// its database connection indefinitely.
func NewLocalServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}

// Serve runs h the way a receiver's main does: over net/http on listenAddr when it is set
// (local stack, tests), else as the Lambda Function URL handler (lambda.Start, which does
// not return). It returns only the local server's error.
func Serve(h http.Handler, listenAddr string, cfg Config) error {
	if listenAddr == "" {
		lambda.Start(New(h, cfg))
		return nil
	}
	if cfg.Logger != nil {
		cfg.Logger.Info("listening", slog.String("addr", listenAddr))
	}
	return NewLocalServer(listenAddr, h).ListenAndServe()
}
