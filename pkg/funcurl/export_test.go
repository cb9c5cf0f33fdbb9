package funcurl

// The request conversion and its errors, for the external tests that check it directly.
var (
	NewRequest      = newRequest
	ErrBodyTooLarge = errBodyTooLarge
	ErrBadRequest   = errBadRequest
)
