package rtrs

import "github.com/urnbd/urnbd/internal/wiretest"

var (
	hx        = wiretest.Hex
	wantErr   = wiretest.WantErr
	mustNoErr = wiretest.NoErr
)
