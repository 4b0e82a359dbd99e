package door

import "sync"

// Waiting bounds the checks and batches that wait on the origin at once
// (each holds a goroutine and a place in a cell's queue while it waits),
// and shares the bound between keys, the tenants the doors name (a
// workspace, an Envoy domain): no key takes more than its share while
// others wait, so one tenant's flood of cold identifiers, or one message of
// a thousand, leaves room for the checks of everyone else.
//
// A key's share is the bound divided by the keys waiting (itself
// counted); a key alone may take three quarters of it, so a key that comes
// later finds room at once. Only checks that actually wait are to be
// counted: the doors try the lease and the local counts first
// (service.Service.TryCheck) and take a place only when the check must wait.
// A check that finds no place is decided as the doors say (locally, as
// while the origin fails, and counted apart).
//
// Waiting is safe for concurrent use. The zero value holds no place; use
// NewWaiting.
type Waiting struct {
	max  int
	mu   sync.Mutex
	n    int
	keys map[string]int
}

// NewWaiting returns a bound of n places (at least 1).
func NewWaiting(n int) *Waiting {
	return &Waiting{max: max(n, 1), keys: make(map[string]int)}
}

// Acquire takes a place for key and reports whether it did: not when
// every place is taken, nor when key holds its share already. A place
// taken is given back with Release.
func (w *Waiting) Acquire(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n >= w.max {
		return false
	}
	held, ok := w.keys[key]
	active := len(w.keys)
	if !ok {
		active++
	}
	share := w.max / active
	if active == 1 {
		share = w.max - w.max/4
	}
	if held >= max(share, 1) {
		return false
	}
	w.keys[key] = held + 1
	w.n++
	return true
}

// Release gives back a place Acquire took for key.
func (w *Waiting) Release(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch held := w.keys[key]; {
	case held > 1:
		w.keys[key] = held - 1
	case held == 1:
		delete(w.keys, key)
	default:
		return // not taken: nothing to give back
	}
	w.n--
}

// Len returns how many places are taken.
func (w *Waiting) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}
