package frame_test

import "github.com/urnbd/urnbd/internal/wiretest"

var (
	wantErr   = wiretest.WantErr
	mustNoErr = wiretest.NoErr
)
