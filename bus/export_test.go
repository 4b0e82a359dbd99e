package bus

import "time"

// Queued returns how many calls to workspace wait in c's queue to be
// coalesced, for the tests.
func Queued(c *Client, workspace string) int {
	l := c.laneFor(workspace)
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// SetMinSpill sets how long a message of workspace's lane must be out
// before the calls behind it leave beside it, at least, for the tests.
func SetMinSpill(c *Client, workspace string, d time.Duration) {
	l := c.laneFor(workspace)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.minSpill = d
}

// InFlight returns how many messages of workspace's lane are in flight.
func InFlight(c *Client, workspace string) int {
	l := c.laneFor(workspace)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight
}
