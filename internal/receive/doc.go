// Package receive is the step every QStash receiver starts with (the webhook and the
// failure-callback recorder): read the body under a limit, rebuild the URL QStash signed
// from trusted configuration, verify the signature on the raw bytes, and answer whatever
// fails with a fixed status, a short JSON code, one log line and one metric. It also holds
// the QStash header names, the status table those receivers answer from, and the message
// identity the relay puts in the signed destination URL.
//
// Status table (the receivers add their own rows with the same Reply type):
//
//	signature missing, invalid, expired,    401 unauthorized (nothing written)
//	  or headers that contradict the
//	  signed identity
//	body over the limit, or permanent       489 + Upstash-NonRetryable-Error: true
//	  (the receiver's own rows)                 (QStash stops retrying; it documents no
//	                                            other status as non-retryable, so a
//	                                            413 would be retried and billed)
//	body unreadable, configuration error,   500 (QStash retries)
//	  database down
package receive
