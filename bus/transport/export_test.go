package transport

import "time"

// hookFuncs are checksHooks made of functions, either of which may be nil.
type hookFuncs struct {
	before   func(identifier string, i int)
	deadline func(identifier string, deadline time.Time)
}

func (h hookFuncs) beforeCheck(identifier string, i int) {
	if h.before != nil {
		h.before(identifier, i)
	}
}

func (h hookFuncs) waitDeadline(identifier string, deadline time.Time) {
	if h.deadline != nil {
		h.deadline(identifier, deadline)
	}
}

// onBeforeCheck makes f run before the checks endpoint decides the check of
// index i of a message, which names identifier.
func (l *Limiter) onBeforeCheck(f func(identifier string, i int)) { l.hooks = hookFuncs{before: f} }

// onWaitDeadline makes f receive the deadline of each check of a checks
// message that waits in its identifier's group.
func (l *Limiter) onWaitDeadline(f func(identifier string, deadline time.Time)) {
	l.hooks = hookFuncs{deadline: f}
}
