package publish

// ConfigError is one invalid field of a configuration (relay.Config, the QStash publisher's,
// retention's). Callers that fill a field from their own source (an environment variable,
// a flag) find the field with errors.As and say which setting to fix, without reading the
// message.
type ConfigError struct {
	// Config names the configuration ("relay", "qstash publisher", "retention").
	Config string
	// Field is the Go field name, e.g. "Lease".
	Field string
	// Reason says what is wrong with the value and what it must be.
	Reason string
}

// Error reads "<config> config <field>: <reason>".
func (e *ConfigError) Error() string { return e.Config + " config " + e.Field + ": " + e.Reason }
