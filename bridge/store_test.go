package bridge_test

import (
	"testing"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/internal/storetest"
)

func TestMemoryStoreContract(t *testing.T) {
	storetest.Contract(t, func(t *testing.T) bridge.Store {
		s := bridge.NewMemoryStore()
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
