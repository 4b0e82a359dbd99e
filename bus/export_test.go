package bus

// Queued returns how many calls to workspace wait in c's queue to be
// coalesced, for the tests.
func Queued(c *Client, workspace string) int {
	l := c.laneFor(workspace)
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}
