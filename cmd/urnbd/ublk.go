package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/urnbd/urnbd/ublk"
)

// ublkSpec is what a server of a local ublk device needs to serve it again
// after a restart; it is kept in the run directory while the device exists.
type ublkSpec struct {
	ID       uint32 `json:"id"`
	Target   string `json:"target"` // "null" or "loop"
	File     string `json:"file,omitempty"`
	ReadOnly bool   `json:"read_only,omitempty"`
	Size     uint64 `json:"size"`
	PID      int    `json:"pid"`
}

func runDir() string {
	if d := os.Getenv("URNBD_RUN_DIR"); d != "" {
		return d
	}
	return "/run/urnbd"
}

func specPath(id uint32) string {
	return filepath.Join(runDir(), "ublk", strconv.FormatUint(uint64(id), 10)+".json")
}

func (s *ublkSpec) save() error {
	if err := os.MkdirAll(filepath.Dir(specPath(s.ID)), 0o700); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	tmp := specPath(s.ID) + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, specPath(s.ID))
}

func loadSpec(id uint32) (*ublkSpec, error) {
	b, err := os.ReadFile(specPath(id))
	if err != nil {
		return nil, fmt.Errorf("no record of how device %d is served (%w); was it added by urnbd?", id, err)
	}
	var s ublkSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", specPath(id), err)
	}
	return &s, nil
}

var ublkDeviceFlags = []cli.Flag{
	&cli.IntFlag{Name: "id", Value: -1, Usage: "device number `N` (/dev/ublkbN); -1 lets the kernel choose"},
	&cli.IntFlag{Name: "queues", Usage: "hardware queues, one thread each pinned to its CPUs; 0 = one per CPU"},
	&cli.IntFlag{Name: "depth", Value: ublk.DefaultQueueDepth, Usage: "tags (requests in flight) per queue"},
	&cli.StringFlag{Name: "max-io", Value: "512K", Usage: "largest request and per-tag buffer `SIZE`"},
	&cli.BoolFlag{Name: "no-recovery", Usage: "let the device die with its server instead of waiting to be recovered"},
	&cli.BoolFlag{Name: "no-batch-io", Usage: "one ublk command per request even where the driver offers batch I/O (for comparisons)"},
	&cli.BoolFlag{Name: "no-zero-copy", Usage: "copy data through buffers of the daemon even where the driver could hand it the requests' pages (for comparisons)"},
	&cli.BoolFlag{Name: "foreground", Aliases: []string{"f"}, Usage: "serve in this process instead of a background daemon"},
}

func ublkCommand() *cli.Command {
	return &cli.Command{
		Name:  "ublk",
		Usage: "local ublk devices (null, loop): the frontend on its own, for tests and baselines",
		Subcommands: []*cli.Command{
			{
				Name:  "add",
				Usage: "create a local ublk device and serve it",
				Subcommands: []*cli.Command{
					{
						Name:      "null",
						Usage:     "a device that completes every request at once and stores nothing",
						UsageText: "urnbd ublk add null [--size SIZE] [options]",
						Flags: append([]cli.Flag{
							&cli.StringFlag{Name: "size", Value: "1G", Usage: "device `SIZE` (K, M, G, T suffixes)"},
						}, ublkDeviceFlags...),
						Action: func(c *cli.Context) error {
							size, err := parseSize(c.String("size"))
							if err != nil {
								return err
							}
							return addDevice(c, &ublkSpec{Target: "null", Size: size})
						},
					},
					{
						Name:      "loop",
						Usage:     "a device backed by a file or block device (O_DIRECT where possible)",
						UsageText: "urnbd ublk add loop --file PATH [--read-only] [options]",
						Flags: append([]cli.Flag{
							&cli.StringFlag{Name: "file", Usage: "backing file or block device `PATH` (required)"},
							&cli.BoolFlag{Name: "read-only", Usage: "export read-only"},
						}, ublkDeviceFlags...),
						Action: func(c *cli.Context) error {
							if c.String("file") == "" {
								return badUsage(c, "no --file: name the backing file or block device")
							}
							path, err := filepath.Abs(c.String("file"))
							if err != nil {
								return err
							}
							return addDevice(c, &ublkSpec{Target: "loop", File: path, ReadOnly: c.Bool("read-only")})
						},
					},
				},
			},
			{
				Name:      "del",
				Usage:     "stop and delete devices; I/O still queued fails",
				ArgsUsage: "ID... | --all",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "all", Usage: "every ublk device"}},
				Action:    delDevices,
			},
			{
				Name:      "recover",
				Usage:     "serve again a device whose server died (user recovery); I/O in flight is reissued",
				ArgsUsage: "ID",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "foreground", Aliases: []string{"f"}, Usage: "serve in this process instead of a background daemon"},
				},
				Action: recoverDevice,
			},
			ublkHandoverCommand(),
			{
				Name:   "list",
				Usage:  "show the ublk devices and how they are served",
				Flags:  []cli.Flag{&cli.StringFlag{Name: "format", Value: "table", Usage: "table or json"}},
				Action: listDevices,
			},
			{
				Name:      "resize",
				Usage:     "change the size of a ublk device (needs the driver's update_size, Linux 7.x)",
				ArgsUsage: "ID SIZE",
				Action: func(c *cli.Context) error {
					if c.NArg() != 2 {
						return fmt.Errorf("resize: want ID SIZE: %w", unix.EINVAL)
					}
					id, err := parseID(c.Args().Get(0))
					if err != nil {
						return err
					}
					size, err := parseSize(c.Args().Get(1))
					if err != nil {
						return err
					}
					return withControl(func(ctrl *ublk.Control) error {
						if err := ctrl.Resize(id, size); err != nil {
							return err
						}
						fmt.Printf("%s: %d bytes\n", ublk.BlockPath(id), size)
						return nil
					})
				},
			},
			{
				Name:   "features",
				Usage:  "show the features the ublk driver offers and those urnbd uses on it",
				Flags:  formatFlags("text"),
				Action: showFeatures,
			},
		},
	}
}

// withControl runs do with the ublk control device open.
func withControl(do func(*ublk.Control) error) error {
	ctrl, err := ublk.OpenControl()
	if err != nil {
		return err
	}
	defer ctrl.Close()
	return do(ctrl)
}

// ublkFeatures is what `urnbd ublk features` reports.
type ublkFeatures struct {
	Mask    string   `json:"offered_mask"`
	Offered []string `json:"offered"`
	// Used: what urnbd asks for at ADD_DEV on this driver; Unused: what
	// the driver offers and urnbd does not use.
	Used   []string `json:"used"`
	Unused []string `json:"unused"`
}

func showFeatures(c *cli.Context) error {
	format, err := outputFormat(c, "text")
	if err != nil {
		return err
	}
	var f uint64
	if err := withControl(func(ctrl *ublk.Control) (err error) { f, err = ctrl.Features(); return err }); err != nil {
		return err
	}
	used := ublk.Wanted(f)
	r := ublkFeatures{Mask: fmt.Sprintf("%#x", f), Offered: ublk.FeatureNames(f),
		Used: ublk.FeatureNames(used), Unused: ublk.FeatureNames(f &^ used)}
	if format == "json" {
		return writeJSON(os.Stdout, r)
	}
	fmt.Printf("offered: %s %s\nused:    %s\nunused:  %s\n", r.Mask, strings.Join(r.Offered, " "),
		strings.Join(r.Used, " "), strings.Join(r.Unused, " "))
	return nil
}

// parseSize parses "4096", "512K", "1G", "1.5T" (binary units).
func parseSize(s string) (uint64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := uint64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || v*float64(mult) >= 1<<63 {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional K, M, G or T suffix: %w", s, unix.EINVAL)
	}
	return uint64(v * float64(mult)), nil
}

func (s *ublkSpec) target() (ublk.Target, ublk.Options, func(), error) {
	switch s.Target {
	case "null":
		return ublk.NullTarget{}, ublk.Options{ID: -1, Size: s.Size}, func() {}, nil
	case "loop":
		t, err := ublk.OpenLoop(s.File, s.ReadOnly)
		if err != nil {
			return nil, ublk.Options{}, nil, err
		}
		s.Size = t.Size()
		return t, t.Options(), func() { t.Close() }, nil
	}
	return nil, ublk.Options{}, nil, fmt.Errorf("unknown target %q: %w", s.Target, unix.EINVAL)
}

// foreground reports whether this process serves the device itself: asked
// to, or it is the daemon that a parent started.
func foreground(c *cli.Context) bool {
	return c.Bool("foreground") || os.Getenv(notifyEnv) != ""
}

func addDevice(c *cli.Context, spec *ublkSpec) error {
	if !foreground(c) {
		return daemonize()
	}
	target, opts, closeTarget, err := spec.target()
	if err != nil {
		return notifyParent(err)
	}
	defer closeTarget()
	maxIO, err := parseSize(c.String("max-io"))
	if err != nil {
		return notifyParent(err)
	}
	opts.ID = c.Int("id")
	opts.Queues = c.Int("queues")
	opts.Depth = c.Int("depth")
	opts.MaxIOBytes = int(maxIO)
	opts.NoRecovery = c.Bool("no-recovery")
	opts.NoBatchIO = c.Bool("no-batch-io")
	opts.NoZeroCopy = c.Bool("no-zero-copy")
	ctrl, err := ublk.OpenControl()
	if err != nil {
		return notifyParent(err)
	}
	defer ctrl.Close()
	dev, err := ublk.Create(ctrl, opts, target)
	if err != nil {
		return notifyParent(err)
	}
	spec.ID = dev.ID()
	return serve(ctrl, dev, spec)
}

func recoverDevice(c *cli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("recover: want one device ID: %w", unix.EINVAL)
	}
	id, err := parseID(c.Args().First())
	if err != nil {
		return err
	}
	if !foreground(c) {
		return daemonize()
	}
	spec, err := loadSpec(id)
	if err != nil {
		return notifyParent(err)
	}
	target, _, closeTarget, err := spec.target()
	if err != nil {
		return notifyParent(err)
	}
	defer closeTarget()
	ctrl, err := ublk.OpenControl()
	if err != nil {
		return notifyParent(err)
	}
	defer ctrl.Close()
	dev, err := ublk.Recover(ctrl, id, target, nil)
	if err != nil {
		return notifyParent(err)
	}
	return serve(ctrl, dev, spec)
}

// serve records the device, tells a waiting parent, and serves until the
// device is deleted, a signal asks to delete it (SIGINT, SIGTERM), or one
// asks to hand it over (handoverSignal).
func serve(ctrl *ublk.Control, dev *ublk.Device, spec *ublkSpec) error {
	// Before the record names this process: a handover's signal must not
	// kill it.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, handoverSignal)
	spec.PID = os.Getpid()
	if err := spec.save(); err != nil {
		dev.Delete()
		return notifyParent(fmt.Errorf("record device: %w", err))
	}
	notifyParent(nil, ublk.BlockPath(dev.ID()))
wait:
	for {
		select {
		case sig := <-sigs:
			if sig != handoverSignal {
				if err := dev.Delete(); err != nil {
					return err
				}
				break wait
			}
			if handOver(dev) {
				return cli.Exit(fmt.Sprintf("urnbd ublk: handed %s over; the next server recovers it", ublk.BlockPath(dev.ID())), handoverExit)
			}
		case <-dev.Done():
			break wait
		}
	}
	err := dev.Wait()
	if info, ierr := ctrl.DevInfo(dev.ID()); errors.Is(ierr, unix.ENODEV) || (ierr == nil && info.State == ublk.StateDead) {
		os.Remove(specPath(dev.ID()))
	}
	return err
}

func parseID(s string) (uint32, error) {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "/dev/"), "ublkb")
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("device %q: want a number or /dev/ublkbN: %w", s, unix.EINVAL)
	}
	return uint32(v), nil
}

func existingIDs() ([]uint32, error) {
	names, err := filepath.Glob("/dev/ublkc*")
	if err != nil {
		return nil, err
	}
	var ids []uint32
	for _, n := range names {
		if v, err := strconv.ParseUint(strings.TrimPrefix(n, "/dev/ublkc"), 10, 32); err == nil {
			ids = append(ids, uint32(v))
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids, nil
}

func delDevices(c *cli.Context) error {
	ctrl, err := ublk.OpenControl()
	if err != nil {
		return err
	}
	defer ctrl.Close()
	var ids []uint32
	if c.Bool("all") {
		if ids, err = existingIDs(); err != nil {
			return err
		}
	} else {
		if c.NArg() == 0 {
			return fmt.Errorf("del: name the devices to delete, or --all: %w", unix.EINVAL)
		}
		for _, a := range c.Args().Slice() {
			id, err := parseID(a)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
	}
	var first error
	for _, id := range ids {
		err := ctrl.StopDev(id)
		if err == nil {
			err = ctrl.DelDev(id)
		}
		if errors.Is(err, unix.ENODEV) {
			err = fmt.Errorf("device %d does not exist: %w", id, unix.ENODEV)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "urnbd: %v\n", err)
			if first == nil {
				first = err
			}
			continue
		}
		os.Remove(specPath(id))
		fmt.Printf("deleted %s\n", ublk.BlockPath(id))
	}
	return first
}

type ublkListEntry struct {
	ID         uint32 `json:"id"`
	Device     string `json:"device"`
	State      string `json:"state"`
	Queues     int    `json:"queues"`
	Depth      int    `json:"depth"`
	MaxIOBytes uint32 `json:"max_io_bytes"`
	SizeBytes  uint64 `json:"size_bytes"`
	PID        int32  `json:"pid"`
	Flags      string `json:"flags"`
	Target     string `json:"target,omitempty"`
	Backing    string `json:"backing,omitempty"`
}

func listDevices(c *cli.Context) error {
	ctrl, err := ublk.OpenControl()
	if err != nil {
		return err
	}
	defer ctrl.Close()
	ids, err := existingIDs()
	if err != nil {
		return err
	}
	entries := []ublkListEntry{}
	for _, id := range ids {
		info, err := ctrl.DevInfo(id)
		if err != nil {
			continue // deleted meanwhile
		}
		e := ublkListEntry{
			ID: id, Device: ublk.BlockPath(id), State: ublk.StateName(info.State),
			Queues: int(info.NrHWQueues), Depth: int(info.QueueDepth), MaxIOBytes: info.MaxIOBufBytes,
			PID: info.ServerPID, Flags: strings.Join(ublk.FeatureNames(info.Flags), ","),
		}
		if p, err := ctrl.Params(id); err == nil {
			e.SizeBytes = p.Basic.DevSectors << 9
		}
		if s, err := loadSpec(id); err == nil {
			e.Target, e.Backing = s.Target, s.File
		}
		entries = append(entries, e)
	}
	switch c.String("format") {
	case "json":
		return writeJSON(os.Stdout, entries)
	case "table":
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tDEVICE\tSTATE\tQUEUES\tDEPTH\tMAX_IO\tSIZE\tPID\tTARGET\tBACKING")
		for _, e := range entries {
			fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", e.ID, e.Device, e.State, e.Queues,
				e.Depth, e.MaxIOBytes, e.SizeBytes, e.PID, dash(e.Target), dash(e.Backing))
		}
		return w.Flush()
	}
	return fmt.Errorf("format %q: want table or json: %w", c.String("format"), unix.EINVAL)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
