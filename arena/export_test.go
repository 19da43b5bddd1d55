package arena

// ForgetDefaultDrivers drops the drivers DefaultDriver opened, so that a test
// that registered a selector of its own leaves none behind.
func ForgetDefaultDrivers() {
	defaults.Lock()
	defaults.m = nil
	defaults.Unlock()
}
