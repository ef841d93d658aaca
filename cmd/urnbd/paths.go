package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urnbd/urnbd/internal/clientd"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
)

// Run-time management of the client daemon's sessions and paths: what the
// kernel offers as sysfs files under /sys/class/rtrs-client/SESS
// (add_path, paths/P/{remove_path,disconnect,reconnect}, mpath_policy,
// max_reconnect_attempts).

var pathOps = map[string]rnbd.PathOp{
	"remove":     rnbd.PathRemove,
	"disconnect": rnbd.PathDisconnect,
	"reconnect":  rnbd.PathReconnect,
}

func pathCommand() *cli.Command {
	var sub []*cli.Command
	sub = append(sub, &cli.Command{
		Name:      "add",
		Usage:     "add a path to a session (add_path)",
		ArgsUsage: "SESSNAME [ip:SRC@]ip:DST",
		Flags:     []cli.Flag{&cli.IntFlag{Name: "dest-port", Value: 1234, Usage: "server `PORT`"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 {
				return fmt.Errorf("path add: want SESSNAME and [ip:SRC@]ip:DST: %w", unix.EINVAL)
			}
			mp, err := clientd.ParsePathArg(c.Args().Get(1), c.Int("dest-port"))
			if err != nil {
				return err
			}
			rep, err := askDaemon(&clientd.Request{Op: "path", Session: c.Args().First(), PathOp: "add",
				Path: mp.Src + "@" + net.JoinHostPort(mp.Dst, strconv.Itoa(mp.Port))}, noSession(c.Args().First()))
			if err != nil {
				return fmt.Errorf("path add: %w", err)
			}
			fmt.Println(rep.Device)
			return nil
		},
	})
	for _, op := range []struct{ name, usage string }{
		{"remove", "remove a path of a session (remove_path); its in-flight I/O fails over to the other paths"},
		{"disconnect", "disconnect a path (disconnect); its in-flight I/O fails over, the path stays until reconnect"},
		{"reconnect", "reconnect a path (reconnect): close its connections if any and connect anew"},
	} {
		name := op.name
		sub = append(sub, &cli.Command{
			Name:      name,
			Usage:     op.usage,
			ArgsUsage: "SESSNAME PATH (the path's index or address, as urnbd list and urnbd stats show them)",
			Action: func(c *cli.Context) error {
				if c.NArg() != 2 {
					return fmt.Errorf("path %s: want SESSNAME and PATH: %w", name, unix.EINVAL)
				}
				if _, err := askDaemon(&clientd.Request{Op: "path", Session: c.Args().First(), PathOp: name, Path: c.Args().Get(1)}, noSession(c.Args().First())); err != nil {
					return fmt.Errorf("path %s: %w", name, err)
				}
				return nil
			},
		})
	}
	sub = append(sub, &cli.Command{
		Name:  "list",
		Usage: "list the paths of every session: index, address, state, heartbeat RTT, in-flight requests, counts",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			r, err := fetchStats(false)
			if err != nil {
				return fmt.Errorf("path list: %w", err)
			}
			if c.Bool("json") {
				return writeJSON(os.Stdout, r.Sessions)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "SESSNAME\tINDEX\tPATH\tSTATE\tCUR_LATENCY\tINFLIGHT\tREADS\tWRITES\tFAILOVERS\tRECONNECTS\tLAST_ERROR")
			for _, s := range r.Sessions {
				for _, p := range s.Paths {
					st := p.Stats
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%d ns\t%d\t%d\t%d\t%d\t%d/%d\t%s\n", s.Name, p.Index, p.Addr, p.State, p.CurLatencyNs,
						st.Inflight, st.Read.Count, st.Write.Count, st.Failovers, st.ReconnectsOK, st.ReconnectsFailed, p.LastError)
				}
			}
			return w.Flush()
		},
	})
	return &cli.Command{Name: "path", Usage: "manage the paths of a session: list, add, remove, disconnect, reconnect", Subcommands: sub}
}

func sessionCommand() *cli.Command {
	set := func(key, usage, args string) *cli.Command {
		return &cli.Command{
			Name:      key,
			Usage:     usage,
			ArgsUsage: "SESSNAME " + args,
			Action: func(c *cli.Context) error {
				if c.NArg() != 2 {
					return fmt.Errorf("session set %s: want SESSNAME and %s: %w", key, args, unix.EINVAL)
				}
				if _, err := askDaemon(&clientd.Request{Op: "session-set", Session: c.Args().First(), Key: key, Value: c.Args().Get(1)}, noSession(c.Args().First())); err != nil {
					return fmt.Errorf("session set %s: %w", key, err)
				}
				return nil
			},
		}
	}
	return &cli.Command{
		Name:  "session",
		Usage: "change a session's settings",
		Subcommands: []*cli.Command{{
			Name:  "set",
			Usage: "set mp-policy or max-reconnect-attempts",
			Subcommands: []*cli.Command{
				set("mp-policy", "multipath policy (mpath_policy)", "round-robin|min-inflight|min-latency"),
				set("max-reconnect-attempts", "reconnect attempts of a failed path (max_reconnect_attempts)", "N (-1: forever)"),
			},
		}},
	}
}

// askDaemon sends a request to a running daemon; with none running, the
// error wraps ENOENT and says what is missing (none: nothing is mapped).
func askDaemon(req *clientd.Request, missing string) (*clientd.Reply, error) {
	rep, err := ask(req, records().Any()) // a daemon that died left devices to recover: start one
	if errors.Is(err, clientd.ErrNoDaemon) {
		return nil, fmt.Errorf("%s (no client daemon on %s): %w", missing, clientSocket(), unix.ENOENT)
	}
	return rep, err
}

func noSession(name string) string { return "session " + name + ": no such session" }

// findPath resolves a path named by index or address (with or without
// the "ip:" prefixes that the kernel's path names carry).
func findPath(s *clientd.Session, name string) (int, error) {
	paths := s.Client.Paths()
	if i, err := strconv.Atoi(name); err == nil {
		for _, p := range paths {
			if p.Index == i {
				return i, nil
			}
		}
	}
	bare := strings.ReplaceAll(name, "ip:", "")
	for _, p := range paths {
		if p.Addr == bare || p.Addr == name {
			return p.Index, nil
		}
	}
	return 0, fmt.Errorf("session %q has no path %q: %w", s.Spec.SessName, name, unix.ENOENT)
}

// pathRequest carries out `urnbd path ...`; add returns the new index.
func (d *clientDaemon) pathRequest(req *clientd.Request) (string, error) {
	s, err := d.reg.Session(req.Session)
	if err != nil {
		return "", err
	}
	if req.PathOp == "add" {
		src, dst, _ := strings.Cut(req.Path, "@")
		idx, err := s.Client.AddPath(src, dst)
		if err != nil {
			return "", err
		}
		return strconv.Itoa(idx), nil
	}
	op, ok := pathOps[req.PathOp]
	if !ok {
		return "", fmt.Errorf("path operation %q: want add, remove, disconnect or reconnect: %w", req.PathOp, unix.EINVAL)
	}
	idx, err := findPath(s, req.Path)
	if err != nil {
		return "", err
	}
	return "", s.Client.PathOp(idx, op)
}

// sessionSet carries out `urnbd session set KEY SESSNAME VALUE`.
func (d *clientDaemon) sessionSet(req *clientd.Request) error {
	s, err := d.reg.Session(req.Session)
	if err != nil {
		return err
	}
	switch req.Key {
	case "mp-policy":
		p, err := rtrs.ParseMPPolicy(req.Value)
		if err != nil {
			return err
		}
		s.Client.SetPolicy(p)
		return nil
	case "max-reconnect-attempts":
		n, err := strconv.Atoi(req.Value)
		if err != nil {
			return fmt.Errorf("max-reconnect-attempts %q: want a number, -1 for forever: %w", req.Value, unix.EINVAL)
		}
		return s.Client.SetMaxReconnectAttempts(n)
	}
	return fmt.Errorf("session setting %q: want mp-policy or max-reconnect-attempts: %w", req.Key, unix.EINVAL)
}
