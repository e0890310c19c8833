package firmware

// Closing reports whether Close has marked the channel closed, for the
// external tests that check what Close waits for.
func (c *Channel) Closing() bool { return c.closed.Load() }
