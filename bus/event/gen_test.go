package event

import (
	"testing"

	"github.com/sluicehq/sluice/internal/msgptest"
)

// TestGeneratedCodeIsFresh fails when msg_gen.go is not what msgp makes of
// msg.go: run `go generate ./bus/event` and commit.
func TestGeneratedCodeIsFresh(t *testing.T) { msgptest.CheckGenerated(t) }
