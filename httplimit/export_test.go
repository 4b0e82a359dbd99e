package httplimit

import "time"

// SetNow sets the clock m reads the RateLimit field's t against.
func SetNow(m *Middleware, now func() time.Time) { m.now = now }
