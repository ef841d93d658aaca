package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/urnbd/urnbd/internal/clientd"

	"golang.org/x/sys/unix"
)

// A command that serves a device runs as a daemon: the command re-executes
// itself in a new session with a pipe on this descriptor, the child reports
// "ok DEVICE" or "error ERRNO MESSAGE" there once the device is up or has
// failed, and the parent prints that and exits.
const notifyEnv = "URNBD_NOTIFY_FD"

func daemonLog() string { return filepath.Join(runDir(), "urnbd.log") }

// daemonize runs urnbd with args (the command line of this process if
// none) as a background daemon and waits until it says the device is up
// (notifyParent), printing what it reports.
func daemonize(args ...string) error {
	if len(args) == 0 {
		args = os.Args[1:]
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	if err := os.MkdirAll(runDir(), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(daemonLog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), notifyEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("start daemon: %w", err)
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	switch {
	case strings.HasPrefix(line, "ok "):
		fmt.Println(strings.TrimPrefix(line, "ok "))
		cmd.Process.Release()
		return nil
	case strings.HasPrefix(line, "error "):
		cmd.Wait()
		f := strings.SplitN(strings.TrimPrefix(line, "error "), " ", 2)
		errno, _ := strconv.Atoi(f[0])
		msg := ""
		if len(f) > 1 {
			msg = f[1]
		}
		return &clientd.Error{Msg: msg, Errno: unix.Errno(errno)}
	}
	cmd.Wait()
	return fmt.Errorf("daemon exited before the device was up; see %s", daemonLog())
}

// notifyParent tells a waiting parent the outcome of setting up the device:
// err, or success with the device's path. It returns err.
func notifyParent(err error, device ...string) error {
	fd := os.Getenv(notifyEnv)
	if fd == "" {
		return err
	}
	os.Unsetenv(notifyEnv)
	n, _ := strconv.Atoi(fd)
	f := os.NewFile(uintptr(n), "notify")
	defer f.Close()
	if err != nil {
		var errno unix.Errno
		errors.As(err, &errno)
		fmt.Fprintf(f, "error %d %s\n", int(errno), strings.ReplaceAll(err.Error(), "\n", " "))
		return err
	}
	fmt.Fprintf(f, "ok %s\n", strings.Join(device, " "))
	if devnull, e := os.OpenFile(os.DevNull, os.O_RDWR, 0); e == nil {
		unix.Dup2(int(devnull.Fd()), 0)
	}
	return nil
}
