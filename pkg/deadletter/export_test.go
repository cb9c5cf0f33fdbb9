package deadletter

// ErrorText is the error text a delivery failure records, for the tests that compare it.
func (f DeliveryFailure) ErrorText() string { return f.errorText() }
