package main

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/ctlsock"
	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
)

// The server's admin socket: the operator's view of its sessions, paths
// and devices, and their disconnect and force close, as the kernel's
// /sys/class/rtrs-server and /sys/class/rnbd-server and the rnbd tool's
// server commands offer them.

func serverSocket() string { return filepath.Join(runDir(), "server.sock") }

// adminRequest is one request on the admin socket.
type adminRequest struct {
	Op      string `json:"op"` // sessions, devices, disconnect-session, disconnect-path, close-device, reset-path-stats
	Session string `json:"session,omitempty"`
	Path    string `json:"path,omitempty"`
	Device  string `json:"device,omitempty"`
}

// adminReply is the server's answer.
type adminReply struct {
	ctlsock.Status
	Sessions []sessionEntry `json:"sessions,omitempty"`
	Devices  []deviceEntry  `json:"devices,omitempty"`
	Count    int            `json:"count,omitempty"` // paths disconnected, mappings closed
}

// sessionEntry is a session as `urnbd server session` shows it.
type sessionEntry struct {
	Name      string            `json:"sessname"`
	PathsUUID string            `json:"paths_uuid"`
	Identity  string            `json:"identity"`    // the key the session proved, "" for none
	CertName  string            `json:"certificate"` // the client certificate its paths showed (TLS), "" for none
	State     string            `json:"state"`       // connected, lingering
	Paths     []pathEntry       `json:"paths"`
	Devices   []sessionDevEntry `json:"devices"`
}

// pathEntry is a server path, with the kernel's file names.
type pathEntry struct {
	Session      string `json:"sessname"`
	Name         string `json:"path"` // src@dst
	SrcAddr      string `json:"src_addr"`
	DstAddr      string `json:"dst_addr"`
	State        string `json:"state"`
	Transport    string `json:"transport"`
	HCAName      string `json:"hca_name,omitempty"`
	HCAPort      int    `json:"hca_port,omitempty"`
	Rdma         string `json:"rdma,omitempty"`          // stats/rdma
	WcCompletion string `json:"wc_completion,omitempty"` // stats/wc_completion
}

// sessionDevEntry is one device a session has open.
type sessionDevEntry struct {
	Device      string `json:"device"` // block_dev
	DeviceID    uint32 `json:"device_id"`
	AccessMode  string `json:"access_mode"`
	ReadOnly    bool   `json:"read_only"`
	MappingPath string `json:"mapping_path"`
}

// deviceEntry is an export open in some session.
type deviceEntry struct {
	Device   string            `json:"device"` // block_dev
	Sessions []deviceSessEntry `json:"sessions"`
}

type deviceSessEntry struct {
	Session     string `json:"sessname"`
	AccessMode  string `json:"access_mode"`
	ReadOnly    bool   `json:"read_only"`
	MappingPath string `json:"mapping_path"`
}

// serverAdmin answers the admin socket's requests for a running server.
type serverAdmin struct {
	tab *rtrs.ServerTable
	srv *rnbd.Server
}

// listenAdmin listens on the admin socket, root's only (mode 0600 in a
// 0700 folder). A socket that another live server holds is an error
// unless that server lets go of it within a few seconds (one that stops
// closes its admin socket first); one left by a server that is gone is
// replaced.
func listenAdmin(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("admin socket %s: %w", path, err)
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c, err := net.Dial("unix", path)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("admin socket %s: another urnbd server listens there (pass --admin-socket, or URNBD_RUN_DIR, for a second one): %w", path, unix.EADDRINUSE)
		}
	}
	_ = os.Remove(path)
	old := unix.Umask(0o077)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("admin socket %s: %w", path, err)
	}
	return ln, nil
}

func (a *serverAdmin) serve(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Printf("urnbd server: admin socket: %v", err)
			}
			return
		}
		go ctlsock.Serve(conn, "urnbd server", a.handle, func() *adminReply { return &adminReply{} })
	}
}

func (a *serverAdmin) handle(req *adminRequest) (*adminReply, error) {
	switch req.Op {
	case "sessions":
		return &adminReply{Sessions: a.sessions()}, nil
	case "devices":
		return &adminReply{Devices: a.devices()}, nil
	case "disconnect-session":
		n, err := a.tab.DisconnectSession(req.Session)
		log.Printf("urnbd server: admin: disconnect session %q: %d paths, %v", req.Session, n, err)
		return &adminReply{Count: n}, err
	case "disconnect-path":
		err := a.tab.DisconnectPath(req.Session, req.Path)
		log.Printf("urnbd server: admin: disconnect path %q of session %q: %v", req.Path, req.Session, err)
		return &adminReply{Count: 1}, err
	case "close-device":
		n, err := a.srv.ForceClose(req.Device, req.Session)
		log.Printf("urnbd server: admin: close device %q (session %q): %d mappings, %v", req.Device, req.Session, n, err)
		return &adminReply{Count: n}, err
	case "reset-path-stats":
		return &adminReply{Count: 1}, a.tab.ResetPathStats(req.Session, req.Path)
	}
	return nil, fmt.Errorf("unknown request %q: %w", req.Op, unix.EINVAL)
}

func (a *serverAdmin) sessions() []sessionEntry {
	devs := map[string][]sessionDevEntry{}
	for _, e := range a.srv.Exports() {
		for _, s := range e.Sessions {
			devs[s.Session] = append(devs[s.Session], sessionDevEntry{Device: e.Path, DeviceID: s.DeviceID,
				AccessMode: s.AccessMode.String(), ReadOnly: s.ReadOnly, MappingPath: s.MappingPath})
		}
	}
	var out []sessionEntry
	for _, s := range a.tab.Status() {
		e := sessionEntry{Name: s.Name, PathsUUID: fmt.Sprintf("%x", s.PathsUUID[:]), Identity: s.Identity, CertName: s.CertName, State: "connected",
			Paths: []pathEntry{}, Devices: devs[s.Name]}
		if s.Lingering {
			e.State = "lingering"
		}
		if e.Devices == nil {
			e.Devices = []sessionDevEntry{}
		}
		for _, p := range s.Paths {
			pe := pathEntry{Session: s.Name, Name: p.Name, SrcAddr: p.Src.Addr().Unmap().String(), DstAddr: p.Dst.Addr().Unmap().String(),
				State: strings.ToLower(p.State.String()), Transport: p.Details.Transport, HCAName: p.Details.HCAName, HCAPort: p.Details.HCAPort}
			if st := p.Details.Stats; st != nil {
				pe.Rdma = strings.TrimSpace(string(st.AppendRdma(nil)))
				pe.WcCompletion = strings.TrimSpace(string(st.AppendWcCompletion(nil)))
			}
			e.Paths = append(e.Paths, pe)
		}
		out = append(out, e)
	}
	return out
}

func (a *serverAdmin) devices() []deviceEntry {
	var out []deviceEntry
	for _, e := range a.srv.Exports() {
		d := deviceEntry{Device: e.Path}
		for _, s := range e.Sessions {
			d.Sessions = append(d.Sessions, deviceSessEntry{Session: s.Session, AccessMode: s.AccessMode.String(),
				ReadOnly: s.ReadOnly, MappingPath: s.MappingPath})
		}
		out = append(out, d)
	}
	return out
}

// appendPrometheus renders the server's metrics: the RTRS server
// families of every path that keeps statistics (package rtrs), and per
// session its paths and open devices.
func (a *serverAdmin) appendPrometheus(b []byte) []byte {
	st := a.tab.Status()
	var paths []rtrs.PromServerPath
	for _, s := range st {
		for _, p := range s.Paths {
			if p.Details.Stats != nil {
				paths = append(paths, rtrs.PromServerPath{Sess: s.Name, Path: p.Name, Stats: p.Details.Stats.Snapshot()})
			}
		}
	}
	b = rtrs.AppendServerPrometheus(b, paths)
	devs := map[string]int{}
	for _, e := range a.srv.Exports() {
		for _, s := range e.Sessions {
			devs[s.Session]++
		}
	}
	b = rtrs.AppendPromHeader(b, "urnbd_server_session_paths", "gauge", "Paths of a session (0: lingering, waiting for its client).")
	for _, s := range st {
		b = fmt.Appendf(b, "urnbd_server_session_paths{sess=%s} %d\n", rtrs.PromLabelValue(s.Name), len(s.Paths))
	}
	b = rtrs.AppendPromHeader(b, "urnbd_server_session_devices", "gauge", "Devices a session has open.")
	for _, s := range st {
		b = fmt.Appendf(b, "urnbd_server_session_devices{sess=%s} %d\n", rtrs.PromLabelValue(s.Name), devs[s.Name])
	}
	b = rtrs.AppendPromHeader(b, "urnbd_server_session_identity", "gauge", "1 per session: the key it proved and the client certificate it showed (\"\" for none).")
	for _, s := range st {
		b = fmt.Appendf(b, "urnbd_server_session_identity{sess=%s,key=%s,certificate=%s} 1\n",
			rtrs.PromLabelValue(s.Name), rtrs.PromLabelValue(s.Identity), rtrs.PromLabelValue(s.CertName))
	}
	return b
}

// askServer sends req to the server on the admin socket of c's
// --admin-socket.
func askServer(c *cli.Context, req *adminRequest) (*adminReply, error) {
	var rep adminReply
	sock := c.String("admin-socket")
	if sock == "" {
		sock = serverSocket()
	}
	err := ctlsock.Ask(sock, "urnbd server", req, &rep)
	if errors.Is(err, ctlsock.ErrNoListener) {
		return nil, fmt.Errorf("%v (is the server running? as root?): %w", err, unix.ENOENT)
	}
	return &rep, err
}

var adminSocketFlag = &cli.StringFlag{Name: "admin-socket", Usage: "`PATH` of the server's admin socket (default $URNBD_RUN_DIR/server.sock, /run/urnbd/server.sock)"}

// exactly is the action fn of a command that takes n arguments (what
// names them), refusing any other count.
func exactly(n int, what string, fn cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.NArg() != n {
			return badUsage(c, "want %s", what)
		}
		return fn(c)
	}
}

// serverAdminCommands are `urnbd server session|device|path ...`, the rnbd
// tool's server commands.
func serverAdminCommands() []*cli.Command {
	flags := append(formatFlags("table"), adminSocketFlag)
	return []*cli.Command{
		{
			Name:  "session",
			Usage: "the server's sessions: list, show, disconnect",
			Subcommands: []*cli.Command{
				{Name: "list", Usage: "list the sessions: name, state, paths, devices", Flags: flags,
					Action: func(c *cli.Context) error { return showSessions(c, "") }},
				{Name: "show", Usage: "show a session: its paths and devices", ArgsUsage: "SESSNAME", Flags: flags,
					Action: exactly(1, "SESSNAME", func(c *cli.Context) error {
						return showSessions(c, c.Args().First())
					})},
				{Name: "disconnect", Usage: "disconnect every path of a session (its client reconnects them)", ArgsUsage: "SESSNAME",
					Flags: []cli.Flag{adminSocketFlag},
					Action: exactly(1, "SESSNAME", func(c *cli.Context) error {
						rep, err := askServer(c, &adminRequest{Op: "disconnect-session", Session: c.Args().First()})
						if err != nil {
							return fmt.Errorf("server session disconnect: %w", err)
						}
						fmt.Printf("%d paths disconnected\n", rep.Count)
						return nil
					})},
			},
		},
		{
			Name:  "path",
			Usage: "the server's paths: list, show, disconnect, reset-stats",
			Subcommands: []*cli.Command{
				{Name: "list", Usage: "list the paths of every session, or of one", ArgsUsage: "[SESSNAME]", Flags: flags,
					Action: func(c *cli.Context) error {
						if c.NArg() > 1 {
							return badUsage(c, "want at most a SESSNAME")
						}
						return showPaths(c, c.Args().First(), "")
					}},
				{Name: "show", Usage: "show a path: addresses, device, state, stats/rdma and stats/wc_completion", ArgsUsage: "SESSNAME PATH", Flags: flags,
					Action: exactly(2, "SESSNAME PATH", func(c *cli.Context) error {
						return showPaths(c, c.Args().First(), c.Args().Get(1))
					})},
				{Name: "disconnect", Usage: "disconnect a path (PATH: src@dst as list shows it, or its index); its client reconnects it", ArgsUsage: "SESSNAME PATH",
					Flags: []cli.Flag{adminSocketFlag},
					Action: exactly(2, "SESSNAME PATH", func(c *cli.Context) error {
						if _, err := askServer(c, &adminRequest{Op: "disconnect-path", Session: c.Args().First(), Path: c.Args().Get(1)}); err != nil {
							return fmt.Errorf("server path disconnect: %w", err)
						}
						return nil
					})},
				{Name: "reset-stats", Usage: "clear a path's statistics (the kernel's stats/reset_all)", ArgsUsage: "SESSNAME PATH",
					Flags: []cli.Flag{adminSocketFlag},
					Action: exactly(2, "SESSNAME PATH", func(c *cli.Context) error {
						if _, err := askServer(c, &adminRequest{Op: "reset-path-stats", Session: c.Args().First(), Path: c.Args().Get(1)}); err != nil {
							return fmt.Errorf("server path reset-stats: %w", err)
						}
						return nil
					})},
			},
		},
		{
			Name:  "device",
			Usage: "the exported devices open in sessions: list, show, close",
			Subcommands: []*cli.Command{
				{Name: "list", Usage: "list the devices open in some session, with the sessions", Flags: flags,
					Action: func(c *cli.Context) error { return showDevices(c, "") }},
				{Name: "show", Usage: "show a device: the sessions that have it open, how", ArgsUsage: "DEVICE", Flags: flags,
					Action: exactly(1, "DEVICE", func(c *cli.Context) error {
						return showDevices(c, c.Args().First())
					})},
				{Name: "close", Usage: "force close a device in every session, or in one (--session): their I/O on it fails from then on", ArgsUsage: "DEVICE",
					Flags: []cli.Flag{adminSocketFlag, &cli.StringFlag{Name: "session", Usage: "only in the session `SESSNAME`"}},
					Action: exactly(1, "DEVICE", func(c *cli.Context) error {
						rep, err := askServer(c, &adminRequest{Op: "close-device", Device: c.Args().First(), Session: c.String("session")})
						if err != nil {
							return fmt.Errorf("server device close: %w", err)
						}
						fmt.Printf("%d mappings closed\n", rep.Count)
						return nil
					})},
			},
		},
	}
}

func showSessions(c *cli.Context, name string) error {
	format, err := outputFormat(c, "table")
	if err != nil {
		return err
	}
	rep, err := askServer(c, &adminRequest{Op: "sessions"})
	if err != nil {
		return fmt.Errorf("server session: %w", err)
	}
	sess := rep.Sessions
	if name != "" {
		sess = nil
		for _, s := range rep.Sessions {
			if s.Name == name {
				sess = append(sess, s)
			}
		}
		if sess == nil {
			return fmt.Errorf("server session show: no session %q: %w", name, unix.ENOENT)
		}
	}
	if sess == nil {
		sess = []sessionEntry{}
	}
	if format == "json" {
		return writeJSON(os.Stdout, sess)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	if name == "" {
		fmt.Fprintln(w, "SESSNAME\tSTATE\tPATHS\tDEVICES")
		for _, s := range sess {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\n", s.Name, s.State, len(s.Paths), len(s.Devices))
		}
		return w.Flush()
	}
	s := sess[0]
	identity := s.Identity
	if identity == "" {
		identity = "none (not authenticated)"
	}
	cert := s.CertName
	if cert == "" {
		cert = "none"
	}
	fmt.Fprintf(w, "sessname:\t%s\nstate:\t%s\npaths_uuid:\t%s\nidentity:\t%s\ncertificate:\t%s\n", s.Name, s.State, s.PathsUUID, identity, cert)
	for _, p := range s.Paths {
		fmt.Fprintf(w, "path:\t%s %s %s %s:%d\n", p.Name, p.State, p.Transport, p.HCAName, p.HCAPort)
	}
	for _, d := range s.Devices {
		fmt.Fprintf(w, "device:\t%s (id %d, %s, mapping_path %s)\n", d.Device, d.DeviceID, d.AccessMode, d.MappingPath)
	}
	return w.Flush()
}

func showPaths(c *cli.Context, session, path string) error {
	format, err := outputFormat(c, "table")
	if err != nil {
		return err
	}
	rep, err := askServer(c, &adminRequest{Op: "sessions"})
	if err != nil {
		return fmt.Errorf("server path: %w", err)
	}
	paths := []pathEntry{}
	found := session == ""
	for _, s := range rep.Sessions {
		if session != "" && s.Name != session {
			continue
		}
		found = true
		for i, p := range s.Paths {
			if path == "" || p.Name == path || strconv.Itoa(i) == path {
				paths = append(paths, p)
			}
		}
	}
	switch {
	case !found:
		return fmt.Errorf("server path: no session %q: %w", session, unix.ENOENT)
	case path != "" && len(paths) == 0:
		return fmt.Errorf("server path show: session %q has no path %q: %w", session, path, unix.ENOENT)
	}
	if format == "json" {
		return writeJSON(os.Stdout, paths)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	if path == "" {
		fmt.Fprintln(w, "SESSNAME\tPATH\tSTATE\tTRANSPORT\tHCA_NAME\tHCA_PORT")
		for _, p := range paths {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\n", p.Session, p.Name, p.State, p.Transport, p.HCAName, p.HCAPort)
		}
		return w.Flush()
	}
	p := paths[0]
	fmt.Fprintf(w, "sessname:\t%s\npath:\t%s\nsrc_addr:\t%s\ndst_addr:\t%s\nstate:\t%s\ntransport:\t%s\n", p.Session, p.Name, p.SrcAddr, p.DstAddr, p.State, p.Transport)
	if p.HCAName != "" {
		fmt.Fprintf(w, "hca_name:\t%s\nhca_port:\t%d\n", p.HCAName, p.HCAPort)
	}
	if p.Rdma != "" {
		fmt.Fprintf(w, "stats/rdma:\t%s\nstats/wc_completion:\t%s\n", p.Rdma, p.WcCompletion)
	}
	return w.Flush()
}

func showDevices(c *cli.Context, device string) error {
	format, err := outputFormat(c, "table")
	if err != nil {
		return err
	}
	rep, err := askServer(c, &adminRequest{Op: "devices"})
	if err != nil {
		return fmt.Errorf("server device: %w", err)
	}
	devs := []deviceEntry{}
	for _, d := range rep.Devices {
		if device == "" || d.Device == device || hasMappingPath(d, device) {
			devs = append(devs, d)
		}
	}
	if device != "" && len(devs) == 0 {
		return fmt.Errorf("server device show: no session has %q open: %w", device, unix.ENOENT)
	}
	if format == "json" {
		return writeJSON(os.Stdout, devs)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "DEVICE\tSESSNAME\tACCESS_MODE\tREAD_ONLY\tMAPPING_PATH")
	for _, d := range devs {
		for _, s := range d.Sessions {
			fmt.Fprintf(w, "%s\t%s\t%s\t%t\t%s\n", d.Device, s.Session, s.AccessMode, s.ReadOnly, s.MappingPath)
		}
	}
	return w.Flush()
}

func hasMappingPath(d deviceEntry, name string) bool {
	for _, s := range d.Sessions {
		if s.MappingPath == name {
			return true
		}
	}
	return false
}
