package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/tcp"
	"github.com/urnbd/urnbd/ublk"
)

func serverCommand() *cli.Command {
	return &cli.Command{
		Name:  "server",
		Usage: "export files and block devices under --dev-search-path to RNBD clients",
		Description: "Runs in the foreground (for systemd: tools/systemd/urnbd-server.service).\n" +
			"Clients name devices relative to the search path; %SESSNAME% in it is replaced by the\n" +
			"client's session name. '..' and symbolic links that leave the search path are refused.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "listen", Value: cli.NewStringSlice("tcp://0.0.0.0:1234"), Usage: "`URL` to listen on: tcp://ADDR:PORT (rdma:// is not available yet)"},
			&cli.StringFlag{Name: "dev-search-path", Value: "/", Usage: "folder the exported device paths are relative to"},
			&cli.IntFlag{Name: "queue-depth", Value: rtrs.DefaultSessQueueDepth, Usage: "chunks per session (sess_queue_depth)"},
			&cli.StringFlag{Name: "max-chunk-size", Value: "128K", Usage: "chunk `SIZE` (max_chunk_size, a power of two); max I/O is 4K less"},
		},
		Action: runServer,
	}
}

func runServer(c *cli.Context) error {
	chunk, err := parseSize(c.String("max-chunk-size"))
	if err != nil {
		return err
	}
	search := c.String("dev-search-path")
	if st, err := os.Stat(strings.Split(search, "%SESSNAME%")[0]); err != nil || !st.IsDir() {
		return fmt.Errorf("dev-search-path %s: not a folder: %w", search, unix.ENOENT)
	}
	srv, err := rnbd.NewServer(rnbd.ServerConfig{DevSearchPath: search, MaxIOSize: int(chunk) - rtrs.DefaultMaxHdrSize})
	if err != nil {
		return err
	}
	rs, err := tcp.NewServer(tcp.ServerConfig{QueueDepth: c.Int("queue-depth"), ChunkSize: int(chunk), Handler: srv})
	if err != nil {
		return fmt.Errorf("server parameters: %w", err)
	}
	errs := make(chan error, 1)
	for _, u := range c.StringSlice("listen") {
		scheme, addr, ok := strings.Cut(u, "://")
		if !ok {
			return fmt.Errorf("listen %q: want tcp://ADDR:PORT: %w", u, unix.EINVAL)
		}
		switch scheme {
		case "tcp":
		case "rdma":
			return fmt.Errorf("listen %q: the RDMA transport is not available in this version: %w", u, unix.EPROTONOSUPPORT)
		default:
			return fmt.Errorf("listen %q: unknown transport %q: %w", u, scheme, unix.EINVAL)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		log.Printf("urnbd server: listening on tcp://%s, exporting %s", ln.Addr(), search)
		go func() { errs <- rs.Serve(ln) }()
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM)
	select {
	case <-sigs:
		log.Printf("urnbd server: stopping")
		return rs.Close()
	case err := <-errs:
		rs.Close()
		return err
	}
}

// mapRecord is what the daemon of a mapping keeps in the run directory.
type mapRecord struct {
	mapSpec
	UblkID   uint32 `json:"ublk_id"`
	DeviceID uint32 `json:"server_device_id"`
	PID      int    `json:"pid"`
}

func mapRecordPath(id uint32) string {
	return filepath.Join(runDir(), "rnbd", strconv.FormatUint(uint64(id), 10)+".json")
}

func (r *mapRecord) save() error {
	if err := os.MkdirAll(filepath.Dir(mapRecordPath(r.UblkID)), 0o700); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	tmp := mapRecordPath(r.UblkID) + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, mapRecordPath(r.UblkID))
}

// mapRecords returns the mappings whose daemon is alive; stale records are
// removed.
func mapRecords() []*mapRecord {
	names, _ := filepath.Glob(filepath.Join(runDir(), "rnbd", "*.json"))
	var out []*mapRecord
	for _, n := range names {
		b, err := os.ReadFile(n)
		var r mapRecord
		if err != nil || json.Unmarshal(b, &r) != nil {
			continue
		}
		if r.PID <= 0 || unix.Kill(r.PID, 0) != nil {
			os.Remove(n)
			continue
		}
		out = append(out, &r)
	}
	return out
}

var mapFlags = []cli.Flag{
	&cli.IntFlag{Name: "queues", Usage: "queues (RTRS connections per path); 0 = one per CPU"},
	&cli.IntFlag{Name: "depth", Value: ublk.DefaultQueueDepth, Usage: "requests in flight per queue"},
	&cli.StringFlag{Name: "transport", Value: "tcp", Usage: "tcp (rdma is not available in this version)"},
	&cli.BoolFlag{Name: "foreground", Aliases: []string{"f"}, Usage: "serve in this process instead of a background daemon"},
}

func mapCommand() *cli.Command {
	return &cli.Command{
		Name:      "map",
		Usage:     "map a remote device as /dev/ublkbN (kernel map_device syntax)",
		ArgsUsage: "sessname=NAME path=[ip:SRC@]ip:DST [path=...] device_path=PATH [access_mode=ro|rw|migration] [dest_port=PORT]",
		Flags:     mapFlags,
		Action: func(c *cli.Context) error {
			spec, err := parseMapString(c.Args().Slice())
			if err != nil {
				return err
			}
			return mapDevice(c, spec)
		},
	}
}

// clientCommand is the IONOS rnbd-tool grammar: client device map|unmap|list.
func clientCommand() *cli.Command {
	return &cli.Command{
		Name:  "client",
		Usage: "client side, rnbd-tool style: client device map|unmap|list",
		Subcommands: []*cli.Command{{
			Name:  "device",
			Usage: "mapped devices",
			Subcommands: []*cli.Command{
				{
					Name:      "map",
					Usage:     "map DEVICE from SERVER",
					ArgsUsage: "DEVICE from SERVER [path=[ip:SRC@]ip:DST ...] [sessname=NAME] [access_mode=ro|rw|migration] [dest_port=PORT]",
					Flags:     mapFlags,
					Action: func(c *cli.Context) error {
						a := c.Args().Slice()
						if len(a) < 3 || a[1] != "from" {
							return fmt.Errorf("map: want DEVICE from SERVER: %w", unix.EINVAL)
						}
						host, _ := os.Hostname()
						toks := []string{"sessname=" + strings.NewReplacer(".", "-", "/", "-").Replace(host), "device_path=" + a[0], "path=ip:" + a[2]}
						spec, err := parseMapString(append(toks, a[3:]...))
						if err != nil {
							return err
						}
						return mapDevice(c, spec)
					},
				},
				unmapCommand(),
				listCommand(),
			},
		}},
	}
}

func mapDevice(c *cli.Context, spec *mapSpec) error {
	if t := c.String("transport"); spec.Transport == "" {
		spec.Transport = t
	}
	if spec.Transport != "tcp" {
		return fmt.Errorf("map: transport %s is not available in this version (use transport=tcp): %w", spec.Transport, unix.EPROTONOSUPPORT)
	}
	for _, r := range mapRecords() {
		if r.SessName == spec.SessName && r.DevicePath == spec.DevicePath {
			return fmt.Errorf("map: %s of session %s is already mapped as %s: %w", spec.DevicePath, spec.SessName, ublk.BlockPath(r.UblkID), unix.EEXIST)
		}
	}
	if !foreground(c) {
		return daemonize()
	}
	cfg := tcp.ClientConfig{SessName: spec.SessName, Queues: c.Int("queues"), Policy: rtrs.MinInflight, MaxReconnectAttempts: -1}
	for _, p := range spec.Paths {
		cfg.Paths = append(cfg.Paths, tcp.PathAddr{Src: p.Src, Dst: net.JoinHostPort(p.Dst, strconv.Itoa(p.Port))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := rnbd.Dial(ctx, cfg)
	if err != nil {
		return notifyParent(fmt.Errorf("map: connect to %v: %w", spec.Paths, err))
	}
	defer client.Close()
	ctrl, err := ublk.OpenControl()
	if err != nil {
		return notifyParent(err)
	}
	defer ctrl.Close()
	dev, err := client.Map(ctx, ctrl, spec.DevicePath, spec.mode, rnbd.MapOptions{ID: -1, Depth: c.Int("depth")})
	if err != nil {
		return notifyParent(fmt.Errorf("map %s: %w", spec.DevicePath, err))
	}
	rec := &mapRecord{mapSpec: *spec, UblkID: dev.UblkDevice().ID(), DeviceID: dev.ID(), PID: os.Getpid()}
	if err := rec.save(); err != nil {
		dev.Unmap(context.Background())
		return notifyParent(fmt.Errorf("record mapping: %w", err))
	}
	defer os.Remove(mapRecordPath(rec.UblkID))
	notifyParent(nil, ublk.BlockPath(rec.UblkID))
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM)
	select {
	case <-sigs:
		return dev.Unmap(context.Background())
	case <-dev.UblkDevice().Done():
		return dev.UblkDevice().Wait()
	}
}

func unmapCommand() *cli.Command {
	return &cli.Command{
		Name:      "unmap",
		Usage:     "unmap a mapped device",
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
			var rec *mapRecord
			for _, r := range mapRecords() {
				if r.UblkID == id {
					rec = r
				}
			}
			if rec == nil {
				return fmt.Errorf("unmap: %s is not a mapped RNBD device: %w", ublk.BlockPath(id), unix.ENOENT)
			}
			if !c.Bool("force") {
				if who := deviceUsers(id); who != "" {
					return fmt.Errorf("unmap: %s is in use (%s); close it, or unmap --force: %w", ublk.BlockPath(id), who, unix.EBUSY)
				}
			}
			if err := unix.Kill(rec.PID, unix.SIGTERM); err != nil {
				return fmt.Errorf("unmap: signal daemon %d: %w", rec.PID, err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for unix.Kill(rec.PID, 0) == nil {
				if time.Now().After(deadline) {
					return fmt.Errorf("unmap: daemon %d still running after 30s: %w", rec.PID, unix.ETIMEDOUT)
				}
				time.Sleep(20 * time.Millisecond)
			}
			fmt.Printf("unmapped %s\n", ublk.BlockPath(id))
			return nil
		},
	}
}

// deviceUsers says who has block device ublkbN open or mounted, or "".
func deviceUsers(id uint32) string {
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

func listCommand() *cli.Command {
	return &cli.Command{
		Name:  "list",
		Usage: "show the mapped RNBD devices",
		Flags: []cli.Flag{&cli.StringFlag{Name: "format", Value: "table", Usage: "table or json"}},
		Action: func(c *cli.Context) error {
			type entry struct {
				Device     string   `json:"devname"`
				SessName   string   `json:"sessname"`
				MapPath    string   `json:"mapping_path"`
				AccessMode string   `json:"access_mode"`
				State      string   `json:"state"`
				Paths      []string `json:"paths"`
				Transport  string   `json:"transport"`
				PID        int      `json:"pid"`
			}
			entries := []entry{}
			ctrl, cerr := ublk.OpenControl()
			for _, r := range mapRecords() {
				e := entry{Device: ublk.BlockPath(r.UblkID), SessName: r.SessName, MapPath: r.DevicePath,
					AccessMode: r.AccessMode, State: "open", Transport: r.Transport, PID: r.PID}
				if cerr == nil {
					if info, err := ctrl.DevInfo(r.UblkID); err == nil && info.State != ublk.StateLive {
						e.State = "closed"
					}
				}
				for _, p := range r.Paths {
					e.Paths = append(e.Paths, p.String())
				}
				entries = append(entries, e)
			}
			if cerr == nil {
				ctrl.Close()
			}
			switch c.String("format") {
			case "json":
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(entries)
			case "table":
				w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(w, "DEVNAME\tSESSNAME\tMAPPING_PATH\tACCESS_MODE\tSTATE\tPATHS")
				for _, e := range entries {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Device, e.SessName, e.MapPath, e.AccessMode, e.State, strings.Join(e.Paths, ","))
				}
				return w.Flush()
			}
			return fmt.Errorf("format %q: want table or json: %w", c.String("format"), unix.EINVAL)
		},
	}
}
