package qstashtest

// Backoff is QStash's default retry delay, for the test that pins its documented table.
var Backoff = backoff

// QuotaUsed is the number of messages counted against the quota, for the quota tests.
func (s *Server) QuotaUsed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quotaUsed
}
