package tcp

import (
	"github.com/urnbd/urnbd/internal/wiretest"
)

var (
	mustNoErr = wiretest.NoErr
)

// onQueue runs fn on q's thread, soon (ClientQueue.Do).
func onQueue(q *ClientQueue, fn func(q *ClientQueue)) { q.Do(func() { fn(q) }) }
