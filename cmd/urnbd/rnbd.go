package main

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/urnbd/urnbd/internal/clientd"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/internal/keyfile"
	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/rtrs/rdmatr"
	"github.com/urnbd/urnbd/rtrs/tcp"
	"github.com/urnbd/urnbd/ublk"
)

func serverCommand() *cli.Command {
	return &cli.Command{
		Name:  "server",
		Usage: "export files and block devices under --dev-search-path to RNBD clients",
		Description: "Runs in the foreground (for systemd: tools/systemd/urnbd-server.service).\n" +
			"Nothing is implicit: --listen names the addresses to serve on, and --dev-search-path (or\n" +
			"--memory) what to export; without them the server exits with status 2.\n" +
			"Its commands (session, path, device) ask a running server over its admin socket, root's only.\n" +
			"Clients name devices relative to the search path; %SESSNAME% in it is replaced by the\n" +
			"client's session name. Exports are opened beneath the search path (openat2): '..', symbolic\n" +
			"links that leave it and absolute symbolic links are refused, and only regular files and block\n" +
			"devices are opened. A session's devices close when its last path has been gone for\n" +
			"--session-linger.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "listen", Usage: "`URL` to listen on, required: rdma://IP:PORT (RDMA CM; the kernel's rnbd uses port 1234) or tcp://ADDR:PORT; repeatable. All addresses (0.0.0.0, [::]) only when named"},
			&cli.StringFlag{Name: "dev-search-path", Usage: "`DIR` the clients' device paths are relative to; files and block devices are exported only beneath it, and only when it is given (the kernel's server defaults to /, the whole host: say --dev-search-path / for that)"},
			&cli.IntFlag{Name: "queue-depth", Value: rtrs.DefaultSessQueueDepth, Usage: "chunks per session (sess_queue_depth)"},
			&cli.StringFlag{Name: "max-chunk-size", Value: "128K", Usage: "chunk `SIZE` (max_chunk_size, a power of two); max I/O is 4K less"},
			&cli.StringFlag{Name: "backend-io", Value: "loop", Usage: "`MODE` of file and block device I/O: loop (over RDMA on the server loop's own io_uring, submitted with its wait: no system call of its own; over TCP as sync), sync (on the thread that took the request, one at a time) or uring (io_uring worker threads, requests overlap on the backend)"},
			&cli.StringSliceFlag{Name: "memory", Usage: "export a device held in memory as `NAME=SIZE` (device_path=NAME; zeros at start, lost at exit; for demos and benchmarks); repeatable"},
			&cli.IntFlag{Name: "max-sessions", Value: rtrs.DefaultMaxSessions, Usage: "sessions held at once; one more is refused (ENOSPC)"},
			&cli.IntFlag{Name: "max-conns-per-peer", Value: rtrs.DefaultMaxConnsPerPeer, Usage: "connections one client address holds at once; one more is refused (EBUSY)"},
			&cli.IntFlag{Name: "max-handshakes", Value: rtrs.DefaultMaxHandshakes, Usage: "connection handshakes running at once; one more is refused (EBUSY)"},
			&cli.StringFlag{Name: "max-memory", Value: "50%", Usage: "`SIZE` (or PERCENT of RAM) the sessions' chunk pools may take together (each takes queue-depth × max-chunk-size); a session beyond is refused (ENOMEM)"},
			adminSocketFlag,
			&cli.StringFlag{Name: "metrics-listen", Usage: "serve Prometheus metrics on http://`ADDR`/metrics (e.g. 127.0.0.1:9756): per path the RTRS server families (stats/rdma, wc_completion), per session its paths and devices"},
			&cli.StringFlag{Name: "config", Usage: "`FILE` (TOML) of [[allow]] rules: which clients (clients = address ranges, sessions = name patterns) may open which exports (exports = device_path patterns) with what highest access (ro, rw, migration); without it every client may open every export. Read again on SIGHUP; mappings the new rules refuse are closed. See rnbd.Policy"},
			&cli.StringFlag{Name: "auth-keys", Usage: "key `FILE` (lines NAME SECRET, mode 0600; urnbd key generate writes one): every client must prove one of these keys before its paths serve (challenge-response, the key never on the wire), on TCP and RDMA; a client without one, a kernel client for one, is refused with EACCES. The key's name is the session's identity for the --config rules (keys = [...]). Read again on SIGHUP"},
			&cli.StringFlag{Name: "tls-cert", Usage: "PEM certificate `FILE` (with --tls-key): every TCP connection runs TLS 1.3 (the records in the kernel, kTLS: modprobe tls), plaintext clients are refused; read again on SIGHUP"},
			&cli.StringFlag{Name: "tls-key", Usage: "PEM private key `FILE` of --tls-cert"},
			&cli.StringFlag{Name: "tls-client-ca", Usage: "PEM CA bundle `FILE`: clients must show a certificate it signed (mutual TLS); its name (subject CN, else first SAN) is the session's identity for the --config rules (certs = [...])"},
			&cli.BoolFlag{Name: "auth-optional", Usage: "with --auth-keys, take clients that prove no key too, with no identity: the --config rules decide what they may open"},
			&cli.DurationFlag{Name: "session-linger", Value: rtrs.DefaultLinger, Usage: "how long a session whose last path went keeps its devices open for the client to reconnect; another session that claims its name ends it at once"},
		},
		Action:      runServer,
		Subcommands: serverAdminCommands(),
	}
}

func runServer(c *cli.Context) error {
	chunk, err := parseSize(c.String("max-chunk-size"))
	if err != nil {
		return err
	}
	if len(c.StringSlice("listen")) == 0 {
		return badUsage(c, "no --listen: name the addresses to serve on, e.g. --listen rdma://192.0.2.2:1234 or --listen tcp://192.0.2.2:1234 (tcp://0.0.0.0:1234 for all addresses)")
	}
	search := c.String("dev-search-path")
	if search == "" && len(c.StringSlice("memory")) == 0 {
		return badUsage(c, "nothing to export: pass --dev-search-path DIR, the folder the clients' device paths are relative to (--dev-search-path / exports every file of the host, as the kernel's server does by default), or --memory NAME=SIZE")
	}
	if search != "" {
		if st, err := os.Stat(strings.Split(search, "%SESSNAME%")[0]); err != nil || !st.IsDir() {
			return fmt.Errorf("dev-search-path %s: not a folder: %w", search, unix.ENOENT)
		}
	}
	policy, err := readPolicy(c.String("config"))
	if err != nil {
		return err
	}
	auth, err := readServerAuth(c)
	if err != nil {
		return err
	}
	tlsConf, err := newServerTLS(c)
	if err != nil {
		return err
	}
	memory := map[string]uint64{}
	for _, m := range c.StringSlice("memory") {
		name, size, ok := strings.Cut(m, "=")
		n, err := parseSize(size)
		if !ok || name == "" || err != nil || n == 0 || n%4096 != 0 {
			return fmt.Errorf("memory %q: want NAME=SIZE with a size that is a multiple of 4K, e.g. mem0=1G: %w", m, unix.EINVAL)
		}
		memory[name] = n
	}
	if m := c.String("backend-io"); m != "uring" && m != "sync" && m != "loop" {
		return fmt.Errorf("backend-io %q: want sync, uring or loop: %w", m, unix.EINVAL)
	}
	srv, err := rnbd.NewServer(rnbd.ServerConfig{DevSearchPath: search, MaxIOSize: int(chunk) - rtrs.DefaultMaxHdrSize,
		MemoryExports: memory, Policy: policy, AsyncIO: c.String("backend-io") == "uring", LoopIO: c.String("backend-io") == "loop"})
	if err != nil {
		return err
	}
	defer srv.Close()
	maxMem, err := parseMemoryLimit(c.String("max-memory"))
	if err != nil {
		return err
	}
	tab := rtrs.NewServerTable(rtrs.ServerTableConfig{
		MaxSessions: c.Int("max-sessions"), MaxConnsPerPeer: c.Int("max-conns-per-peer"),
		MaxHandshakes: c.Int("max-handshakes"), MaxMemory: maxMem, Linger: c.Duration("session-linger"),
		OnRelease: srv.ReleaseSession, Auth: auth,
	})
	defer func() {
		tab.Close()
		tab.Wait()
	}()
	sock := c.String("admin-socket")
	if sock == "" {
		sock = serverSocket()
	}
	admin, err := listenAdmin(sock)
	if err != nil {
		return err
	}
	defer admin.Close()
	adm := &serverAdmin{tab: tab, srv: srv}
	go adm.serve(admin)
	if addr := c.String("metrics-listen"); addr != "" {
		if err := serveMetricsOn(addr, "urnbd server", func() ([]byte, error) { return adm.appendPrometheus(nil), nil }); err != nil {
			return err
		}
	}
	rs, err := tcp.NewServer(tcp.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: c.Int("queue-depth"), ChunkSize: int(chunk), Sessions: tab}, Handler: srv, TLS: tlsConf.config()})
	if err != nil {
		return fmt.Errorf("server parameters: %w", err)
	}
	var rdmaSrv *rdmatr.Server
	defer func() {
		if rdmaSrv != nil {
			// Sessions released at once when their paths close, so that
			// their registrations go before the protection domains.
			tab.Close()
			rdmaSrv.Close()
		}
	}()
	exporting := "exporting " + search
	if search == "" {
		exporting = "exporting memory devices only"
	}
	if tlsConf != nil {
		exporting += ", TCP over TLS only"
	}
	switch {
	case auth.Keys.Len() > 0 && auth.Required:
		exporting += fmt.Sprintf(", clients must prove one of %d keys", auth.Keys.Len())
	case auth.Keys.Len() > 0:
		exporting += fmt.Sprintf(", clients may prove one of %d keys", auth.Keys.Len())
	}
	errs := make(chan error, 1)
	// The signals are ours before the server says it listens: a reload
	// (SIGHUP) that follows that line at once must not kill the server.
	sigs, hup := make(chan os.Signal, 1), make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM)
	signal.Notify(hup, unix.SIGHUP)
	for _, u := range c.StringSlice("listen") {
		scheme, addr, ok := strings.Cut(u, "://")
		if !ok {
			return fmt.Errorf("listen %q: want tcp://ADDR:PORT or rdma://ADDR:PORT: %w", u, unix.EINVAL)
		}
		if host, _, err := net.SplitHostPort(addr); err == nil && host == "" {
			return badUsage(c, "listen %q: no address; name it (%s://0.0.0.0:PORT for all)", u, scheme)
		}
		switch scheme {
		case "tcp":
		case "rdma":
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return fmt.Errorf("listen %q: want rdma://IP:PORT: %w", u, unix.EINVAL)
			}
			if rdmaSrv == nil {
				rdmaSrv, err = rdmatr.NewServer(rdmatr.ServerConfig{ServerConfig: rtrs.ServerConfig{QueueDepth: c.Int("queue-depth"), ChunkSize: int(chunk), Sessions: tab, Logf: log.Printf}, Handler: srv.RDMA()})
				if err != nil {
					return fmt.Errorf("server parameters: %w", err)
				}
			}
			got, err := rdmaSrv.Listen(ap)
			if err != nil {
				return fmt.Errorf("listen %s: %w", u, err)
			}
			log.Printf("urnbd server: listening on rdma://%s, %s", got, exporting)
			continue
		default:
			return fmt.Errorf("listen %q: unknown transport %q: %w", u, scheme, unix.EINVAL)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", u, err)
		}
		log.Printf("urnbd server: listening on tcp://%s, %s", ln.Addr(), exporting)
		go func() { errs <- rs.Serve(ln) }()
	}
	for {
		select {
		case <-hup:
			if c.String("config") == "" && c.String("auth-keys") == "" && tlsConf == nil {
				log.Printf("urnbd server: SIGHUP: no --config, --auth-keys or --tls-cert to read again")
			}
			reloadPolicy(c.String("config"), srv)
			reloadAuth(c, tab)
			tlsConf.reload()
		case <-sigs:
			log.Printf("urnbd server: stopping")
			admin.Close()
			tab.Close()
			return rs.Close()
		case err := <-errs:
			tab.Close()
			rs.Close()
			return err
		}
	}
}

// reloadPolicy reads the --config file again (SIGHUP) and makes srv
// apply it; a file that does not read keeps the rules in force.
func reloadPolicy(file string, srv *rnbd.Server) {
	if file == "" {
		return
	}
	p, err := readPolicy(file)
	if err != nil {
		log.Printf("urnbd server: SIGHUP: %v; the rules in force stay", err)
		return
	}
	log.Printf("urnbd server: SIGHUP: %s read again; %d mappings it refuses closed", file, srv.SetPolicy(p))
}

// readServerAuth reads --auth-keys: no file, no authentication.
func readServerAuth(c *cli.Context) (rtrs.ServerAuth, error) {
	file := c.String("auth-keys")
	if file == "" {
		if c.Bool("auth-optional") {
			return rtrs.ServerAuth{}, badUsage(c, "--auth-optional without --auth-keys: name the key file")
		}
		return rtrs.ServerAuth{}, nil
	}
	keys, err := keyfile.Read(file)
	if err != nil {
		return rtrs.ServerAuth{}, fmt.Errorf("auth-keys: %w", err)
	}
	if len(keys) == 0 {
		return rtrs.ServerAuth{}, fmt.Errorf("auth-keys %s: no key in it: %w", file, unix.EINVAL)
	}
	ring, err := rtrs.NewKeyRing(keys)
	if err != nil {
		return rtrs.ServerAuth{}, fmt.Errorf("auth-keys %s: %v: %w", file, err, unix.EINVAL)
	}
	return rtrs.ServerAuth{Keys: ring, Required: !c.Bool("auth-optional")}, nil
}

// reloadAuth reads --auth-keys again on SIGHUP: new connections prove the
// new keys; established paths stay (the policy, read again beside it,
// decides on their sessions).
func reloadAuth(c *cli.Context, tab *rtrs.ServerTable) {
	if c.String("auth-keys") == "" {
		return
	}
	auth, err := readServerAuth(c)
	if err != nil {
		log.Printf("urnbd server: SIGHUP: %v; the keys in force stay", err)
		return
	}
	tab.SetAuth(auth)
	log.Printf("urnbd server: SIGHUP: %s read again: %d keys", c.String("auth-keys"), auth.Keys.Len())
}

// readPolicy reads the --config file; "" is no policy.
func readPolicy(file string) (*rnbd.Policy, error) {
	if file == "" {
		return nil, nil
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	p, err := rnbd.ParsePolicy(text)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", file, errors.Join(err, unix.EINVAL))
	}
	return p, nil
}

// parseMemoryLimit parses --max-memory: a size (parseSize) or a
// percentage of the host's RAM; 0 means no limit.
func parseMemoryLimit(s string) (int64, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		n, err := strconv.ParseFloat(p, 64)
		if err != nil || n <= 0 || n > 100 {
			return 0, fmt.Errorf("max-memory %q: want a SIZE or a percentage in (0,100]: %w", s, unix.EINVAL)
		}
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err != nil {
			return 0, fmt.Errorf("max-memory %q: %w", s, err)
		}
		return int64(float64(si.Totalram) * float64(si.Unit) * n / 100), nil
	}
	n, err := parseSize(s)
	if err != nil {
		return 0, fmt.Errorf("max-memory: %w", err)
	}
	return int64(n), nil
}

var mapFlags = append([]cli.Flag{
	&cli.IntFlag{Name: "queues", Usage: "ublk queues of each device of a new session, each with its RTRS connection per path; 0 = one per CPU"},
	&cli.IntFlag{Name: "depth", Value: ublk.DefaultQueueDepth, Usage: "requests in flight per queue"},
	&cli.BoolFlag{Name: "zero-copy", Usage: "over TCP, where the kernel offers it (ublk auto_buf_reg, Linux 6.16), receive read data straight into the requests' pages instead of through the daemon's buffers; off by default, as it measured slower in the lab"},
	&cli.IntFlag{Name: "session-devices", Value: rnbd.DefaultMaxDevices, Usage: fmt.Sprintf("devices a new session maps at a time, 1..%d: each has its own RTRS connection per queue and path", rnbd.MaxDevicesLimit)},
	&cli.StringFlag{Name: "transport", Value: clientd.DefaultTransport, Usage: "rdma or tcp, for a new session (also transport= in the map string)"},
}, daemonFlags...)

// mapStringFlags are the flag form of the map string's keys.
var mapStringFlags = []cli.Flag{
	&cli.StringFlag{Name: "sessname", Usage: "session `NAME` (sessname=)"},
	&cli.StringSliceFlag{Name: "path", Usage: "path `[ip:SRC@]ip:DST` (path=); repeatable"},
	&cli.StringFlag{Name: "device-path", Usage: "`PATH` of the device on the server, relative to its --dev-search-path (device_path=)"},
	&cli.StringFlag{Name: "access-mode", Usage: "ro, rw or migration (access_mode=)"},
	&cli.IntFlag{Name: "dest-port", Usage: "server `PORT` of the paths (dest_port=)"},
	&cli.StringFlag{Name: "auth-key", Usage: "key `FILE` (one line NAME SECRET, mode 0600) the session proves to the server, which must prove it back (auth_key=); see urnbd key generate"},
}

// mapStringFromFlags turns the flag form into map string tokens, placed
// before those of the command line (so dest_port applies to --path).
func mapStringFromFlags(c *cli.Context) []string {
	var toks []string
	for _, kv := range [][2]string{{"sessname", "sessname"}, {"device-path", "device_path"}, {"access-mode", "access_mode"}, {"auth-key", "auth_key"}} {
		if v := c.String(kv[0]); v != "" {
			toks = append(toks, kv[1]+"="+v)
		}
	}
	if c.IsSet("dest-port") {
		toks = append(toks, "dest_port="+strconv.Itoa(c.Int("dest-port")))
	}
	for _, p := range c.StringSlice("path") {
		toks = append(toks, "path="+p)
	}
	return append(toks, c.Args().Slice()...)
}

func mapCommand() *cli.Command {
	return &cli.Command{
		Name:      "map",
		Usage:     "map a remote device as /dev/ublkbN (kernel map_device syntax)",
		ArgsUsage: "sessname=NAME path=[ip:SRC@]ip:DST [path=...] device_path=PATH [access_mode=ro|rw|migration] [dest_port=PORT] [transport=tcp|rdma] [auth_key=FILE] [tls=on] [tls_ca=FILE] [tls_cert=FILE tls_key=FILE] [tls_server_name=NAME]",
		Description: "The map string is the kernel's (echo ... > /sys/class/rnbd-client/ctl/map_device), plus\n" +
			"transport=rdma|tcp; --sessname, --path, --device-path, --access-mode and --dest-port say the same.\n" +
			"A device of an existing session needs no path= or dest_port= (ignored, as by the kernel); its\n" +
			"transport=, --queues and --session-devices, if given, must be the session's.\n" +
			"Prints the new device, /dev/ublkbN. Errors: EINVAL (bad map string, or not the session's transport,\n" +
			"queues or devices), EEXIST (already mapped), ENOENT (no such device on the server), ENXIO (no such session\n" +
			"and no path=), EPERM (a second rw mapping of the device; use migration), ENOSPC (the session maps\n" +
			"--session-devices devices already; use another sessname).\n" +
			"--metrics-listen and --no-bpf apply when map starts the client daemon.",
		Flags: append(append([]cli.Flag{}, mapStringFlags...), mapFlags...),
		Action: func(c *cli.Context) error {
			spec, err := clientd.ParseMapString(mapStringFromFlags(c))
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
		Usage: "client side, rnbd-tool style: client device map|unmap|list, client path ..., client session set ...",
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
						toks := []string{"sessname=" + strings.NewReplacer(".", "-", "/", "-").Replace(host), "device_path=" + a[0]}
						// Options first, so that dest_port applies to SERVER;
						// extra path= tokens after it.
						var paths []string
						for _, t := range a[3:] {
							if strings.HasPrefix(t, "path=") {
								paths = append(paths, t)
							} else {
								toks = append(toks, t)
							}
						}
						toks = append(append(toks, "path=ip:"+a[2]), paths...)
						spec, err := clientd.ParseMapString(toks)
						if err != nil {
							return err
						}
						return mapDevice(c, spec)
					},
				},
				unmapCommand(),
				resizeCommand(),
				listCommand(),
			},
		}, pathCommand(), sessionCommand(), clientDaemonCommand(), handoverCommand()},
	}
}
