package clientd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/ublk"
)

// DeviceUsers says who has block device ublkbN open or mounted, or "":
// a mount, else the first process with it open.
func DeviceUsers(id uint32) string {
	dev := ublk.BlockPath(id)
	var st unix.Stat_t
	if unix.Stat(dev, &st) != nil {
		return ""
	}
	mm := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && f[2] == mm {
				return "mounted on " + f[4]
			}
		}
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if t, err := os.Readlink(fd); err == nil && t == dev {
			pid := strings.Split(fd, "/")[2]
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			return "open by " + strings.TrimSpace(string(comm)) + " (pid " + pid + ")"
		}
	}
	return ""
}
