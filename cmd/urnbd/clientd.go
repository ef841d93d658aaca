package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urnbd/urnbd/internal/clientd"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/ublk"
)

// The client daemon keeps the RNBD sessions and the devices mapped through
// them; the CLI sends it one JSON request per connection on a root-only unix
// socket and starts it when it is not running. It exits when its last
// device is unmapped.

func clientSocket() string { return filepath.Join(runDir(), "client.sock") }

// records are the running daemon's records of its mappings.
func records() clientd.Records { return clientd.Records{Dir: filepath.Join(runDir(), "rnbd")} }

// ask sends req to the daemon, starting it if needed.
// With start, daemonArgs are the options it is started with.
func ask(req *clientd.Request, start bool, daemonArgs ...string) (*clientd.Reply, error) {
	rep, err := clientd.Ask(clientSocket(), req)
	if start && errors.Is(err, clientd.ErrNoDaemon) {
		// Only then: a request that a daemon took is never sent twice.
		if err := startClientDaemon(daemonArgs...); err != nil {
			return nil, err
		}
		rep, err = clientd.Ask(clientSocket(), req)
	}
	var re *clientd.Error
	if err != nil && !errors.As(err, &re) && !errors.Is(err, clientd.ErrNoDaemon) {
		err = fmt.Errorf("%w (see %s)", err, daemonLog()) // it took the request and did not answer
	}
	return rep, err
}

func startClientDaemon(args ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(runDir(), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(daemonLog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, io.SeekEnd)
	cmd := exec.Command(exe, append([]string{"client", "daemon"}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start client daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", clientSocket()); err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-exited:
			return daemonStartError(daemonLog(), logStart, err)
		default:
		}
	}
	return fmt.Errorf("client daemon did not start within 10 s; see %s: %w", daemonLog(), unix.ETIMEDOUT)
}

// daemonStartError is the error of a client daemon that exited before it
// listened: its own last error line from its log (written from offset
// on), and its exit status as the errno it stands for (see exitCode).
func daemonStartError(log string, offset int64, waitErr error) error {
	why := "it exited"
	if b, err := os.ReadFile(log); err == nil && int64(len(b)) >= offset {
		lines := strings.Split(strings.TrimSpace(string(b[offset:])), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if l := strings.TrimSpace(lines[i]); l != "" {
				why = strings.TrimPrefix(l, "urnbd: ")
				break
			}
		}
	}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) && ee.ExitCode() > 1 && ee.ExitCode() < 126 {
		errno := unix.Errno(ee.ExitCode())
		return fmt.Errorf("client daemon did not start: %s: %w", strings.TrimSuffix(why, ": "+errno.Error()), errno)
	}
	return fmt.Errorf("client daemon did not start: %s (see %s)", why, log)
}

// daemonArgs returns the daemonFlags set in c, as arguments of a daemon
// to start.
func daemonArgs(c *cli.Context) []string {
	var args []string
	if addr := c.String("metrics-listen"); addr != "" {
		args = append(args, "--metrics-listen", addr)
	}
	if c.Bool("no-bpf") {
		args = append(args, "--no-bpf")
	}
	return args
}

func mapDevice(c *cli.Context, spec *clientd.MapSpec) error {
	if spec.Transport == "" && c.IsSet("transport") {
		// Left empty otherwise: a new session then takes the flag's
		// default, an existing one keeps its own.
		spec.Transport = c.String("transport")
	}
	args := daemonArgs(c)
	req := &clientd.Request{Op: "map", Spec: spec, Queues: c.Int("queues"), Depth: c.Int("depth"), ZeroCopy: c.Bool("zero-copy")}
	if c.IsSet("session-devices") {
		req.SessionDevices = c.Int("session-devices")
	}
	rep, err := ask(req, true, args...)
	if err != nil {
		return err
	}
	fmt.Println(rep.Device)
	return nil
}

func unmapCommand() *cli.Command {
	return &cli.Command{
		Name:      "unmap",
		Usage:     "unmap a mapped device (fails with EBUSY while it is open or mounted)",
		ArgsUsage: "/dev/ublkbN | N",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "force", Usage: "unmap even while the device is in use; its I/O fails"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("unmap: name one device: %w", unix.EINVAL)
			}
			id, err := parseID(c.Args().First())
			if err != nil {
				return err
			}
			if _, err := askDaemon(&clientd.Request{Op: "unmap", Device: id, Force: c.Bool("force")}, "unmap: "+ublk.BlockPath(id)+" is not mapped"); err != nil {
				return err
			}
			fmt.Printf("unmapped %s\n", ublk.BlockPath(id))
			return nil
		},
	}
}

func resizeCommand() *cli.Command {
	return &cli.Command{
		Name: "resize",
		Usage: "set a mapped device's size to its size on the server now (after the export grew or shrank), " +
			"or to SIZE, which must not exceed it; needs the ublk driver's update_size (Linux 7.x)",
		ArgsUsage: "/dev/ublkbN | N [SIZE]",
		Action: func(c *cli.Context) error {
			if c.NArg() < 1 || c.NArg() > 2 {
				return fmt.Errorf("resize: name one device, and a size or none: %w", unix.EINVAL)
			}
			id, err := parseID(c.Args().First())
			if err != nil {
				return err
			}
			req := &clientd.Request{Op: "resize", Device: id}
			if c.NArg() == 2 {
				if req.Size, err = parseSize(c.Args().Get(1)); err != nil {
					return err
				}
				if req.Size == 0 {
					return fmt.Errorf("resize: size 0: %w", unix.EINVAL)
				}
			}
			rep, err := askDaemon(req, "resize: "+ublk.BlockPath(id)+" is not mapped")
			if err != nil {
				return err
			}
			fmt.Printf("%s: %d bytes\n", ublk.BlockPath(id), rep.Size)
			return nil
		},
	}
}

func handoverCommand() *cli.Command {
	return &cli.Command{
		Name: "handover",
		Usage: "replace the client daemon (after an upgrade of urnbd, say) without unmapping: it leaves every " +
			"device waiting, with its I/O, and exits; the next daemon serves the devices again",
		Description: "The daemon lets the requests it has sent to the servers finish, closes the devices on the\n" +
			"servers and exits with status 75; the I/O that arrives meanwhile waits in the kernel (ublk user\n" +
			"recovery) and nothing is issued twice. Then this command starts the next daemon (the urnbd binary\n" +
			"on disk now, with the old daemon's options), which recovers the devices, and lists them; under\n" +
			"systemd (a daemon run with --persist), systemd starts it instead (RestartForceExitStatus=75).\n" +
			"Requests still unanswered after --timeout are issued again to the next daemon, as after a crash.",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long the daemon waits for the requests in flight"},
			&cli.BoolFlag{Name: "no-start", Usage: "do not start the next daemon"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return fmt.Errorf("handover: takes no arguments: %w", unix.EINVAL)
			}
			pid := daemonPID()
			rep, err := clientd.Ask(clientSocket(), &clientd.Request{Op: "handover", TimeoutMS: c.Duration("timeout").Milliseconds()})
			if errors.Is(err, clientd.ErrNoDaemon) {
				return fmt.Errorf("handover: no client daemon is running: %w", unix.ENOENT)
			}
			if err != nil {
				return fmt.Errorf("handover: %w", err)
			}
			failed := 0
			for _, e := range rep.Handover {
				how := "the queues held back new requests"
				if e.Quiesced {
					how = "the ublk driver quiesced it"
				}
				if e.Error != "" {
					failed++
					fmt.Printf("%s: left to the next daemon; %s, but %s\n", e.Device, how, e.Error)
					continue
				}
				fmt.Printf("%s: handed over (%s)\n", e.Device, how)
			}
			if pid > 0 && !waitExit(pid, c.Duration("timeout")+10*time.Second) {
				return fmt.Errorf("handover: the daemon (pid %d) has not exited; see %s: %w", pid, daemonLog(), unix.ETIMEDOUT)
			}
			switch {
			case rep.Persist:
				fmt.Println("the daemon ran under systemd (--persist): systemd starts the next one")
			case c.Bool("no-start") || len(rep.Handover) == 0:
			default:
				if err := startClientDaemon(rep.DaemonArgs...); err != nil {
					return fmt.Errorf("handover: start the next daemon: %w", err)
				}
				// The new daemon recovers the devices before it answers.
				lr, err := clientd.Ask(clientSocket(), &clientd.Request{Op: "list"})
				if err != nil {
					return fmt.Errorf("handover: the next daemon: %w", err)
				}
				for _, e := range lr.Devices {
					fmt.Printf("%s: served by the next daemon (pid %d), %s\n", e.Device, daemonPID(), e.State)
				}
			}
			if failed > 0 {
				return fmt.Errorf("handover: %d devices had requests in flight at the timeout; they are issued again: %w", failed, unix.ETIMEDOUT)
			}
			return nil
		},
	}
}

// daemonPID returns the running client daemon's pid from its pid file, or 0.
func daemonPID() int {
	b, err := os.ReadFile(filepath.Join(runDir(), "client.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// waitExit waits up to timeout for process pid to exit.
func waitExit(pid int, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if unix.Kill(pid, 0) != nil {
			return true
		}
	}
	return false
}

func listCommand() *cli.Command {
	return &cli.Command{
		Name:  "list",
		Usage: "show the mapped RNBD devices",
		Flags: formatFlags("table"),
		Action: func(c *cli.Context) error {
			format, err := outputFormat(c, "table")
			if err != nil {
				return fmt.Errorf("list: %w", err)
			}
			entries := []clientd.ListEntry{}
			// A daemon that died left devices to recover: start one.
			if rep, err := ask(&clientd.Request{Op: "list"}, records().Any()); err == nil {
				entries = append(entries, rep.Devices...)
			}
			if format == "json" {
				return writeJSON(os.Stdout, entries)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "DEVNAME\tSESSNAME\tMAPPING_PATH\tACCESS_MODE\tSTATE\tPATHS")
			for _, e := range entries {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Device, e.SessName, e.MapPath, e.AccessMode, e.State, strings.Join(e.Paths, ","))
			}
			return w.Flush()
		},
	}
}

// clientDaemon is the running client daemon: its registry of sessions
// and devices (clientd.Registry), its socket and its observers.
type clientDaemon struct {
	ctrl *ublk.Control
	reg  *clientd.Registry
	ln   net.Listener
	obs  *observer
	// persist keeps the daemon running with no device mapped (under
	// systemd); otherwise it exits after the last unmap.
	persist bool
	// stopping is closed when the daemon stops: recoveries still being
	// retried give up.
	stopping chan struct{}
	// idle is set when the last device of a daemon without persist was
	// unmapped: it exits once that request has its reply.
	idle atomic.Bool
	// leaving is set by a handover: the daemon refuses other requests
	// and exits once the handover has its reply.
	leaving atomic.Bool
	stop    func() // closes stopping, once
	// args are the daemon's options, for the daemon after a handover.
	args []string
}

// handoverExit is the exit status of a daemon that handed its devices over
// (EX_TEMPFAIL): the systemd unit starts the next one on it
// (RestartForceExitStatus).
const handoverExit = 75

// daemonFlags are the client daemon's options; map passes them on when it
// starts the daemon.
var daemonFlags = []cli.Flag{
	&cli.StringFlag{Name: "metrics-listen", Usage: "serve Prometheus metrics on http://`ADDR`/metrics (e.g. 127.0.0.1:9755)"},
	&cli.BoolFlag{Name: "no-bpf", Usage: "do not load the eBPF programs (block latency, completion CPU)"},
}

func clientDaemonCommand() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "run the client daemon in the foreground (map starts it when needed; for systemd)",
		Description: "The client daemon keeps the RNBD sessions and the mapped devices; the CLI talks to it over\n" +
			"$URNBD_RUN_DIR/client.sock (root only). Started by map, it exits after the last unmap;\n" +
			"with --persist it stays (for tools/systemd/urnbd-client.service).",
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "persist", Usage: "keep running when no device is mapped"},
		}, daemonFlags...),
		Action: func(c *cli.Context) error {
			if conn, err := net.Dial("unix", clientSocket()); err == nil {
				conn.Close()
				return fmt.Errorf("client daemon: one is already running on %s: %w", clientSocket(), unix.EEXIST)
			}
			ctrl, err := ublk.OpenControl()
			if err != nil {
				return err
			}
			defer ctrl.Close()
			if err := os.MkdirAll(runDir(), 0o700); err != nil {
				return fmt.Errorf("client daemon: %w", err)
			}
			os.Remove(clientSocket())
			unix.Umask(0o077)
			ln, err := net.Listen("unix", clientSocket())
			if err != nil {
				return fmt.Errorf("client daemon: %w", err)
			}
			noBPF := ""
			if c.Bool("no-bpf") {
				noBPF = "disabled by --no-bpf"
			}
			d := &clientDaemon{ctrl: ctrl, reg: clientd.NewRegistry(ctrl, records()), ln: ln,
				obs: newObserver(noBPF), persist: c.Bool("persist"), stopping: make(chan struct{})}
			d.stop = sync.OnceFunc(func() { close(d.stopping) })
			d.args = daemonArgs(c)
			d.reg.InUse = clientd.DeviceUsers
			d.reg.OnSession = func(s *clientd.Session) {
				if s.Spec.Transport == "rdma" {
					// Count completion CPUs from the start: ib_uverbs is loaded now.
					d.obs.completionCPU()
				}
			}
			d.reg.OnDevice = func(id uint32, added bool) {
				if added {
					d.obs.addDevice(id)
				} else {
					d.obs.removeDevice(id)
				}
			}
			d.reg.Logf = func(format string, args ...any) { log.Printf("urnbd client daemon: "+format, args...) }
			defer d.obs.close()
			if addr := c.String("metrics-listen"); addr != "" {
				if err := d.serveMetrics(addr); err != nil {
					ln.Close()
					return err
				}
			}
			pidFile := filepath.Join(runDir(), "client.pid")
			if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err == nil {
				defer os.Remove(pidFile)
			}
			d.reg.RecoverRecorded(d.stopping)
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, unix.SIGINT, unix.SIGTERM)
			go func() { <-sigs; d.shutdown(); ln.Close() }()
			log.Printf("urnbd client daemon: listening on %s", clientSocket())
			for {
				conn, err := ln.Accept()
				if err != nil {
					os.Remove(clientSocket())
					if d.leaving.Load() {
						return cli.Exit("urnbd client daemon: handed the devices over; the next daemon recovers them", handoverExit)
					}
					return nil
				}
				go d.serve(conn)
			}
		},
	}
}

func (d *clientDaemon) serve(conn net.Conn) {
	clientd.Serve(conn, d.handle)
	if (d.idle.Load() && d.reg.Idle()) || d.leaving.Load() {
		d.ln.Close() // the accept loop ends and the daemon exits
	}
}

// handle answers one request of the CLI.
func (d *clientDaemon) handle(req *clientd.Request) (*clientd.Reply, error) {
	var rep clientd.Reply
	var err error
	if d.leaving.Load() {
		return &rep, fmt.Errorf("%s: the client daemon is handing its devices over and exiting; ask the next one: %w", req.Op, unix.ESHUTDOWN)
	}
	switch req.Op {
	case "handover":
		rep.Handover, err = d.handover(req)
		rep.DaemonArgs, rep.Persist = d.args, d.persist
	case "map":
		rep.Device, err = d.mapDev(req)
	case "unmap":
		err = d.unmapDev(req.Device, req.Force)
	case "resize":
		rep.Size, err = d.reg.Resize(context.Background(), req.Device, req.Size)
	case "list":
		rep.Devices = d.reg.List()
	case "stats":
		var st *statsReport
		if st, err = d.collectStats(req.Force); err == nil {
			rep.Stats, err = json.Marshal(st)
		}
	case "path":
		rep.Device, err = d.pathRequest(req)
	case "session-set":
		err = d.sessionSet(req)
	default:
		err = fmt.Errorf("unknown request %q: %w", req.Op, unix.EINVAL)
	}
	return &rep, err
}

func (d *clientDaemon) mapDev(req *clientd.Request) (string, error) {
	if req.Spec == nil {
		return "", fmt.Errorf("map: no spec: %w", unix.EINVAL)
	}
	rec := clientd.Record{Spec: *req.Spec, Queues: req.Queues, SessionDevices: req.SessionDevices, ZeroCopy: req.ZeroCopy}
	dev, err := d.reg.Map(context.Background(), &rec, req.Depth)
	if err != nil {
		return "", err
	}
	d.idle.Store(false)
	return ublk.BlockPath(dev.ID), nil
}

func (d *clientDaemon) unmapDev(id uint32, force bool) error {
	last, err := d.reg.Unmap(context.Background(), id, force)
	if last && !d.persist {
		d.idle.Store(true) // serve closes the listener once it has replied
	}
	return err
}

func (d *clientDaemon) shutdown() {
	d.stop()
	d.reg.UnmapAll(context.Background())
}

// handover leaves every device to the next daemon and has this one exit
// once the reply is sent.
func (d *clientDaemon) handover(req *clientd.Request) ([]clientd.HandoverEntry, error) {
	if !d.leaving.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("handover: already under way: %w", unix.EALREADY)
	}
	d.stop() // recoveries still being retried are the next daemon's
	timeout := 30 * time.Second
	if req.TimeoutMS > 0 {
		timeout = time.Duration(req.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.reg.HandoverAll(ctx), nil
}
