package funcurl

import (
	"net/http"
	"time"
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
