package markers

// SetPresenceMinCap lets tests make the presence filter grow after a few keys.
func SetPresenceMinCap(n uint) (restore func()) {
	old := presenceMinCap
	presenceMinCap = n
	return func() { presenceMinCap = old }
}
