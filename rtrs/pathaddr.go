package rtrs

import (
	"fmt"
	"syscall"
)

// PathAddr names one path of a client session: Dst is the server's
// address, Src optionally the local IP to connect from. The transport
// says what Dst looks like (over TCP "host:port"; over RDMA "ip:port" or
// "ip", port DefaultPort).
type PathAddr struct {
	Src string
	Dst string
}

// String returns "src@dst" or "dst", as RTRS names paths.
func (a PathAddr) String() string {
	if a.Src == "" {
		return a.Dst
	}
	return a.Src + "@" + a.Dst
}

// CheckAddPath applies the rules for adding path a to a session that has
// n paths (removed ones included, whose indexes stay taken); live(i)
// returns path i's address and whether it is not removed. A path the
// session has is refused with EEXIST, a path past MaxPathsNum with ENOMEM.
func CheckAddPath(a PathAddr, n int, live func(i int) (PathAddr, bool)) error {
	for i := 0; i < n; i++ {
		if b, ok := live(i); ok && b == a {
			return fmt.Errorf("path %v exists: %w", a, syscall.EEXIST)
		}
	}
	if n >= MaxPathsNum {
		return fmt.Errorf("%d paths already: %w", n, syscall.ENOMEM)
	}
	return nil
}
