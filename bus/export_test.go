package bus

// Queued returns how many calls to workspace wait in c's queue to be
// coalesced, for the tests.
func Queued(c *Client, workspace string) int {
	l := c.laneFor(workspace)
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// InFlight returns how many messages of workspace's lane are in flight.
func InFlight(c *Client, workspace string) int {
	l := c.laneFor(workspace)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight
}
