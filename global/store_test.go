package global_test

import (
	"testing"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/storetest"
)

func TestMemoryStoreContract(t *testing.T) {
	storetest.Contract(t, func(t *testing.T) global.Store {
		s := global.NewMemoryStore()
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
