package relay

// ForgetCircuits drops the relay's cached view of the open circuits, so the next drain
// reads them (tests move the circuits' clock in SQL, faster than the refresh).
func (r *Relay) ForgetCircuits() { r.circuits.forget() }
